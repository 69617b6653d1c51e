"""Per-phase maxima (the ``phase_summary`` section).

A reading's ``max_mem_allocated`` is the high-water mark of the whole step window up to the
end of its interval, not of its phase: the optimizer phase's events carry the backward's
peak when the optimizer never came near it. :class:`InPhaseMax` turns each reading into what
its own phase reached: the window's mark when the mark rose during the reading's interval
(the phase set it), else the highest allocation read in the interval (a lower bound of the
phase's true maximum, which stayed below the step's mark). A step-phase event that carries
its phase's own running peak (``phase_max_allocated``: backends that see every allocation)
gives the exact maximum whatever the step's mark did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memscope.events.schema import (
    READING_EVENTS,
    STEP_PHASE,
    MemoryEvent,
    is_step_end,
    phase_rank,
)
from memscope.events.sections import SectionLayout, SectionSpec

#: ``max_mem_allocated_source``: the phase set the step's high-water mark (the true maximum
#: where the backend has a true peak), or the maximum is the highest allocation read in it.
SOURCE_HIGH_WATER, SOURCE_READINGS = "high_water", "readings"
#: ... or the phase's own running peak, exact (``MemoryEvent.phase_max_allocated``).
SOURCE_PHASE_PEAK = "phase_peak"


class InPhaseMax:
    """Fed the reading events of a rank in emission order, says per event the highest
    allocation its phase is known to have reached in the event's interval."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._running = -1  # the window's mark at the latest reading of the step
        self._phase_end = -1  # ... at the end of the step's latest step phase

    def in_phase(self, e: MemoryEvent) -> tuple[int, str]:
        """``(bytes, source)`` for ``e``'s phase over ``e``'s interval (see the module doc)."""
        if e.step != self._step:
            self._step, self._running, self._phase_end = e.step, -1, -1
        if e.event_type == STEP_PHASE:
            # step phases follow each other, so one began where the previous one ended; the
            # whole step began with the window
            before = -1 if is_step_end(e) else self._phase_end
            if not is_step_end(e):
                self._phase_end = e.max_mem_allocated
        else:
            before = self._running
        self._running = max(self._running, e.max_mem_allocated)
        if e.phase_max_allocated is not None:
            return e.phase_max_allocated, SOURCE_PHASE_PEAK
        if e.max_mem_allocated > before:
            return e.max_mem_allocated, SOURCE_HIGH_WATER
        return max(e.mem_allocated_before, e.mem_allocated_after), SOURCE_READINGS


class PhaseAnalyzer:
    """Counts, in-phase maxima and delta range of the events of each phase."""

    section_specs = (
        SectionSpec(
            "phase_summary", "Per-phase maxima", SectionLayout.TABLE, "phase_summary", order=50
        ),
    )

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, Any]] = {}
        self._in_phase = InPhaseMax()

    def consume(self, e: MemoryEvent) -> None:
        if e.event_type not in READING_EVENTS:
            return
        delta = e.delta_allocated
        reached, source = self._in_phase.in_phase(e)
        ph = self.phases.get(e.phase)
        if ph is None:
            ph = self.phases[e.phase] = {
                "count": 0,
                "max_mem_allocated_after": 0,
                "max_mem_allocated": -1,
                "max_mem_allocated_source": source,
                "max_mem_reserved_after": 0,
                "max_delta_allocated": delta,
                "min_delta_allocated": delta,
            }
        ph["count"] += 1
        ph["max_mem_allocated_after"] = max(ph["max_mem_allocated_after"], e.mem_allocated_after)
        if reached > ph["max_mem_allocated"] or (
            reached == ph["max_mem_allocated"] and source == SOURCE_HIGH_WATER
        ):
            ph["max_mem_allocated"], ph["max_mem_allocated_source"] = reached, source
        ph["max_mem_reserved_after"] = max(ph["max_mem_reserved_after"], e.mem_reserved_after)
        ph["max_delta_allocated"] = max(ph["max_delta_allocated"], delta)
        ph["min_delta_allocated"] = min(ph["min_delta_allocated"], delta)

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        """One row per phase (``phase`` plus its maxima), in the order phases run."""
        ordered = sorted(self.phases.items(), key=lambda kv: (phase_rank(kv[0]), kv[0]))
        return {"phase_summary": [{"phase": name, **values} for name, values in ordered]}
