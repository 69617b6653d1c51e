"""The runtime report of a live session: its recorded content (sections, events, trace facts)
from the session's :class:`~memscope.session.recording.Recording`, with the lifecycle's status,
errors, warnings and artifacts. What the session writes at every report interval, at a
failure and at the end (:class:`~memscope.session.writers.ReportFiles`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memscope.capture.safety import failure_row
from memscope.io.rank_folders import TRACE_NAME
from memscope.report.builder import RunFacts
from memscope.session.report_assembly import runtime_metadata, trace_writer_facts

if TYPE_CHECKING:
    from memscope.session.session import TracingSession


def session_metadata(session: TracingSession) -> dict[str, Any]:
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


def build_session_report(session: TracingSession) -> dict[str, Any]:
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
