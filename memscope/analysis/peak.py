"""Where and when the runtime peak happened."""

from __future__ import annotations

from typing import Any

from memscope.analysis.aggregates import RuntimeAggregates
from memscope.events.schema import CATEGORIES


def locate_peak(
    aggregates: RuntimeAggregates,
    exact_context: tuple[Any, ...] | None = None,
    exact_categories: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The peak record of a runtime report.

    ``memory_bytes`` is the backend's true high-water mark. Without an exact context the
    peak is attributed to the first event whose interval reached it (the peak happened
    between the previous sample and that event's end); with one (the storage backend sees
    every allocation) the step, phase, module and microbatch are those at the allocation
    that set the peak.
    """
    e = aggregates.peak_event
    if e is None:
        return {
            "phase": None,
            "module": None,
            "step": None,
            "memory_bytes": 0,
            "reserved_bytes": 0,
            "attribution": "none",
        }
    reserved = aggregates.peak_reserved_event
    out: dict[str, Any] = {
        "phase": e.phase,
        "module": e.module,
        "step": e.step,
        "microbatch": e.microbatch,
        "event_type": e.event_type,
        "memory_bytes": e.max_mem_allocated,
        "reserved_bytes": reserved.max_mem_reserved if reserved is not None else 0,
        "allocated_after_bytes": e.mem_allocated_after,
        "attribution": "interval",
    }
    if exact_context:
        step, phase, module, microbatch = (tuple(exact_context) + (None,) * 4)[:4]
        out.update(step=step, phase=phase, module=module or "", microbatch=microbatch)
        out["attribution"] = "exact"
    if exact_categories is not None:
        out["categories"] = dict(zip(CATEGORIES, exact_categories, strict=True))
    return out
