"""The tiny GPT worker with the test suite's instrumentation (see :mod:`harness`).

:func:`instrumented_worker` runs ``memscope.demo.traced_training.traced_worker`` (the same
training loop as ``memscope demo``) with an :class:`Instrumentation` observer and returns what
the tests compare: losses and report path as usual, plus sha256 digests of the gradients and
parameters, exact parameter / optimizer-state byte sums, the hooks left on the model after
MemScope finalized, and, with ``fault``, an error injected inside MemScope.
"""

from __future__ import annotations

import hashlib
import os
import signal
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.demo.traced_training import WorkerResult, traced_worker

# What ``fault=`` accepts; fault_targets() maps each to the attribute it replaces.
FAULTS = (
    "module_hooks",
    "output_grads",
    "param_grads",
    "step_callbacks",
    "static_estimator",
    "schedule_regions",
)


def fault_targets(runtime: Any) -> dict[str, tuple[Any, str]]:
    """For each fault, the (object, attribute) inside MemScope that the fault replaces.

    The only place that knows the runtime's internals: adapt it when they move. It is asked
    twice, once the runtime is attached (before ``start``) and once it has started; a fault
    goes in at the first of the two where its object is not ``None`` (the tracer only exists
    once started; the static estimator may be asked at ``start``).
    """
    tracer = runtime.tracer
    return {
        "module_hooks": (tracer, "module_enter"),
        "output_grads": (tracer, "output_grad"),
        "param_grads": (tracer, "param_grad_accumulated"),
        "step_callbacks": (tracer, "phase_end"),
        "static_estimator": (runtime, "static_estimate_provider"),
        "schedule_regions": (tracer, "enter_region"),
    }


def inject_fault(runtime: Any, fault: str) -> bool:
    """Make the MemScope part named ``fault`` raise ``RuntimeError("injected fault in ...")``.

    Returns whether it went in (False: its object does not exist yet, see fault_targets).
    """
    targets = fault_targets(runtime)
    if fault not in targets:
        raise ValueError(f"unknown fault {fault!r}; choose from {sorted(targets)}")
    obj, name = targets[fault]
    if obj is None:
        return False

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"injected fault in {fault}")

    setattr(obj, name, boom)
    return True


