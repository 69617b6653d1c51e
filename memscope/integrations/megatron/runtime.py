"""``MemScopeMegatronRuntime``: the Megatron adapter over :class:`~memscope.session.TracingSession`.

Lifecycle (the order FlagScale's and Megatron-LM's patched ``train()`` use)::

    runtime = MemScopeMegatronRuntime.from_megatron_args(args)
    runtime.attach_model(model)          # list of chunks or one module; wrappers unwrapped
    runtime.attach_optimizer(optimizer)  # optional: exact optimizer-state categorisation
    runtime.start()
    for each step:
        runtime.on_train_step_start(step)
        ... forward_backward_func(...)
        runtime.on_forward_backward_end(losses)
        runtime.on_optimizer_step_start(); optimizer.step(); runtime.on_optimizer_step_end()
        runtime.on_train_step_end(losses)
    runtime.finalize()                   # idempotent; removes every hook it added

What is Megatron-specific lives here and only here: Megatron args -> settings, unwrapping
DDP / Float16Module chunks, the parallel grid from ``parallel_state``, the torch optimizers
inside Megatron's optimizer wrappers, ``.main_grad`` as a gradient, the schedule's own
allocations as named regions, and the static estimate from the attached model's own
settings (:mod:`.model_spec`), the Megatron args for what it does not carry. Everything else
(lifecycle, hooks, analyzers, reports, crash handling) is the session's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from memscope.capture.hooks import unwrap_module
from memscope.capture.parallel import ParallelInfo, package_version
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.inputs.inrun import ModelFacts
from memscope.integrations.megatron.layer_numbers import global_layer_numbers
from memscope.integrations.megatron.model_spec import read_model_facts
from memscope.integrations.megatron.parallel import megatron_parallel_info
from memscope.integrations.megatron.schedule_regions import ScheduleRegions
from memscope.integrations.megatron.training_settings import (
    SPEC_FROM_ARGS,
    SPEC_FROM_MODEL,
    training_settings,
)
from memscope.session import TracingSession
from memscope.session.step_peaks import DashboardSink, Sink

StaticEstimateProvider = Callable[[Any, ParallelInfo], dict[str, Any] | None]

#: Megatron's DDP accumulates into ``param.main_grad``, a view into its contiguous grad buffer.
MEGATRON_GRAD_ATTRIBUTES = ("grad", "main_grad")
#: Megatron's logged iteration minus MemScope's step: ``train()`` passes
#: ``args.curr_iteration`` (the step) to ``train_step``, then ``iteration += 1`` and logs
#: ``training_log(..., iteration)`` (megatron/training/training.py).
MEGATRON_ITERATION_OFFSET = 1


def default_static_estimate(
    args: Any, parallel: ParallelInfo, model: ModelFacts | None = None
) -> dict[str, Any]:
    """MemScope's own per-rank estimate: the attached model's own settings
    (:func:`.model_spec.read_model_facts`), this run's Megatron args for the rest."""
    from memscope.inputs.runtime_estimate import estimate_for_runtime

    if args is None and model is None:
        raise ValueError(
            "no Megatron args were given to the runtime (from_megatron_args) and no "
            "megatron-core model is attached"
        )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return estimate_for_runtime(args, parallel, device=device, model=model)


def megatron_writers() -> tuple[Any, Any]:
    """Megatron-LM's TensorBoard and W&B writers on this rank (``None`` where it has none, or
    where Megatron-LM's training package is absent: megatron-core alone has no writers)."""
    try:
        from megatron.training.global_vars import get_tensorboard_writer, get_wandb_writer

        return get_tensorboard_writer(), get_wandb_writer()
    except Exception:
        return None, None


def dtype_name(args: Any) -> str:
    """Training dtype from Megatron args (``bf16`` / ``fp16`` flags, else ``params_dtype``)."""
    if getattr(args, "bf16", False):
        return "bfloat16"
    if getattr(args, "fp16", False):
        return "float16"
    dtype = getattr(args, "params_dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else "float32"


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """torch optimizers inside Megatron wrappers (``.optimizer``, ``chained_optimizers``)."""
    found: list[torch.optim.Optimizer] = []
    stack = [optimizer]
    seen: set[int] = set()
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.optim.Optimizer):
            found.append(obj)
            continue
        stack.extend(getattr(obj, "chained_optimizers", None) or [])
        stack.append(getattr(obj, "optimizer", None))
    return found


