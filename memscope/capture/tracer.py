"""The device-agnostic tracer: turns hook calls and step callbacks into memory events.

It knows nothing about any framework or device: what a backend can do comes from its
:class:`~memscope.capture.backends.base.BackendCapabilities`, category rules from the
:class:`~memscope.capture.category_policy.CategoryPolicy`, and every event goes to the
consumers it was given (the bounded store, the analyzers, the trace writer).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memscope.capture.backends.base import MemoryBackend, MemorySample
from memscope.capture.backends.host import host_rss_bytes
from memscope.capture.category_policy import CategoryPolicy
from memscope.capture.hooks import ModuleLabel
from memscope.capture.safety import FailureLog
from memscope.capture.tensors import tensor_info, tensors_in
from memscope.config import RuntimeConfig
from memscope.events import schema as s
from memscope.events.schema import (
    ContextMarker,
    EventConsumer,
    MemoryEvent,
    PeakContext,
    TensorInfo,
)

HOOK_FAMILIES = ("module_hooks", "output_grad_hooks", "param_grad_hooks")


def _in_backward() -> bool:
    """True while the autograd engine runs a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


@dataclass(slots=True)
class _OpenModule:
    label: ModuleLabel
    before: MemorySample
    inputs: list[TensorInfo]
    microbatch: int | None
    recompute: bool
    started: float  # seconds since tracing started


