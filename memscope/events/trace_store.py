"""The bounded, in-memory part of the trace that goes into ``runtime_report.json``.

Policy (documented in docs/tracing.md): module and grad events are kept for the first
``detail_steps`` traced steps; step-phase events are kept for at most ``max_steps`` distinct
steps — when full, every other held step is dropped and the stride between held steps doubles,
so a long run keeps an evenly spaced timeline (plus the detail steps and the newest step);
nothing beyond ``max_events`` is kept. Every event still reaches the aggregates and, when
enabled, the JSONL trace, so no statistic is lost.
"""

from __future__ import annotations

from memscope.events.schema import STEP_PHASE, MemoryEvent


class BoundedTraceStore:
    """Holds events for the report under a fixed memory bound."""

    def __init__(self, detail_steps: int, max_events: int, max_steps: int = 2000) -> None:
        assert max_steps >= 2, "thinning needs room for at least two steps"
        self.detail_steps = detail_steps
        self.max_events = max_events
        self.max_steps = max_steps
        self.dropped = 0
        self.steps_thinned = 0
        self.stride = 1
        self._kept: list[MemoryEvent] = []
        self._tail: list[MemoryEvent] = []  # step phases of the newest off-stride step
        self._detail_step_ids: set[int] = set()
        self._steps_held: list[int] = []
        self._first_step: int | None = None
        self._current_step: int | None = None
        self._current_kept = True

    @property
    def events(self) -> list[MemoryEvent]:
        """Events held for the report, oldest first."""
        return self._kept + self._tail

    def wants_detail(self, step: int) -> bool:
        """Whether fine events of ``step`` are kept (decided on the step's first fine event)."""
        if step in self._detail_step_ids:
            return True
        if len(self._detail_step_ids) < self.detail_steps:
            self._detail_step_ids.add(step)
            return True
        return False

    def consume(self, e: MemoryEvent) -> None:
        """Keep ``e`` if the policy allows (see the module docstring)."""
        if len(self._kept) + len(self._tail) >= self.max_events:
            self.dropped += 1
            return
        if e.event_type != STEP_PHASE:
            if self.wants_detail(e.step):
                self._kept.append(e)
            else:
                self.dropped += 1
            return
        if e.step != self._current_step:
            self._open_step(e.step)
        if self._current_kept:
            self._kept.append(e)
        else:
            self._tail.append(e)

    def _open_step(self, step: int) -> None:
        self._current_step = step
        if self._first_step is None:
            self._first_step = step
        self.dropped += len(self._tail)  # the previous tail step is no longer the newest
        self._tail = []
        on_stride = (step - self._first_step) % self.stride == 0
        self._current_kept = on_stride or step in self._detail_step_ids
        if self._current_kept:
            self._steps_held.append(step)
            if len(self._steps_held) > self.max_steps:
                self._thin()

    def _thin(self) -> None:
        """Drop every other held step (never a detail step or the newest); double the stride."""
        newest = self._steps_held[-1]
        drop = {
            step
            for i, step in enumerate(self._steps_held)
            if i % 2 == 1 and step != newest and step not in self._detail_step_ids
        }
        before = len(self._kept)
        self._kept = [e for e in self._kept if not (e.event_type == STEP_PHASE and e.step in drop)]
        self.dropped += before - len(self._kept)
        self.steps_thinned += len(drop)
        self._steps_held = [s for s in self._steps_held if s not in drop]
        self.stride *= 2

    @property
    def detail_steps_kept(self) -> list[int]:
        return sorted(self._detail_step_ids)
