"""Online aggregation of events: peak, per-phase maxima, hot spots, modules, step summaries.

Everything here is O(distinct modules + distinct hot spots + bounded step summaries), so a
run of thousands of steps aggregates in bounded memory however many events it produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memscope.events.schema import CATEGORIES, STEP_PHASE, MemoryEvent


@dataclass(slots=True)
class HotSpot:
    """All events sharing (event_type, module, phase), folded into one row."""

    event_type: str
    module: str
    phase: str
    module_class: str
    count: int = 0
    max_mem_allocated_after: int = 0
    max_mem_allocated: int = 0
    max_delta_allocated: int = 0
    min_delta_allocated: int = 0
    total_delta_allocated: int = 0
    first_step: int = 0
    last_step: int = 0
    worst_step: int = 0
    worst_microbatch: int | None = None

    def add(self, e: MemoryEvent) -> None:
        delta = e.delta_allocated
        if self.count == 0:
            self.first_step = e.step
            self.max_delta_allocated = self.min_delta_allocated = delta
        else:
            self.max_delta_allocated = max(self.max_delta_allocated, delta)
            self.min_delta_allocated = min(self.min_delta_allocated, delta)
        self.count += 1
        self.total_delta_allocated += delta
        self.last_step = e.step
        self.max_mem_allocated = max(self.max_mem_allocated, e.max_mem_allocated)
        if self.count == 1 or e.mem_allocated_after > self.max_mem_allocated_after:
            self.max_mem_allocated_after = e.mem_allocated_after
            self.worst_step = e.step
            self.worst_microbatch = e.microbatch

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_type": self.event_type,
            "module": self.module,
            "module_class": self.module_class,
            "phase": self.phase,
            "count": self.count,
            "mem_allocated_after": self.max_mem_allocated_after,
            "max_mem_allocated": self.max_mem_allocated,
            "max_delta_allocated": self.max_delta_allocated,
            "min_delta_allocated": self.min_delta_allocated,
            "mean_delta_allocated": self.total_delta_allocated // max(self.count, 1),
            "first_step": self.first_step,
            "last_step": self.last_step,
            "worst_step": self.worst_step,
            "worst_microbatch": self.worst_microbatch,
        }


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
            "phase_peaks": dict(self.phase_peaks or {}),
        }
        if self.host_rss_end is not None:
            out["host_rss_end"] = self.host_rss_end
        if self.categories_end is not None:
            out["categories_end"] = dict(zip(CATEGORIES, self.categories_end, strict=True))
        if self.device_end is not None:
            out["device_end"] = dict(self.device_end)
        return out


class RuntimeAggregates:
    """Folds a stream of events into the summaries a report needs."""

    def __init__(self, max_step_summaries: int = 5000) -> None:
        self.max_step_summaries = max_step_summaries
        self.events_seen = 0
        self.peak_event: MemoryEvent | None = None
        self.peak_reserved_event: MemoryEvent | None = None
        self.phases: dict[str, dict[str, int]] = {}
        self.hot_spots: dict[tuple[str, str, str], HotSpot] = {}
        self.modules: dict[str, dict[str, Any]] = {}
        self.steps: dict[int, StepSummary] = {}
        self.step_summaries_thinned = 0

    def add(self, e: MemoryEvent) -> None:
        self.events_seen += 1
        if self.peak_event is None or e.max_mem_allocated > self.peak_event.max_mem_allocated:
            self.peak_event = e
        if (
            self.peak_reserved_event is None
            or e.max_mem_reserved > self.peak_reserved_event.max_mem_reserved
        ):
            self.peak_reserved_event = e
        ph = self.phases.get(e.phase)
        if ph is None:
            ph = self.phases[e.phase] = {
                "count": 0,
                "max_mem_allocated_after": 0,
                "max_mem_allocated": 0,
                "max_mem_reserved_after": 0,
                "max_delta_allocated": e.delta_allocated,
                "min_delta_allocated": e.delta_allocated,
            }
        ph["count"] += 1
        ph["max_mem_allocated_after"] = max(ph["max_mem_allocated_after"], e.mem_allocated_after)
        ph["max_mem_allocated"] = max(ph["max_mem_allocated"], e.max_mem_allocated)
        ph["max_mem_reserved_after"] = max(ph["max_mem_reserved_after"], e.mem_reserved_after)
        ph["max_delta_allocated"] = max(ph["max_delta_allocated"], e.delta_allocated)
        ph["min_delta_allocated"] = min(ph["min_delta_allocated"], e.delta_allocated)

        key = (e.event_type, e.module, e.phase)
        spot = self.hot_spots.get(key)
        if spot is None:
            spot = self.hot_spots[key] = HotSpot(e.event_type, e.module, e.phase, e.module_class)
        spot.add(e)
        if e.event_type == STEP_PHASE:
            self._add_step_phase(e)
        else:
            self._add_module(e)

    def _add_module(self, e: MemoryEvent) -> None:
        m = self.modules.get(e.module)
        delta = e.delta_allocated
        if m is None:
            m = self.modules[e.module] = {
                "module": e.module,
                "module_class": e.module_class,
                "count": 0,
                "max_allocated_after": 0,
                "max_delta_allocated": delta,
                "min_delta_allocated": delta,
                "total_delta_allocated": 0,
                "event_types": set(),
            }
        m["count"] += 1
        m["max_allocated_after"] = max(m["max_allocated_after"], e.mem_allocated_after)
        m["max_delta_allocated"] = max(m["max_delta_allocated"], delta)
        m["min_delta_allocated"] = min(m["min_delta_allocated"], delta)
        m["total_delta_allocated"] += delta
        m["event_types"].add(e.event_type)

    def _add_step_phase(self, e: MemoryEvent) -> None:
        s = self.steps.get(e.step)
        if s is None:
            s = self.steps[e.step] = StepSummary(e.step, allocated_start=e.mem_allocated_before)
            s.phase_peaks = {}
            self._thin_steps()
        assert s.phase_peaks is not None
        s.phase_peaks[e.phase] = e.max_mem_allocated
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
        if e.device is not None:
            s.device_end = e.device

    def _thin_steps(self) -> None:
        """Keep at most ``max_step_summaries`` steps: drop every other one, never the peak."""
        if len(self.steps) <= self.max_step_summaries:
            return
        keep_peak = self.peak_event.step if self.peak_event is not None else None
        ordered = sorted(self.steps)
        last = ordered[-1]
        for i, step in enumerate(ordered):
            if i % 2 == 1 and step not in (keep_peak, last):
                del self.steps[step]
                self.step_summaries_thinned += 1

    # -- views ------------------------------------------------------------------------------
    def top_events(self, k: int) -> list[dict[str, Any]]:
        spots = sorted(
            self.hot_spots.values(),
            key=lambda s: (s.max_mem_allocated_after, s.max_delta_allocated),
            reverse=True,
        )
        return [s.to_dict() for s in spots[:k]]

    def module_table(self) -> list[dict[str, Any]]:
        rows = []
        for m in self.modules.values():
            row = dict(m)
            row["event_types"] = sorted(m["event_types"])
            rows.append(row)
        rows.sort(key=lambda r: r["max_delta_allocated"], reverse=True)
        return rows

    def step_table(self) -> list[dict[str, Any]]:
        return [self.steps[k].to_dict() for k in sorted(self.steps)]
