"""Builds the ``runtime_report.json`` document from plain data (no I/O here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memscope._version import __version__
from memscope.events.schema import SCHEMA_VERSION, MemoryEvent, phase_rank

REPORT_TYPE_RUNTIME = "runtime"
STATUSES = ("running", "complete", "incomplete", "crashed", "oom")


@dataclass
class RuntimeReportInputs:
    """Everything a runtime report is made of, already computed."""

    metadata: dict[str, Any]
    status: str
    #: The analyzers' sections: ``peak``, ``phase_summary`` (phase -> maxima),
    #: ``top_events``, ``module_summary``, ``steps``, ``comparisons``.
    sections: Mapping[str, Any]
    events: list[MemoryEvent]
    trace_info: dict[str, Any]
    status_reason: str = ""
    errors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    #: The training settings memory depends on (the adapter's; ``None`` when it has none).
    training: dict[str, Any] | None = None


def document_identity(report_type: str) -> dict[str, Any]:
    """The keys every file MemScope writes starts with: schema version, type, tool."""
    return {
        "schema_version": SCHEMA_VERSION,
        "report_type": report_type,
        "tool": {"name": "memscope", "version": __version__},
    }


def build_runtime_report(inputs: RuntimeReportInputs) -> dict[str, Any]:
    """The report as a JSON-ready dict; keys of the original format keep their names."""
    if inputs.status not in STATUSES:
        raise ValueError(f"report status must be one of {STATUSES}, not {inputs.status!r}")
    meta = inputs.metadata
    sections = inputs.sections
    phases = [
        {"phase": name, **values}
        for name, values in sorted(
            sections["phase_summary"].items(), key=lambda kv: (phase_rank(kv[0]), kv[0])
        )
    ]
    return {
        **document_identity(REPORT_TYPE_RUNTIME),
        "rank": meta.get("rank"),
        "world_size": meta.get("world_size"),
        "status": inputs.status,
        "complete": inputs.status == "complete",
        "status_reason": inputs.status_reason,
        "metadata": meta,
        "training": inputs.training,
        "oom": sections.get("oom"),
        "peak": sections["peak"],
        "allocator_timeline": sections.get("allocator_timeline"),
        "comparisons": sections["comparisons"],
        "top_events": sections["top_events"],
        "phase_summary": phases,
        "module_summary": sections["module_summary"],
        "steps": sections["steps"],
        "step_transitions": sections.get("step_transitions"),
        "step_compositions": sections.get("step_compositions"),
        "trace": inputs.trace_info,
        "errors": inputs.errors,
        "warnings": inputs.warnings,
        "artifacts": inputs.artifacts,
        "runtime_trace": [e.to_dict() for e in inputs.events],
    }
