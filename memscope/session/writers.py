"""The files a session writes into its rank folder: the streamed ``trace.jsonl``, the runtime
report (JSON and Markdown, with the OOM report beside them) and the note of a rank whose
tracing never started. Every write is atomic; a failed one is recorded once and never raised
(the next write retries)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from memscope._version import __version__
from memscope.analysis.job import rank_summary
from memscope.analysis.static_comparison import StaticEstimate
from memscope.capture.parallel import ParallelInfo
from memscope.capture.safety import FailureLog
from memscope.config import RuntimeConfig
from memscope.events import schema as s
from memscope.events.file_names import (
    OOM_REPORT_MD_NAME,
    OOM_REPORT_NAME,
    REPORT_MD_NAME,
    REPORT_NAME,
    START_FAILURE_NAME,
    TRACE_NAME,
)
from memscope.events.trace_sink import BufferedTraceWriter, JsonlTraceSink
from memscope.io.atomic import atomic_write_json, atomic_write_text
from memscope.reporters.markdown import render_runtime_markdown
from memscope.session.run_identity import RunIdentity, touch_lock
from memscope.session.teardown import Teardown

logger = logging.getLogger("memscope")


def trace_header(
    *,
    parallel: ParallelInfo,
    run: RunIdentity,
    backend: str,
    config: RuntimeConfig,
    static: StaticEstimate,
    training: dict[str, Any] | None,
) -> dict[str, Any]:
    """The first line of ``trace.jsonl``: what ``memscope analyze`` needs to rebuild the
    report from the trace alone."""
    return {
        "rank": parallel.rank,
        "world_size": parallel.world_size,
        "tool_version": __version__,
        "run_id": run.run_id,
        "run_id_source": run.source,
        "start_time": run.start_time,
        "hostname": socket.gethostname(),
        "training": training,
        "parallel": parallel.to_dict(),
        "backend": backend,
        "config": config.to_report_dict(),
        "static_estimate": static.to_dict(),
    }


def open_trace(
    directory: str,
    header: Mapping[str, Any],
    max_mib: int,
    teardown: Teardown,
    failures: FailureLog,
) -> tuple[BufferedTraceWriter | None, str]:
    """The streamed ``trace.jsonl`` (closed at teardown), or ``None`` and the warning to give
    when it can't be opened (e.g. a symlink planted at its name): recorded once, the report
    is still written."""
    try:
        sink = JsonlTraceSink(
            os.path.join(directory, TRACE_NAME), dict(header), max_bytes=max_mib * 2**20
        )
    except OSError as exc:
        failures.record("trace_sink", exc, disable=False)
        return None, f"trace.jsonl not written: {exc}"
    writer = BufferedTraceWriter(sink)
    teardown.push("trace_sink", writer.close)
    return writer, ""


def flush_trace(writer: BufferedTraceWriter | None, failures: FailureLog) -> None:
    """Write buffered events to ``trace.jsonl``; a failure (full disk...) is recorded and
    retried at the next flush, and never stops the report from being written."""
    if writer is None:
        return
    try:
        writer.flush()
    except Exception as exc:
        failures.record("trace_sink", exc, disable=False)


class ReportFiles:
    """The runtime report files of one rank folder and the artifacts the report lists."""

    def __init__(self, directory: str, failures: FailureLog) -> None:
        self.directory = directory
        self.failures = failures
        #: Artifact name -> path relative to :attr:`directory` (kept when the file exists).
        self.artifacts: dict[str, str] = {}
        self.path: str | None = None  # the last report written
        self.summary: dict[str, Any] | None = None  # of the last report written

    def write(self, build: Callable[[], dict[str, Any]]) -> str | None:
        """Build the report and write ``runtime_report.json`` and ``.md`` (and the OOM report
        when it has one); returns the JSON path, or ``None`` after a recorded failure."""
        try:
            report = build()
            self.summary = rank_summary(report)
            path = os.path.join(self.directory, REPORT_NAME)
            atomic_write_json(path, report)
            markdown = render_runtime_markdown(report)
            atomic_write_text(os.path.join(self.directory, REPORT_MD_NAME), markdown)
            if report.get("oom"):
                self._write_oom_report(report)
            self.path = path
            touch_lock(self.directory)
            return path
        except Exception as exc:  # retried at the next interval and at finalize
            self.failures.record("write_report", exc, disable=False)
            return None

    def _write_oom_report(self, report: dict[str, Any]) -> None:
        """``oom_report.json`` and ``.md`` beside the runtime report (see analysis/oom.py)."""
        from memscope.reporters.oom_report import oom_document, render_oom_markdown

        doc = oom_document(report)
        atomic_write_json(os.path.join(self.directory, OOM_REPORT_NAME), doc)
        atomic_write_text(
            os.path.join(self.directory, OOM_REPORT_MD_NAME), render_oom_markdown(doc)
        )
        self.artifacts["oom_report"] = OOM_REPORT_NAME

    def present(self, more: Mapping[str, str]) -> dict[str, str]:
        """The artifacts (this folder's and ``more``, relative paths) whose file exists."""
        out = dict(self.artifacts)
        for name, rel in more.items():
            out.setdefault(name, rel)
        return {
            name: rel
            for name, rel in out.items()
            if os.path.exists(os.path.join(self.directory, rel))
        }

    def leave_start_note(self, parallel: ParallelInfo, run: RunIdentity, reason: str) -> None:
        """A rank that never started tracing leaves a small note saying why in its folder
        (``start_failure.json``), so the job view can tell it from one that never ran;
        where the folder itself can't be written the logged line is all there is."""
        try:
            atomic_write_json(
                os.path.join(self.directory, START_FAILURE_NAME),
                {
                    "schema_version": s.SCHEMA_VERSION,
                    "report_type": "start_failure",
                    "tool": {"name": "memscope", "version": __version__},
                    "rank": parallel.rank,
                    "world_size": parallel.world_size,
                    "run_id": run.run_id,
                    "reason": reason,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        except Exception as exc:  # e.g. the output folder is not writable: logged once already
            logger.debug("memscope: no start note: %s", exc)
