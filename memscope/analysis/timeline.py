"""The replays of allocator-history snapshots (the ``allocator_timeline`` section).

Each snapshot MemScope records is replayed when it is written (see
:mod:`memscope.analysis.allocator_timeline`) and arrives here as one ``allocator_timeline``
event. The section keeps the replay whose window reached the highest peak (its composition
is what the ``peak`` section shows when the backend has none of its own), every recorded
step's true high-water mark, and what recording cost: the median duration of the recorded
steps against that of the others.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from memscope.analysis.peak import SOURCE_HISTORY, composition_section
from memscope.events.schema import (
    ALLOCATOR_TIMELINE,
    CompositionItem,
    MemoryEvent,
    TimelineSummary,
    is_step_end,
)
from memscope.events.sections import SectionLayout, SectionSpec

#: A step's duration is kept for at most this many steps (the newest), to bound memory.
MAX_STEP_DURATIONS = 4096


class AllocatorTimelineAnalyzer:
    """Keeps the highest-peak replay, all recorded steps' peaks and the steps' durations."""

    section_specs = (
        SectionSpec(
            "allocator_timeline",
            "Allocator history (replayed)",
            SectionLayout.CUSTOM,
            "allocator_timeline",
            order=30,
        ),
    )

    def __init__(self) -> None:
        self.best: tuple[TimelineSummary, tuple[CompositionItem, ...]] | None = None
        self.snapshots: list[str] = []
        self.step_peaks: dict[int, int] = {}
        self.durations: dict[int, float] = {}

    def consume(self, e: MemoryEvent) -> None:
        if e.event_type == ALLOCATOR_TIMELINE and e.timeline is not None:
            summary = e.timeline
            self.snapshots.append(summary.snapshot)
            for step, nbytes in summary.step_peaks.items():
                self.step_peaks[step] = max(nbytes, self.step_peaks.get(step, 0))
            if self.best is None or summary.peak_bytes > self.best[0].peak_bytes:
                self.best = (summary, e.peak_composition or ())
        elif is_step_end(e) and e.start_timestamp is not None:
            self.durations[e.step] = e.timestamp - e.start_timestamp
            if len(self.durations) > MAX_STEP_DURATIONS:
                del self.durations[next(iter(self.durations))]

    def recording_cost(self) -> dict[str, Any] | None:
        """Median step time while history was recorded against the other steps."""
        recorded = [d for step, d in self.durations.items() if step in self.step_peaks]
        other = [d for step, d in self.durations.items() if step not in self.step_peaks]
        if not recorded or not other:
            return None
        on, off = statistics.median(recorded), statistics.median(other)
        return {
            "recorded_steps": len(recorded),
            "other_steps": len(other),
            "recorded_median_s": round(on, 6),
            "other_median_s": round(off, 6),
            "ratio": round(on / off, 4) if off > 0 else None,
        }

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        if self.best is None:
            return {"allocator_timeline": None}
        summary, items = self.best
        return {
            "allocator_timeline": {
                **summary.to_dict(),
                "snapshots": list(self.snapshots),
                "step_peaks": {str(k): v for k, v in sorted(self.step_peaks.items())},
                "composition": composition_section(items, summary.peak_bytes, SOURCE_HISTORY),
                "recording_cost": self.recording_cost(),
            }
        }
