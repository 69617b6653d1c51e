"""Where and when the runtime peak happened (the ``peak`` section)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memscope.events.schema import (
    CATEGORIES,
    READING_EVENTS,
    STEP_PHASE,
    CompositionItem,
    MemoryEvent,
    PeakContext,
)
from memscope.events.sections import SectionLayout, SectionSpec

#: The allocator history's peak stands for the run's when they differ by at most this share.
TIMELINE_MATCH = 0.005


class PeakAnalyzer:
    """The highest high-water mark seen, and where it was set.

    ``memory_bytes`` is the backend's true high-water mark. Without an exact context the
    peak is attributed to the first event whose interval reached it (the peak happened
    between the previous sample and that event's end); when the backend saw every allocation
    (step-phase events carry ``peak_context``), the step, phase, module and microbatch are
    those at the allocation that set the peak, with the bytes per category live then.

    Where the backend gives no composition of its own (``cuda``), the replay of a recorded
    allocator history (the ``allocator_timeline`` section, built before this one) provides
    it, when its window held the run's peak. Beside the composition: the allocator's cached
    but free bytes and the device memory outside PyTorch (NCCL, CUDA context), from the
    device reading that ended the phase holding the peak.
    """

    section_specs = (SectionSpec("peak", "Peak", SectionLayout.CUSTOM, "peak", order=20),)

    def __init__(self) -> None:
        self.peak_event: MemoryEvent | None = None
        self.peak_reserved_event: MemoryEvent | None = None
        self._exact_bytes = -1
        self._exact_context: PeakContext | None = None
        self._exact_categories: tuple[int, ...] | None = None
        self._exact_composition: tuple[CompositionItem, ...] | None = None
        self._device_event: MemoryEvent | None = None

    def consume(self, e: MemoryEvent) -> None:
        if e.event_type not in READING_EVENTS:
            return
        if (
            e.event_type == STEP_PHASE
            and e.device is not None
            and (
                self._device_event is None
                or e.max_mem_allocated > self._device_event.max_mem_allocated
            )
        ):
            self._device_event = e
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
        return {"peak": self.peak(prior.get("allocator_timeline"))}

    def peak(self, timeline: Mapping[str, Any] | None = None) -> dict[str, Any]:
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
        # The exact record stands for the run's peak only when it reached it: a step that
        # never ended (training died in it) leaves a higher reading in its hook events alone.
        exact = self._exact_bytes >= e.max_mem_allocated
        ctx = self._exact_context if exact else None
        if ctx is not None:
            out.update(step=ctx.step, phase=ctx.phase, module=ctx.module, microbatch=ctx.microbatch)
            out["virtual_chunk"] = ctx.virtual_chunk
            out["attribution"] = "exact"
        if exact and self._exact_categories is not None:
            out["categories"] = dict(zip(CATEGORIES, self._exact_categories, strict=True))
        if exact and self._exact_composition is not None:
            out["composition"] = composition_section(
                self._exact_composition, self._exact_bytes, SOURCE_LEDGER
            )
        elif timeline:
            self._from_timeline(out, timeline)
        beside = self._beside(out["memory_bytes"])
        if beside:
            out["beside"] = beside
        return out

    @staticmethod
    def _from_timeline(out: dict[str, Any], timeline: Mapping[str, Any]) -> None:
        run_peak, window_peak = int(out["memory_bytes"]), int(timeline["peak_bytes"])
        out["timeline_peak_bytes"] = window_peak
        if abs(run_peak - window_peak) > TIMELINE_MATCH * max(run_peak, 1):
            out["composition_note"] = (
                f"the recorded allocator history peaks at {window_peak} bytes, not at the "
                f"run's {run_peak} (step {out.get('step')}): record that step "
                f"(--memscope-snapshot-start-step) for its composition"
            )
            return
        items = tuple(CompositionItem.from_dict(i) for i in timeline["composition"]["items"])
        out["composition"] = composition_section(items, run_peak, SOURCE_HISTORY)
        ctx = timeline.get("peak_context")
        if ctx and out.get("attribution") != "exact":
            out.update({k: ctx.get(k) for k in ("step", "phase", "module", "microbatch")})
            out["virtual_chunk"] = ctx.get("virtual_chunk")
            out["attribution"] = "allocator_history"

    def _beside(self, peak_bytes: int) -> dict[str, int]:
        e = self._device_event
        if e is None or e.device is None or "device_used_bytes" not in e.device:
            return {}
        return {
            "allocator_cached_free_bytes": max(0, e.mem_reserved_after - peak_bytes),
            "outside_pytorch_bytes": max(0, e.device["device_used_bytes"] - e.mem_reserved_after),
            "step": e.step,
        }


#: Where a composition comes from: the storage backend's exact ledger, or a replayed
#: allocator history (a CUDA snapshot, or the ledger's own log in that format).
SOURCE_LEDGER, SOURCE_HISTORY = "storage_ledger", "allocator_history"


def composition_section(
    items: tuple[CompositionItem, ...], peak_bytes: int, source: str
) -> dict[str, Any]:
    """The ``peak.composition`` record: what was live at the peak, largest first, with the
    part nobody could be given (``unattributed_bytes``: the peak minus the items) and where
    it comes from (``SOURCE_LEDGER`` or ``SOURCE_HISTORY``)."""
    total = sum(i.nbytes for i in items)
    return {
        "source": source,
        "items": [i.to_dict() for i in items],
        "total_bytes": total,
        "unattributed_bytes": peak_bytes - total,
    }
