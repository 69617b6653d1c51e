"""Builds the ``runtime_report.json`` document from plain data (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memscope._version import __version__
from memscope.events.schema import SCHEMA_VERSION, MemoryEvent
from memscope.events.sections import INDEX_KEY, SectionSet

REPORT_TYPE_RUNTIME = "runtime"
STATUSES = ("running", "complete", "incomplete", "crashed", "oom")


@dataclass
class RuntimeReportInputs:
    """Everything a runtime report is made of, already computed."""

    metadata: dict[str, Any]
    status: str
    #: The analyzers' sections, each with its spec (:func:`memscope.analysis.base.build_sections`).
    sections: SectionSet
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


#: The report's own keys, around the sections (a section may take none of these names).
DOCUMENT_KEYS = frozenset(
    {
        *document_identity(REPORT_TYPE_RUNTIME), "rank", "world_size", "status", "complete",
        "status_reason", "metadata", "training", "trace", "errors", "warnings", "artifacts",
        INDEX_KEY, "runtime_trace",
    }
)  # fmt: skip


def build_runtime_report(inputs: RuntimeReportInputs) -> dict[str, Any]:
    """The report as a JSON-ready dict: every section under its own name (in the order pages
    show them) and the ``sections`` index that lets a reporter iterate them from the JSON."""
    if inputs.status not in STATUSES:
        raise ValueError(f"report status must be one of {STATUSES}, not {inputs.status!r}")
    taken = DOCUMENT_KEYS.intersection(inputs.sections)
    if taken:
        raise ValueError(f"sections may not be named as report keys: {sorted(taken)}")
    meta = inputs.metadata
    shown = inputs.sections.shown()
    return {
        **document_identity(REPORT_TYPE_RUNTIME),
        "rank": meta.get("rank"),
        "world_size": meta.get("world_size"),
        "status": inputs.status,
        "complete": inputs.status == "complete",
        "status_reason": inputs.status_reason,
        "metadata": meta,
        "training": inputs.training,
        **{section.spec.name: section.value for section in shown},
        "trace": inputs.trace_info,
        "errors": inputs.errors,
        "warnings": inputs.warnings,
        "artifacts": inputs.artifacts,
        INDEX_KEY: inputs.sections.index(),
        "runtime_trace": [e.to_dict() for e in inputs.events],
    }