def digest(tensors: Sequence[torch.Tensor]) -> str:
    """sha256 over the tensors' bytes, in order (bit-identical tensors, same digest)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def count_hooks(chunks: Sequence[torch.nn.Module]) -> int:
    """Forward / pre-forward hooks on every module plus gradient hooks on every parameter."""
    total = 0
    for chunk in chunks:
        for m in chunk.modules():
            total += len(m._forward_hooks) + len(m._forward_pre_hooks)
        for p in chunk.parameters():
            total += len(p._backward_hooks or {}) + len(
                getattr(p, "_post_accumulate_grad_hooks", None) or {}
            )
    return total


@dataclass
class InstrumentedResult(WorkerResult):
    """A :class:`WorkerResult` plus what :class:`Instrumentation` measured."""

    grad_digest: str = ""
    param_digest: str = ""
    param_bytes: int = 0
    optimizer_state_bytes: int = 0
    handles_left: int = 0  # hooks on the model after finalize beyond those before MemScope
    #: MemScope's hooks on the model at the end of each step (after ``trained``).
    handles_per_step: list[int] = field(default_factory=list)


@dataclass
class Instrumentation:
    """A ``TrainingObserver``: measures the run and optionally injects ``fault`` (picklable)."""

    fault: str | None = None
    #: Plant a leak: from this step on, keep one decoder-layer MLP output per step forever.
    leak_from_step: int | None = None
    microbatches: int = 1  # per step (the leak keeps one output per step)
    #: Plant a late free: keep decoder layer 0's output of microbatch 0 until the next step.
    late_free: bool = False
    #: Kill this process (SIGKILL: no handler, no report) at the first forward of this step.
    die_at_step: int | None = None
    #: Give this rank a real TensorBoard writer logging there (as Megatron's last rank has).
    tensorboard_dir: str | None = None
    #: Give this rank a real W&B run, offline, under this folder (as Megatron's last rank has).
    wandb_dir: str | None = None
    writer: Any = None
    wandb_run: Any = None
    leaked: list[torch.Tensor] = field(default_factory=list)
    injected: bool = False
    hooks_before: int = 0
    #: The model, held weakly: an exception's traceback keeps this observer alive, and later
    #: tests in the same process must not see the model as live memory.
    chunks: list[weakref.ref[torch.nn.Module]] = field(default_factory=list)
    handles_per_step: list[int] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; choose from {sorted(FAULTS)}")

    def model_built(self, chunks: list[torch.nn.Module], optimizer: torch.optim.Optimizer) -> None:
        self.hooks_before = count_hooks(chunks)
        self.chunks = [weakref.ref(chunk) for chunk in chunks]
        if self.leak_from_step is not None:
            self._plant_leak(chunks, self.leak_from_step)
        if self.late_free:
            self._plant_late_free(chunks)
        if self.die_at_step is not None:
            self._plant_death(chunks, self.die_at_step)

    def _plant_death(self, chunks: list[torch.nn.Module], step: int) -> None:
        """A rank lost mid-run, as a node failure or the OOM killer would lose it."""
        calls = [0]

        def die(module: torch.nn.Module, args: Any) -> None:
            if calls[0] == step * self.microbatches:
                os.kill(os.getpid(), signal.SIGKILL)
            calls[0] += 1

        chunks[0].register_forward_pre_hook(die)

    def _plant_late_free(self, chunks: list[torch.nn.Module]) -> None:
        """A test-only bug: a layer's output held (e.g. for logging) until the next step, long
        after backward last read it."""
        layer = chunks[0].get_submodule("decoder.layers.0")
        calls = [0]
        held: list[torch.Tensor] = []

        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            if calls[0] % self.microbatches == 0:
                held[:] = [(output[0] if isinstance(output, tuple) else output).detach()]
            calls[0] += 1

        self.late_free_handle = layer.register_forward_hook(keep)

    def _plant_leak(self, chunks: list[torch.nn.Module], first_step: int) -> None:
        """A test-only bug of the kind users hit: an output appended to a global list."""
        mlp = chunks[0].get_submodule("decoder.layers.0.mlp")
        calls = [0]
        per_step = self.microbatches

        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            if calls[0] % per_step == 0 and calls[0] // per_step >= first_step:
                self.leaked.append((output[0] if isinstance(output, tuple) else output).detach())
            calls[0] += 1

        self.leak_handle = mlp.register_forward_hook(keep)

    def attached(
        self, runtime: Any, chunks: list[torch.nn.Module], optimizer: torch.optim.Optimizer
    ) -> None:
        if self.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(self.tensorboard_dir)
        if self.wandb_dir is not None:
            import wandb

            self.wandb_run = wandb.init(mode="offline", dir=self.wandb_dir, project="memscope")
        if self.writer is not None or self.wandb_run is not None:
            runtime.set_dashboard_writers(tensorboard=self.writer, wandb=self.wandb_run)
        if self.fault is not None:
            self.injected = inject_fault(runtime, self.fault)

    def started(
        self, runtime: Any, chunks: list[torch.nn.Module], optimizer: torch.optim.Optimizer
    ) -> None:
        if self.fault is None or self.injected:
            return
        if runtime is None:
            raise ValueError(f"fault {self.fault!r} needs a traced run (memscope_argv)")
        if not inject_fault(runtime, self.fault):
            raise RuntimeError(f"fault {self.fault!r}: its target does not exist after start")
        self.injected = True

    def trained(self, iteration: int, loss: float | None) -> None:
        """Log the loss as Megatron-LM's ``training_log`` does: at ``iteration``, the step
        count after ``iteration += 1`` (megatron/training/training.py). Also counts the hooks
        MemScope has on the model as the step ends."""
        self.handles_per_step.append(self._memscope_hooks())
        if loss is None:
            return
        if self.writer is not None:
            self.writer.add_scalar("lm loss", loss, iteration)
        if self.wandb_run is not None:
            self.wandb_run.log({"lm loss": loss}, iteration)

    def finished(
        self,
        result: WorkerResult,
        chunks: list[torch.nn.Module],
        optimizer: torch.optim.Optimizer,
    ) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        params = [p for c in chunks for p in c.parameters()]
        self.measured = {
            "grad_digest": digest([p.grad for p in params if p.grad is not None]),
            "param_digest": digest(params),
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "optimizer_state_bytes": sum(
                v.numel() * v.element_size()
                for st in optimizer.state.values()
                for v in st.values()
                if isinstance(v, torch.Tensor)
            ),
            "handles_left": self._memscope_hooks(),
            "handles_per_step": self.handles_per_step,
        }

    def _memscope_hooks(self) -> int:
        """Hooks on the model beyond those it had before MemScope and those planted here."""
        planted = [self.leak_from_step is not None, self.late_free, self.die_at_step is not None]
        chunks = [chunk for ref in self.chunks if (chunk := ref()) is not None]
        return count_hooks(chunks) - self.hooks_before - sum(planted)


def instrumented_worker(
    rank: int,
    world_size: int,
    port: int,
    cfg: TinyGPTConfig,
    steps: int,
    memscope_argv: list[str] | None,
    fault: str | None = None,
    leak_from_step: int | None = None,
    late_free: bool = False,
    kill_rank_at_step: tuple[int, int] | None = None,
    tensorboard_dir: str | None = None,
    wandb_dir: str | None = None,
    megatron_args: str = "full",
) -> InstrumentedResult:
    """``traced_worker`` with :class:`Instrumentation`; same arguments plus what to plant.

    ``fault`` (one of :data:`FAULTS`) injects an error inside MemScope to show training is
    unaffected; ``leak_from_step`` and ``late_free`` plant memory bugs in the model (see
    :meth:`Instrumentation._plant_leak`, :meth:`Instrumentation._plant_late_free`);
    ``kill_rank_at_step=(rank, step)`` kills that rank at that step's first forward;
    ``tensorboard_dir`` / ``wandb_dir`` give the last rank a TensorBoard writer / an offline
    W&B run, as Megatron's has; ``megatron_args`` is ``traced_worker``'s (full, minimal or no
    Megatron args).
    Picklable by reference, so it runs under ``spawn``.
    """
    die = kill_rank_at_step[1] if kill_rank_at_step and kill_rank_at_step[0] == rank else None
    last = rank == world_size - 1
    board, run = (tensorboard_dir, wandb_dir) if last else (None, None)
    observer = Instrumentation(
        fault, leak_from_step, cfg.num_microbatches, late_free, die, board, run
    )
    result = traced_worker(
        rank, world_size, port, cfg, steps, memscope_argv, observer, megatron_args
    )
    plain = {f.name: getattr(result, f.name) for f in fields(WorkerResult)}
    return InstrumentedResult(**plain, **observer.measured)
