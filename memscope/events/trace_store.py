"""The bounded, in-memory part of the trace that goes into ``runtime_report.json``.

Policy (documented in docs/tracing.md): step-phase events are kept for every step;
module and grad events are kept for the first ``detail_steps`` traced steps; beyond
``max_events`` nothing more is kept in memory. Everything still reaches the aggregates and,
when enabled, the JSONL trace, so no statistic is lost, only per-event detail.
"""

from __future__ import annotations

from memscope.events.schema import STEP_PHASE, MemoryEvent


class BoundedTraceStore:
    """Holds events for the report under a fixed memory bound."""

    def __init__(self, detail_steps: int, max_events: int) -> None:
        self.detail_steps = detail_steps
        self.max_events = max_events
        self.events: list[MemoryEvent] = []
        self.dropped = 0
        self._detail_step_ids: set[int] = set()

    def wants_detail(self, step: int) -> bool:
        """Whether fine events of ``step`` are kept (decided on the step's first fine event)."""
        if step in self._detail_step_ids:
            return True
        if len(self._detail_step_ids) < self.detail_steps:
            self._detail_step_ids.add(step)
            return True
        return False

    def add(self, e: MemoryEvent) -> None:
        if len(self.events) >= self.max_events:
            self.dropped += 1
            return
        if e.event_type == STEP_PHASE or self.wants_detail(e.step):
            self.events.append(e)
        else:
            self.dropped += 1

    @property
    def detail_steps_kept(self) -> list[int]:
        return sorted(self._detail_step_ids)