class MemoryTracer:
    """Records step phases, module forwards and grads of one rank into events."""

    def __init__(
        self,
        config: RuntimeConfig,
        backend: MemoryBackend,
        rank: int,
        consumers: Sequence[EventConsumer],
        *,
        policy: CategoryPolicy | None = None,
        failures: FailureLog | None = None,
        pipeline_stage: int | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.policy = policy or CategoryPolicy(None)
        self.rank = rank
        self.pipeline_stage = pipeline_stage
        self.consumers = tuple(consumers)
        self.failures = failures or FailureLog(rank=rank)
        self.t0 = time.time()
        self.step = -1
        self.phase = s.PHASE_SETUP
        self.in_window = False
        self.steps_completed = 0
        self.hooked_steps = 0
        self.events_emitted = 0
        self.current_microbatch: int | None = None
        self._stack: list[_OpenModule] = []
        self._microbatches: dict[int, int] = {}
        self._backward_microbatch: int | None = None
        self._param_before: dict[str, MemorySample] = {}
        self._last: MemorySample = backend.sample()
        self._phase_start: MemorySample = self._last
        self._step_start: MemorySample = self._last
        self._families = {
            "module_hooks": config.hook_modules,
            "output_grad_hooks": config.hook_modules and config.hook_output_grads,
            "param_grad_hooks": config.hook_param_grads,
        }
        caps = backend.capabilities
        self._sync = config.sync_on_module_hooks and caps.can_synchronize
        self._sync_steps = config.sync_on_step_boundaries and caps.can_synchronize
        self._peak_context = caps.peak_context
        self._shapes = config.record_tensor_shapes
        self._composed_peak = -1
        self._step_hooked = False  # the running step records module/grad events
        self.last_step_peak = 0  # the high-water mark of the last step that ended
        self._step_started = self._phase_started = 0.0  # seconds since tracing started
        self._first_step: int | None = None  # the first traced step
        #: The training-loop region running outside every module (see :meth:`enter_region`).
        self._region = ""
        #: The latest context (module, microbatch, phase, VPP chunk) a hook set.
        self._context: tuple[str, int | None, str, int | None] = ("", None, s.PHASE_SETUP, None)
        #: Context changes with their time, kept while an allocator history is recorded
        #: (:meth:`start_markers`); bounded by ``max_markers``.
        self.markers: list[ContextMarker] | None = None
        self.max_markers = 0
        self._host_rss = True

    # -- context markers -------------------------------------------------------------------
    def start_markers(self, limit: int) -> None:
        """Keep every context change from now on (at most ``limit``) with its time."""
        self.markers, self.max_markers = [], limit

    def take_markers(self) -> list[ContextMarker]:
        """The markers kept so far; keeping goes on."""
        return list(self.markers or ())

    # -- families & failures ---------------------------------------------------------------
    def family_enabled(self, family: str) -> bool:
        return self.in_window and self._families[family]

    def hook_failed(self, family: str, exc: BaseException) -> None:
        self.failures.record(family, exc)
        self._families[family] = False
        if family == "module_hooks":
            self._families["output_grad_hooks"] = False
            self._stack.clear()

    # -- sampling & emission ---------------------------------------------------------------
    def _sample(self, detailed: bool = False) -> MemorySample:
        if (self._sync and not detailed) or (self._sync_steps and detailed):
            self.backend.synchronize()
        sample = self.backend.sample(detailed)
        self._last = sample
        return sample

    def _set_context(
        self,
        module: str,
        microbatch: int | None,
        phase: str | None = None,
        chunk: int | None = None,
    ) -> None:
        # Only a backend that records where its peak was set reads the context; while an
        # allocator history is recorded, each change is also kept as a timestamped marker.
        self._context = (module, microbatch, phase or self.phase, chunk)
        if self._peak_context:
            self.backend.context = PeakContext(
                self.step, phase or self.phase, module, microbatch, chunk
            )
        markers = self.markers
        if markers is not None and len(markers) < self.max_markers:
            markers.append(
                ContextMarker(
                    time.time_ns() // 1000,
                    phase or self.phase,
                    module,
                    microbatch,
                    chunk,
                    self.step,
                )
            )

    def _emit(
        self,
        event_type: str,
        phase: str,
        module: str,
        before: MemorySample,
        after: MemorySample,
        **extra: Any,
    ) -> MemoryEvent:
        self.events_emitted += 1
        event = MemoryEvent(
            seq=self.events_emitted,
            event_type=event_type,
            phase=phase,
            step=self.step,
            module=module,
            timestamp=time.time() - self.t0,
            rank=self.rank,
            mem_allocated_before=before.allocated,
            mem_allocated_after=after.allocated,
            mem_reserved_before=before.reserved,
            mem_reserved_after=after.reserved,
            max_mem_allocated=max(after.peak_allocated, after.allocated),
            max_mem_reserved=max(after.peak_reserved, after.reserved),
            pipeline_stage=self.pipeline_stage,
            categories=after.categories,
            **extra,
        )
        for consumer in self.consumers:
            consumer.consume(event)
        return event

    def record_timeline(
        self, summary: s.TimelineSummary, composition: tuple[s.CompositionItem, ...]
    ) -> MemoryEvent:
        """Emit what replaying an allocator-history snapshot found (one event per snapshot)."""
        now = self._sample()
        return self._emit(
            s.ALLOCATOR_TIMELINE,
            self.phase,
            summary.snapshot,
            now,
            now,
            timeline=summary,
            peak_composition=composition,
        )

    def record_failure(self, oom: bool, reason: str) -> MemoryEvent:
        """Emit the moment training failed (``oom``: out of memory), in the context the last
        hook set: the module forward that was running, or the gradient being computed."""
        module, microbatch, phase, chunk = self._context
        before = self._last  # the latest reading a hook took
        return self._emit(
            s.OOM if oom else s.CRASH,
            phase,
            module,
            before,
            self._sample(),
            microbatch=microbatch,
            virtual_chunk=chunk,
            notes=reason,
            peak_composition=self.backend.composition_at_failure(),
        )

    # -- training-loop regions -------------------------------------------------------------
    def enter_region(self, label: str) -> str:
        """A part of the training loop that runs outside every module (a framework's batch
        loading and loss, its pipeline communication) begins: memory allocated while no
        module forward is open is attributed to ``label`` instead of to no module. Returns
        the region it replaces, for :meth:`exit_region`."""
        previous, self._region = self._region, label
        if not self._stack:
            self._set_context(label, None)
        return previous

    def exit_region(self, previous: str, raised: bool = False) -> None:
        """The region :meth:`enter_region` opened ends; ``previous`` is current again (the
        context stays where it was when the region ``raised``: that is where training
        failed)."""
        self._region = previous
        if not self._stack and not raised:
            self._set_context(previous, None)

    # -- module hooks ----------------------------------------------------------------------
    def module_enter(
        self, label: ModuleLabel, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        recompute = _in_backward()
        if label.is_root and not recompute:
            count = self._microbatches.get(label.chunk, 0)
            self._microbatches[label.chunk] = count + 1
            self.current_microbatch = count
        mb = self._backward_microbatch if recompute else self.current_microbatch
        inputs: list[TensorInfo] = []
        if self._shapes:
            inputs = [tensor_info(t) for t in tensors_in(args)]
            inputs += [tensor_info(t, k) for k, t in kwargs.items() if isinstance(t, torch.Tensor)]
        self.policy.module_entered()
        started = time.time() - self.t0
        self._stack.append(_OpenModule(label, self._sample(), inputs, mb, recompute, started))
        phase = s.PHASE_RECOMPUTE if recompute else s.PHASE_FORWARD
        self._set_context(label.name, mb, phase, label.chunk)

    def module_exit(self, label: ModuleLabel, output: Any) -> list[torch.Tensor]:
        # Pop to the matching frame (a forward that raised leaves its children open).
        frame = None
        while self._stack:
            candidate = self._stack.pop()
            if candidate.label is label:
                frame = candidate
                break
        if frame is None:
            return []
        after = self._sample()
        outs = tensors_in(output)
        phase = s.PHASE_RECOMPUTE if frame.recompute else s.PHASE_FORWARD
        self._emit(
            s.MODULE_FORWARD,
            phase,
            label.name,
            frame.before,
            after,
            module_class=label.module_class,
            microbatch=frame.microbatch,
            virtual_chunk=label.chunk,
            recompute=frame.recompute,
            start_timestamp=frame.started,
            inputs=frame.inputs,
            outputs=[tensor_info(t) for t in outs] if self._shapes else [],
        )
        if output is None and sys.exc_info()[1] is not None:
            return []  # the forward raised: the context stays where it failed
        parent = self._stack[-1] if self._stack else None
        self._set_context(
            parent.label.name if parent else self._region,
            frame.microbatch,
            phase,
            parent.label.chunk if parent else None,
        )
        if not self._families["output_grad_hooks"] or not torch.is_grad_enabled():
            return []
        # Only non-leaf outputs: Megatron layers return parameters as outputs (skip_bias_add
        # hands back the bias), and a hook on a parameter would pile up every step.
        return [t for t in outs if t.requires_grad and t.grad_fn is not None]

    def output_grad(self, label: ModuleLabel, microbatch: int | None, grad: torch.Tensor) -> None:
        self._backward_microbatch = microbatch
        self._set_context(label.name, microbatch, s.PHASE_BACKWARD, label.chunk)
        before = self._last
        after = self._sample()
        self._emit(
            s.OUTPUT_GRAD,
            s.PHASE_BACKWARD,
            label.name,
            before,
            after,
            module_class=label.module_class,
            microbatch=microbatch,
            virtual_chunk=label.chunk,
            grads=[tensor_info(grad)] if self._shapes else [],
        )

    def param_grad_ready(self, name: str, grad: torch.Tensor) -> None:
        # The event spans from the previous sample, so the allocation of the gradient itself
        # (made by the backward op just before this hook) is attributed to this parameter.
        self._set_context(name, self._backward_microbatch, s.PHASE_BACKWARD)
        self._param_before[name] = self._last

    def param_grad_accumulated(self, name: str, param: torch.Tensor) -> None:
        before = self._param_before.pop(name, None) or self._last
        after = self._sample()
        grad = param.grad
        if self.policy.active and grad is not None:
            self.policy.gradient_accumulated(grad)
            after = self._sample()
        self._emit(
            s.PARAM_GRAD,
            s.PHASE_BACKWARD,
            name,
            before,
            after,
            module_class="Parameter",
            microbatch=self._backward_microbatch,
            grads=[tensor_info(grad, name)] if grad is not None else [],
        )

    # -- step boundaries -------------------------------------------------------------------
    def _read_host_rss(self) -> int | None:
        """Host RSS, or ``None`` once reading it has failed (only that reading turns off)."""
        if not self._host_rss:
            return None
        try:
            return host_rss_bytes()
        except Exception as exc:
            self._host_rss = False
            self.failures.record("host_rss", exc)
            return None

    def _step_phase(
        self, phase: str, before: MemorySample, notes: str, started: float
    ) -> MemorySample:
        after = self._sample(detailed=True)
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
        self._emit(
            s.STEP_PHASE,
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

    def step_start(self, step: int, notes: str = "") -> None:
        if self._stack:
            self._stack.clear()
        if self._first_step is None:
            self._first_step = step
        self.step = step
        self.phase = s.PHASE_FORWARD_BACKWARD
        self.in_window = self.config.in_step_window(step) and (
            self.config.hook_steps == 0 or self.hooked_steps < self.config.hook_steps
        )
        self.hooked_steps += self.in_window
        self._step_hooked = self.in_window
        self._microbatches.clear()
        self.current_microbatch = None
        self._backward_microbatch = None
        self._param_before.clear()
        self.policy.step_started()
        self.backend.reset_peak()
        self.backend.mark_phase()
        self._set_context("", None)
        self._step_start = self._phase_start = self._sample(detailed=True)
        self._step_started = self._phase_started = time.time() - self.t0

    def phase_end(self, phase: str, next_phase: str, notes: str = "") -> None:
        """Close the running step phase (recording it) and open ``next_phase``."""
        self.in_window = self.in_window and next_phase == s.PHASE_FORWARD_BACKWARD
        self.policy.phase_ended(phase, next_phase)
        self._phase_start = self._step_phase(phase, self._phase_start, notes, self._phase_started)
        self.backend.mark_phase()
        self._phase_started = time.time() - self.t0
        self.phase = next_phase
        self._set_context("", None)

    def step_end(self, notes: str = "") -> None:
        self.policy.pop_saved_hooks()
        end = self._step_phase(s.PHASE_STEP, self._step_start, notes, self._step_started)
        self.last_step_peak = end.peak_allocated
        self.steps_completed += 1
        self.phase = s.PHASE_SETUP
        self.in_window = False
        self._set_context("", None)
