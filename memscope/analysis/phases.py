"""Per-phase maxima (the ``phase_summary`` section)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memscope.events.schema import READING_EVENTS, MemoryEvent


class PhaseAnalyzer:
    """Counts, high-water marks and delta range of the events of each phase."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, int]] = {}

    def consume(self, e: MemoryEvent) -> None:
        if e.event_type not in READING_EVENTS:
            return
        delta = e.delta_allocated
        ph = self.phases.get(e.phase)
        if ph is None:
            ph = self.phases[e.phase] = {
                "count": 0,
                "max_mem_allocated_after": 0,
                "max_mem_allocated": 0,
                "max_mem_reserved_after": 0,
                "max_delta_allocated": delta,
                "min_delta_allocated": delta,
            }
        ph["count"] += 1
        ph["max_mem_allocated_after"] = max(ph["max_mem_allocated_after"], e.mem_allocated_after)
        ph["max_mem_allocated"] = max(ph["max_mem_allocated"], e.max_mem_allocated)
        ph["max_mem_reserved_after"] = max(ph["max_mem_reserved_after"], e.mem_reserved_after)
        ph["max_delta_allocated"] = max(ph["max_delta_allocated"], delta)
        ph["min_delta_allocated"] = min(ph["min_delta_allocated"], delta)

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        return {"phase_summary": {name: dict(values) for name, values in self.phases.items()}}
