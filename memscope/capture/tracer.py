"""The device-agnostic tracer: turns hook calls and step callbacks into memory events.

It knows nothing about any framework or device: what a backend can do comes from its
:class:`~memscope.capture.backends.base.BackendCapabilities`, category rules from the
:class:`~memscope.capture.category_policy.CategoryPolicy`, and every event goes to the
consumers it was given (the bounded store, the analyzers, the trace writer). Its parts:
:class:`~memscope.capture.event_emitter.EventEmitter` (readings into events),
:class:`~memscope.capture.training_context.TrainingContext` (where training is, for the
backend's peak and the history's markers) and
:class:`~memscope.capture.step_recorder.StepRecorder` (step and phase boundaries); the
tracer itself follows module forwards and gradients.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memscope.capture.backends.base import MemoryBackend, MemorySample
from memscope.capture.category_policy import CategoryPolicy
from memscope.capture.event_emitter import EventEmitter
from memscope.capture.hooks import ModuleLabel
from memscope.capture.safety import FailureLog
from memscope.capture.step_recorder import StepRecorder
from memscope.capture.tensors import tensor_info, tensors_in
from memscope.capture.training_context import TrainingContext
from memscope.config import RuntimeConfig
from memscope.events import schema as s
from memscope.events.schema import ContextMarker, EventConsumer, MemoryEvent, TensorInfo


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
        self.failures = failures or FailureLog(rank=rank)
        self.emitter = EventEmitter(config, backend, rank, consumers, pipeline_stage)
        self.context = TrainingContext(backend)
        self.steps = StepRecorder(
            config, backend, self.emitter, self.context, self.policy, self.failures
        )
        self.current_microbatch: int | None = None
        self._stack: list[_OpenModule] = []
        self._microbatches: dict[int, int] = {}
        self._backward_microbatch: int | None = None
        self._param_before: dict[str, MemorySample] = {}
        self._families = {
            "module_hooks": config.hook_modules,
            "output_grad_hooks": config.hook_modules and config.hook_output_grads,
            "param_grad_hooks": config.hook_param_grads,
        }
        self._shapes = config.record_tensor_shapes
        #: The training-loop region running outside every module (see :meth:`enter_region`).
        self._region = ""

    # -- what the session reads ------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.steps.step

    @property
    def phase(self) -> str:
        return self.steps.phase

    @property
    def in_window(self) -> bool:
        """The running step records module/grad events."""
        return self.steps.in_window

    @property
    def steps_completed(self) -> int:
        return self.steps.steps_completed

    @property
    def last_step_peak(self) -> int:
        """The high-water mark of the last step that ended."""
        return self.steps.last_step_peak

    @property
    def events_emitted(self) -> int:
        return self.emitter.events_emitted

    # -- context markers -------------------------------------------------------------------
    def start_markers(self, limit: int) -> None:
        """Keep every context change from now on (at most ``limit``) with its time."""
        self.context.start_markers(limit)

    def take_markers(self) -> list[ContextMarker]:
        """The markers kept so far; keeping goes on."""
        return self.context.take_markers()

    # -- families & failures ---------------------------------------------------------------
    def family_enabled(self, family: str) -> bool:
        return self.steps.in_window and self._families[family]

    def hook_failed(self, family: str, exc: BaseException) -> None:
        self.failures.record(family, exc)
        self._families[family] = False
        if family == "module_hooks":
            self._families["output_grad_hooks"] = False
            self._stack.clear()

    # -- events outside hooks --------------------------------------------------------------
    def _emit(
        self,
        event_type: str,
        phase: str,
        module: str,
        before: MemorySample,
        after: MemorySample,
        **extra: Any,
    ) -> MemoryEvent:
        return self.emitter.emit(event_type, self.steps.step, phase, module, before, after, **extra)

    def record_timeline(
        self, summary: s.TimelineSummary, composition: tuple[s.CompositionItem, ...]
    ) -> MemoryEvent:
        """Emit what replaying an allocator-history snapshot found (one event per snapshot)."""
        now = self.emitter.sample()
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
        module, microbatch, phase, chunk = self.context.current
        before = self.emitter.last  # the latest reading a hook took
        return self._emit(
            s.OOM if oom else s.CRASH,
            phase,
            module,
            before,
            self.emitter.sample(),
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
            self.steps.set_context(label, None)
        return previous

    def exit_region(self, previous: str, raised: bool = False) -> None:
        """The region :meth:`enter_region` opened ends; ``previous`` is current again (the
        context stays where it was when the region ``raised``: that is where training
        failed)."""
        self._region = previous
        if not self._stack and not raised:
            self.steps.set_context(previous, None)

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
        started = self.emitter.elapsed()
        self._stack.append(
            _OpenModule(label, self.emitter.sample(), inputs, mb, recompute, started)
        )
        phase = s.PHASE_RECOMPUTE if recompute else s.PHASE_FORWARD
        self.steps.set_context(label.name, mb, phase, label.chunk)

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
        after = self.emitter.sample()
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
        self.steps.set_context(
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
        self.steps.set_context(label.name, microbatch, s.PHASE_BACKWARD, label.chunk)
        before = self.emitter.last
        after = self.emitter.sample()
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
        self.steps.set_context(name, self._backward_microbatch, s.PHASE_BACKWARD)
        self._param_before[name] = self.emitter.last

    def param_grad_accumulated(self, name: str, param: torch.Tensor) -> None:
        before = self._param_before.pop(name, None) or self.emitter.last
        after = self.emitter.sample()
        grad = param.grad
        if self.policy.active and grad is not None:
            self.policy.gradient_accumulated(grad)
            after = self.emitter.sample()
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
    def step_start(self, step: int, notes: str = "") -> bool:
        """Open step ``step``; returns whether it records module/grad events."""
        self._stack.clear()
        self._microbatches.clear()
        self.current_microbatch = None
        self._backward_microbatch = None
        self._param_before.clear()
        self.steps.start(step)
        return self.steps.in_window

    def phase_end(self, phase: str, next_phase: str, notes: str = "") -> None:
        """Close the running step phase (recording it) and open ``next_phase``."""
        self.steps.end_phase(phase, next_phase, notes)

    def step_end(self, notes: str = "") -> None:
        self.steps.end(notes)
