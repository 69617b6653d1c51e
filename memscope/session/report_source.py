"""The runtime report of a live session: its recorded content (sections, events, trace facts)
from the session's :class:`~memscope.session.recording.Recording`, with the lifecycle's status,
errors, warnings and artifacts. What the session writes at every report interval, at a
failure and at the end (:class:`~memscope.session.writers.ReportFiles`)."""

from __future__ import annotations

from typing import Any, Protocol

from memscope.capture.parallel import ParallelInfo
from memscope.capture.safety import FailureLog, failure_row
from memscope.config import RuntimeConfig
from memscope.events.file_names import TRACE_NAME
from memscope.report.builder import RunFacts
from memscope.session.adapter_facts import AdapterFacts
from memscope.session.recorders import Recorders
from memscope.session.recording import Recording
from memscope.session.report_assembly import runtime_metadata, trace_writer_facts
from memscope.session.run_identity import RunIdentity
from memscope.session.state import ReportStatus
from memscope.session.writers import ReportFiles


class ReportedSession(Protocol):
    """What a report reads of its session (:class:`~memscope.session.session.TracingSession`)."""

    recording: Recording | None
    parallel: ParallelInfo
    config: RuntimeConfig
    backend_name: str
    hook_counts: dict[str, int]
    adapter: AdapterFacts
    run: RunIdentity
    failures: FailureLog
    recorders: Recorders
    files: ReportFiles
    status: ReportStatus
    status_reason: str
    warnings: list[str]

    @property
    def report_dir(self) -> str: ...


def session_metadata(session: ReportedSession) -> dict[str, Any]:
    """Typed facts about this rank and run."""
    rec = session.recording
    return runtime_metadata(
        parallel=session.parallel,
        config=session.config,
        backend_name=session.backend_name,
        backend=rec.backend if rec is not None else None,
        tracer=rec.tracer if rec is not None else None,
        hook_counts=session.hook_counts,
        framework=session.adapter.metadata(),
        run=session.run,
    )


def build_session_report(session: ReportedSession) -> dict[str, Any]:
    """The current runtime report of ``session`` as a dict (what it writes)."""
    rec = session.recording
    assert rec is not None and rec.tracer is not None
    errors = session.failures.to_list()
    if rec.backend.error:
        errors.append(failure_row(f"{rec.backend.name}_backend", rec.backend.error))
    written = {"trace_jsonl": TRACE_NAME} if rec.trace is not None else {}
    written.update(session.recorders.artifacts(session.report_dir))
    artifacts = session.files.present(written)
    return rec.report_builder.build(
        RunFacts(
            metadata=session_metadata(session),
            training=session.adapter.training(),
            status=session.status.value,
            status_reason=session.status_reason,
            events_recorded=rec.tracer.events_emitted,
            jsonl=artifacts.get("trace_jsonl"),
            trace=trace_writer_facts(rec.trace),
            errors=errors,
            warnings=list(session.warnings),
            artifacts=artifacts,
        )
    )
