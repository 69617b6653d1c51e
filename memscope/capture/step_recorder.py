"""Step boundaries: which steps record module/grad events, and one event per step phase.

:class:`StepRecorder` opens and closes a training step and its phases (forward-backward,
pre-optimizer, optimizer) and emits a ``step_phase`` event for each, with a detailed reading
(allocator counters, host RSS) and what the backend knows of the peak: its context and
categories, the composition at a new high of the run and at each hooked step's end, and the
storages that outlived their step.
"""

from __future__ import annotations

from typing import Any

from memscope.capture.backends.base import MemoryBackend, MemorySample
from memscope.capture.backends.host import host_rss_bytes
from memscope.capture.category_policy import CategoryPolicy
from memscope.capture.event_emitter import EventEmitter
from memscope.capture.safety import FailureLog
from memscope.capture.training_context import TrainingContext
from memscope.config import RuntimeConfig
from memscope.events import schema as s


class StepRecorder:
    """The current step and phase of one rank, and the events of their boundaries."""

    def __init__(
        self,
        config: RuntimeConfig,
        backend: MemoryBackend,
        emitter: EventEmitter,
        context: TrainingContext,
        policy: CategoryPolicy,
        failures: FailureLog,
    ) -> None:
        self.config = config
        self.backend = backend
        self._emitter = emitter
        self._context = context
        self._policy = policy
        self._failures = failures
        self.step = -1
        self.phase = s.PHASE_SETUP
        #: The running step records module/grad events (in the forward-backward phase).
        self.in_window = False
        self.steps_completed = 0
        self.hooked_steps = 0
        #: The high-water mark of the last step that ended.
        self.last_step_peak = 0
        self._step_hooked = False  # the running step records module/grad events
        self._first_step: int | None = None  # the first traced step
        self._peak_context = backend.capabilities.peak_context
        self._composed_peak = -1
        self._host_rss = True
        self._step_start = self._phase_start = emitter.last
        self._step_started = self._phase_started = 0.0  # seconds since tracing started

    def set_context(
        self,
        module: str,
        microbatch: int | None,
        phase: str | None = None,
        chunk: int | None = None,
    ) -> None:
        """The training context is now ``module`` (in this step, ``phase`` or the current)."""
        self._context.set(self.step, phase or self.phase, module, microbatch, chunk)

    def start(self, step: int) -> None:
        if self._first_step is None:
            self._first_step = step
        self.step = step
        self.phase = s.PHASE_FORWARD_BACKWARD
        self.in_window = self.config.in_step_window(step) and (
            self.config.hook_steps == 0 or self.hooked_steps < self.config.hook_steps
        )
        self.hooked_steps += self.in_window
        self._step_hooked = self.in_window
        self._policy.step_started()
        self.backend.reset_peak()
        self.backend.mark_phase()
        self.set_context("", None)
        self._step_start = self._phase_start = self._emitter.sample(detailed=True)
        self._step_started = self._phase_started = self._emitter.elapsed()

    def end_phase(self, phase: str, next_phase: str, notes: str = "") -> None:
        """Close the running step phase (recording it) and open ``next_phase``."""
        self.in_window = self.in_window and next_phase == s.PHASE_FORWARD_BACKWARD
        self._policy.phase_ended(phase, next_phase)
        self._phase_start = self._record(phase, self._phase_start, notes, self._phase_started)
        self.backend.mark_phase()
        self._phase_started = self._emitter.elapsed()
        self.phase = next_phase
        self.set_context("", None)

    def end(self, notes: str = "") -> None:
        self._policy.pop_saved_hooks()
        end = self._record(s.PHASE_STEP, self._step_start, notes, self._step_started)
        self.last_step_peak = end.peak_allocated
        self.steps_completed += 1
        self.phase = s.PHASE_SETUP
        self.in_window = False
        self.set_context("", None)

    def _record(self, phase: str, before: MemorySample, notes: str, started: float) -> MemorySample:
        after = self._emitter.sample(detailed=True)
        extra: dict[str, Any] = {}
        if phase == s.PHASE_STEP and before.categories is not None:
            extra["categories_before"] = before.categories
        if phase != s.PHASE_STEP and after.phase_peak_allocated is not None:
            extra["phase_max_allocated"] = after.phase_peak_allocated
        first = self.step if self._first_step is None else self._first_step
        if phase == s.PHASE_STEP and self.step > first + 1:
            # born after the first step, in an earlier step than this one, still live
            kept = self.backend.survivors(first + 1, self.step - 1)
            if kept:
                extra["survivors"] = kept
        if self._peak_context:
            extra["peak_context"] = self.backend.peak_context()
            extra["peak_categories"] = self.backend.peak_categories()
            new_high = after.peak_allocated > self._composed_peak
            if new_high or (phase == s.PHASE_STEP and self._step_hooked):
                # a new high of the run carries its composition (the report's peak is the
                # highest), and so does each hooked step's end (its own peak, for step
                # diffs); other steps' do not, which keeps trace.jsonl small over long runs
                self._composed_peak = max(self._composed_peak, after.peak_allocated)
                extra["peak_composition"] = self.backend.peak_composition()
        self._emitter.emit(
            s.STEP_PHASE,
            self.step,
            phase,
            "",
            before,
            after,
            host_rss_bytes=self._read_host_rss(),
            device=after.device,
            notes=notes,
            start_timestamp=started,
            **extra,
        )
        return after

    def _read_host_rss(self) -> int | None:
        """Host RSS, or ``None`` once reading it has failed (only that reading turns off)."""
        if not self._host_rss:
            return None
        try:
            return host_rss_bytes()
        except Exception as exc:
            self._host_rss = False
            self._failures.record("host_rss", exc)
            return None
