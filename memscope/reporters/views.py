"""What a report's backend could record, and for each view it could not, the sentence both
the Markdown and the HTML page show instead (which flag or backend gives it).

Views: the per-step GPU signals (device-used memory from ``cudaMemGetInfo``, memory outside
PyTorch, the caching allocator's cached-but-free bytes, its allocation retries and OOMs), the
reserved figure (meaningful only behind a caching allocator), and what was live at the peak by
category.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Backends that read a caching allocator (reserved memory differs from allocated).
CACHING_ALLOCATOR_BACKENDS = frozenset({"cuda"})

#: The per-step GPU signals: (step-row key, column title). ``alloc_retries`` and ``ooms``
#: count since the step listed before (the ``*_total`` keys: since the process started).
GPU_STEP_COLUMNS = (
    ("device_used_end", "device used"),
    ("outside_pytorch_end", "outside PyTorch"),
    ("cached_free_end", "reserved − allocated"),
    ("alloc_retries", "alloc retries"),
    ("ooms", "OOMs"),
)


def has_caching_allocator(metadata: Mapping[str, Any]) -> bool:
    """Whether the report's reserved figures come from a caching allocator."""
    return metadata.get("backend") in CACHING_ALLOCATOR_BACKENDS


def reserved_note(metadata: Mapping[str, Any]) -> str:
    """Why a report shows no reserved figure ('' when it has one worth showing)."""
    if has_caching_allocator(metadata):
        return ""
    backend = metadata.get("backend") or "?"
    where = (metadata.get("backend_info") or {}).get("device_type") or "cpu"
    if where == "cpu":
        return f"no caching allocator on CPU: the {backend} backend's reserved equals allocated"
    return (
        f"the {backend} backend counts tensor storages, not the caching allocator: reserved "
        "equals allocated (--memscope-backend cuda reads the allocator)"
    )


def gpu_signals_note(metadata: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> str:
    """'' when the steps carry GPU signals; else why not and how to get them."""
    if any("device_used_end" in row for row in steps):
        return ""
    backend = metadata.get("backend") or "?"
    if not steps:
        return "No step ended while tracing, so no step-end device reading was taken."
    if backend in CACHING_ALLOCATOR_BACKENDS:
        return (
            "Not in this report (written by a MemScope that did not record step-end device "
            "readings): trace again on a GPU with --memscope-backend cuda."
        )
    return (
        f"Not available with the {backend} backend, which reads no device: device-used "
        "memory, memory outside PyTorch, reserved − allocated, allocation retries and OOMs "
        "come from the CUDA caching allocator; trace on a GPU with --memscope-backend cuda "
        "(the default there)."
    )


def composition_note(metadata: Mapping[str, Any]) -> str:
    """Why what was live at the peak is not broken down, and how to get it."""
    backend = metadata.get("backend") or "?"
    return (
        f"What was live at the peak is not recorded by the {backend} backend: "
        "--memscope-backend storage (exact, slower) records it by category, module, microbatch "
        "and chunk; with the cuda backend, --memscope-enable-memory-snapshot over the peak step "
        "(--memscope-snapshot-start-step) gives it from the replayed allocator history."
    )


def is_peak_row(row: Mapping[str, Any], peak: Mapping[str, Any]) -> bool:
    """Whether a top-events row is where the run's peak was attributed: same module and phase,
    and, where the peak is attributed to the reading that saw it (``interval``), that
    reading's event type (an exact context names the module, not the event)."""
    if not peak.get("module") or row.get("module") != peak.get("module"):
        return False
    if row.get("phase") != peak.get("phase"):
        return False
    return peak.get("attribution") != "interval" or peak.get("event_type") == row.get("event_type")


def is_lower_bound(phase_row: Mapping[str, Any]) -> bool:
    """Whether a phases-table row's maximum is its highest reading (a lower bound of what the
    phase reached), not an exact high-water mark or running peak."""
    return phase_row.get("max_mem_allocated_source") == "readings"


def module_kind(row: Mapping[str, Any]) -> str:
    """``leaf`` or ``container`` (inclusive of its children) for a module forward row."""
    leaf = row.get("leaf")
    return "" if leaf is None else "leaf" if leaf else "container"
