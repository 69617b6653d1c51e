"""Where and when the runtime peak happened (the ``peak`` section)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memscope.events.schema import CATEGORIES, CompositionItem, MemoryEvent, PeakContext


class PeakAnalyzer:
    """The highest high-water mark seen, and where it was set.

    ``memory_bytes`` is the backend's true high-water mark. Without an exact context the
    peak is attributed to the first event whose interval reached it (the peak happened
    between the previous sample and that event's end); when the backend saw every allocation
    (step-phase events carry ``peak_context``), the step, phase, module and microbatch are
    those at the allocation that set the peak, with the bytes per category live then.
    """

    def __init__(self) -> None:
        self.peak_event: MemoryEvent | None = None
        self.peak_reserved_event: MemoryEvent | None = None
        self._exact_bytes = -1
        self._exact_context: PeakContext | None = None
        self._exact_categories: tuple[int, ...] | None = None
        self._exact_composition: tuple[CompositionItem, ...] | None = None

    def consume(self, e: MemoryEvent) -> None:
        if self.peak_event is None or e.max_mem_allocated > self.peak_event.max_mem_allocated:
            self.peak_event = e
        if (
            self.peak_reserved_event is None
            or e.max_mem_reserved > self.peak_reserved_event.max_mem_reserved
        ):
            self.peak_reserved_event = e
        if e.peak_categories is not None and e.max_mem_allocated > self._exact_bytes:
            self._exact_bytes = e.max_mem_allocated
            self._exact_context = e.peak_context
            self._exact_categories = e.peak_categories
            self._exact_composition = e.peak_composition

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        return {"peak": self.peak()}

    def peak(self) -> dict[str, Any]:
        """The peak record of a runtime report."""
        e = self.peak_event
        if e is None:
            return {
                "phase": None,
                "module": None,
                "step": None,
                "memory_bytes": 0,
                "reserved_bytes": 0,
                "attribution": "none",
            }
        reserved = self.peak_reserved_event
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
        ctx = self._exact_context
        if ctx is not None:
            out.update(step=ctx.step, phase=ctx.phase, module=ctx.module, microbatch=ctx.microbatch)
            out["virtual_chunk"] = ctx.virtual_chunk
            out["attribution"] = "exact"
        if self._exact_categories is not None:
            out["categories"] = dict(zip(CATEGORIES, self._exact_categories, strict=True))
        if self._exact_composition is not None:
            out["composition"] = composition_section(self._exact_composition, self._exact_bytes)
        return out


def composition_section(items: tuple[CompositionItem, ...], peak_bytes: int) -> dict[str, Any]:
    """The ``peak.composition`` record: what was live at the peak, largest first, with the
    part nobody could be given (``unattributed_bytes``: the peak minus the items)."""
    total = sum(i.nbytes for i in items)
    return {
        "items": [i.to_dict() for i in items],
        "total_bytes": total,
        "unattributed_bytes": peak_bytes - total,
    }
