"""Per-step summaries from step-phase events (the ``steps`` section), bounded over long runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memscope.analysis.phases import InPhaseMax
from memscope.events.schema import CATEGORIES, STEP_PHASE, MemoryEvent, phase_rank
from memscope.events.sections import SectionLayout, SectionSpec


@dataclass(slots=True)
class StepSummary:
    """Memory over one training step (from its step-phase events)."""

    step: int
    allocated_start: int = 0
    allocated_end: int = 0
    reserved_end: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_phase: str = ""
    host_rss_end: int | None = None
    categories_end: tuple[int, ...] | None = None
    categories_start: tuple[int, ...] | None = None
    device_end: dict[str, int] | None = None
    phase_peaks: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "allocated_start": self.allocated_start,
            "allocated_end": self.allocated_end,
            "reserved_end": self.reserved_end,
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "peak_phase": self.peak_phase,
            "phase_peaks": dict(
                sorted((self.phase_peaks or {}).items(), key=lambda kv: phase_rank(kv[0]))
            ),
        }
        if self.host_rss_end is not None:
            out["host_rss_end"] = self.host_rss_end
        if self.categories_end is not None:
            out["categories_end"] = dict(zip(CATEGORIES, self.categories_end, strict=True))
        if self.categories_start is not None:
            out["categories_start"] = dict(zip(CATEGORIES, self.categories_start, strict=True))
        if self.device_end is not None:
            out["device_end"] = dict(self.device_end)
            out.update(self.gpu_signals())
        return out

    def gpu_signals(self) -> dict[str, int]:
        """What the device reading at the step's end says beside the allocator's totals
        (``cuda`` backend): device-used memory, the part PyTorch does not hold (NCCL, the
        CUDA context, other processes' libraries), the allocator's cached but free bytes, and
        its cumulative allocation retries and OOMs."""
        device = self.device_end or {}
        out: dict[str, int] = {}
        if "device_used_bytes" in device:
            used = device["device_used_bytes"]
            out["device_used_end"] = used
            out["outside_pytorch_end"] = max(0, used - self.reserved_end)
        if "num_alloc_retries" in device:  # a caching allocator's counters
            out["cached_free_end"] = max(0, self.reserved_end - self.allocated_end)
            out["alloc_retries_total"] = device["num_alloc_retries"]
            out["ooms_total"] = device.get("num_ooms", 0)
        return out


class StepAnalyzer:
    """One summary per step; beyond ``max_step_summaries`` every other one is dropped
    (never the step holding the peak, never the newest), so memory stays bounded."""

    section_specs = (SectionSpec("steps", "Steps", SectionLayout.TABLE, "steps", order=90),)

    def __init__(self, max_step_summaries: int = 5000) -> None:
        self.max_step_summaries = max_step_summaries
        self.steps: dict[int, StepSummary] = {}
        self.thinned = 0
        self._peak_bytes = -1
        self._peak_step: int | None = None
        self._in_phase = InPhaseMax()

    def consume(self, e: MemoryEvent) -> None:
        if e.max_mem_allocated > self._peak_bytes:
            self._peak_bytes, self._peak_step = e.max_mem_allocated, e.step
        if e.event_type != STEP_PHASE:
            return
        s = self.steps.get(e.step)
        if s is None:
            s = self.steps[e.step] = StepSummary(e.step, allocated_start=e.mem_allocated_before)
            s.phase_peaks = {}
            self._thin()
        assert s.phase_peaks is not None
        s.phase_peaks[e.phase] = self._in_phase.in_phase(e)[0]
        s.allocated_end = e.mem_allocated_after
        s.reserved_end = e.mem_reserved_after
        if e.max_mem_allocated > s.peak_allocated:
            s.peak_allocated = e.max_mem_allocated
            s.peak_phase = e.phase
        s.peak_reserved = max(s.peak_reserved, e.max_mem_reserved)
        if e.host_rss_bytes is not None:
            s.host_rss_end = e.host_rss_bytes
        if e.categories is not None:
            s.categories_end = e.categories
        if e.categories_before is not None:
            s.categories_start = e.categories_before
        if e.device is not None:
            s.device_end = e.device

    def _thin(self) -> None:
        if len(self.steps) <= self.max_step_summaries:
            return
        ordered = sorted(self.steps)
        last = ordered[-1]
        for i, step in enumerate(ordered):
            if i % 2 == 1 and step not in (self._peak_step, last):
                del self.steps[step]
                self.thinned += 1

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        timeline = prior.get("allocator_timeline") or {}
        exact = {int(k): int(v) for k, v in (timeline.get("step_peaks") or {}).items()}
        out: list[dict[str, Any]] = []
        for k in sorted(self.steps):
            row = self.steps[k].to_dict()
            if k in exact:  # the step's true high-water mark, from the allocator history
                row["peak_allocated_timeline"] = exact[k]
            previous = out[-1] if out else {}
            for counter, total in (
                ("alloc_retries", "alloc_retries_total"),
                ("ooms", "ooms_total"),
            ):
                if total in row and total in previous:  # since the step listed before
                    row[counter] = row[total] - previous[total]
            out.append(row)
        return {"steps": out}