class MemScopeMegatronRuntime:
    """Per-rank memory tracer for Megatron / FlagScale training loops."""

    def __init__(
        self,
        config: RuntimeConfig,
        args: Any = None,
        static_estimate_provider: StaticEstimateProvider | None = default_static_estimate,
    ) -> None:
        self.args = args
        self.static_estimate_provider = static_estimate_provider
        self.parallel = megatron_parallel_info(args)
        self.session = TracingSession(
            config,
            self.parallel,
            static_estimate=None if static_estimate_provider is None else self._static_estimate,
            framework_metadata=self._framework_metadata,
            training_settings=self._training_settings,
            grad_attributes=MEGATRON_GRAD_ATTRIBUTES,
            dashboard_sink=self._dashboard_sink,
        )
        self.optimizer: Any = None
        self._writers: tuple[Any, Any] | None = None
        self._layer_numbers: dict[str, int] = {}
        self.model_facts: ModelFacts | None = None

    @classmethod
    def from_megatron_args(cls, args: Any, **kwargs: Any) -> MemScopeMegatronRuntime:
        """Build from Megatron's parsed args (see :func:`add_memscope_args`)."""
        return cls(RuntimeConfig.from_megatron_args(args), args=args, **kwargs)

    # -- Megatron specifics ----------------------------------------------------------------
    def _static_estimate(self) -> dict[str, Any] | None:
        provider = self.static_estimate_provider
        assert provider is not None
        if provider is default_static_estimate:
            return default_static_estimate(self.args, self.parallel, self.model_facts)
        return provider(self.args, self.parallel)

    def _framework_metadata(self) -> dict[str, Any]:
        return {
            "dtype": dtype_name(self.args),
            "megatron_core_version": package_version("megatron-core"),
            **({"layer_numbers": self._layer_numbers} if self._layer_numbers else {}),
        }

    def _training_settings(self) -> dict[str, Any]:
        provider = self.static_estimate_provider
        spec = None
        if provider is default_static_estimate:
            spec = SPEC_FROM_MODEL if self.model_facts is not None else SPEC_FROM_ARGS
        elif provider is not None:
            spec = f"{getattr(provider, '__qualname__', type(provider).__name__)} (custom provider)"
        return training_settings(self.args, self.parallel, spec)

    def set_dashboard_writers(self, tensorboard: Any = None, wandb: Any = None) -> None:
        """The writers this rank logs the job's step peaks to (before :meth:`start`); by
        default Megatron-LM's own (``megatron.training.global_vars``), where it has them."""
        self._writers = (tensorboard, wandb)

    def _dashboard_sink(self) -> Sink | None:
        tensorboard, wandb = self._writers if self._writers else megatron_writers()
        if tensorboard is None and wandb is None:
            return None
        return DashboardSink(tensorboard, wandb, iteration_offset=MEGATRON_ITERATION_OFFSET)

    def attach_model(self, model: torch.nn.Module | list[torch.nn.Module]) -> None:
        """Hook a module or Megatron's list of model chunks (every virtual stage)."""
        try:
            chunks = list(model) if isinstance(model, (list, tuple)) else [model]
            unwrapped = [unwrap_module(c) if isinstance(c, torch.nn.Module) else c for c in chunks]
        except Exception as exc:
            self.session.abandon("attach_model", exc)
            return
        self.session.attach_model(unwrapped)
        try:
            self.model_facts = read_model_facts(unwrapped)
        except Exception as exc:  # the estimate falls back to the args alone
            self.session.failures.record("model_spec", exc, disable=False)
        if self.parallel.pp_size > 1 or len(unwrapped) > 1:  # else local = global numbering
            try:
                self._layer_numbers = global_layer_numbers(unwrapped)
            except Exception as exc:  # names stay stage-local; tracing goes on
                self.session.failures.record("layer_numbers", exc, disable=False)

    def attach_optimizer(self, optimizer: Any) -> None:
        """Optional: lets the exact backend classify optimizer state and master weights."""
        self.optimizer = optimizer
        try:
            found = torch_optimizers(optimizer)
        except Exception as exc:
            self.session.failures.record("attach_optimizer", exc)  # state left uncategorised
            return
        self.session.attach_optimizers(found)

    # -- lifecycle, delegated --------------------------------------------------------------
    def start(self) -> None:
        """Begin tracing: backend, hooks, trace file, profiler, crash handlers; and name what
        the pipeline schedule allocates outside modules (:mod:`.schedule_regions`)."""
        self.session.start()
        tracer = self.session.tracer
        if tracer is None or not self.session.active or not self.session.config.hook_modules:
            return
        regions = ScheduleRegions(tracer, self.session.failures)
        self.session.on_stop("schedule_regions", regions.remove)
        try:
            regions.install()
        except Exception as exc:
            regions.remove()
            self.session.failures.record("schedule_regions", exc)

    def on_train_step_start(self, step: int, batch: Any = None, notes: str = "") -> None:
        """Call before ``forward_backward_func``; opens the step's high-water window."""
        self.session.step_start(step, notes)

    def on_forward_backward_end(self, outputs: Any = None, notes: str = "") -> None:
        """Call right after ``forward_backward_func`` returns."""
        self.session.forward_backward_end(notes)

    def on_optimizer_step_start(self, notes: str = "") -> None:
        """Call just before ``optimizer.step()``."""
        self.session.optimizer_step_start(notes)

    def on_optimizer_step_end(self, notes: str = "") -> None:
        """Call just after ``optimizer.step()``."""
        self.session.optimizer_step_end(notes)

    def on_train_step_end(self, outputs: Any = None, notes: str = "") -> None:
        """Call on every return path of ``train_step``."""
        self.session.step_end(notes)

    def on_exception(self, exc: BaseException) -> None:
        """Record a training failure (OOM or other) and write what was recorded."""
        self.session.record_exception(exc)

    def finalize(self) -> None:
        """Stop tracing, remove every hook, write the final report. Safe to call twice."""
        self.session.finalize()

    def write_report(self) -> str | None:
        """Write ``runtime_report.json`` and ``.md`` atomically; returns the JSON path."""
        return self.session.write_report()

    def build_report(self) -> dict[str, Any]:
        """The current runtime report as a dict."""
        return self.session.build_report()

    # -- read-only views of the session ----------------------------------------------------
    @property
    def config(self) -> RuntimeConfig:
        return self.session.config

    @property
    def rank(self) -> int:
        return self.session.rank

    @property
    def enabled(self) -> bool:
        """Whether this rank is traced."""
        return self.session.enabled

    @property
    def active(self) -> bool:
        """Whether tracing is running now."""
        return self.session.active

    @property
    def report_dir(self) -> str:
        return self.session.report_dir

    @property
    def report_path(self) -> str | None:
        """The last report written, if any."""
        return self.session.report_path

    @property
    def tracer(self) -> MemoryTracer | None:
        return self.session.tracer
