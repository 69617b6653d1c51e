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

Megatron's specifics live beside it: args (:mod:`.args`), chunks (:mod:`.chunks`), the grid
(:mod:`.parallel`), the torch optimizers in its wrappers (:mod:`.optimizers`), the schedule's
own allocations (:mod:`.schedule_regions`), the static estimate (:mod:`.estimate`) and the
dashboards (:mod:`.dashboards`). This class wires them to the session, which does the rest.
"""

from __future__ import annotations

from typing import Any

import torch

from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.inputs.inrun import ModelFacts
from memscope.integrations.megatron.chunks import read_chunks, unwrap_chunks
from memscope.integrations.megatron.dashboards import dashboard_sink
from memscope.integrations.megatron.estimate import (
    StaticEstimateProvider,
    default_static_estimate,
    run_estimate,
    spec_source,
)
from memscope.integrations.megatron.optimizers import torch_optimizers
from memscope.integrations.megatron.parallel import megatron_parallel_info
from memscope.integrations.megatron.schedule_regions import install_schedule_regions
from memscope.integrations.megatron.training_settings import (
    framework_metadata,
    training_settings,
)
from memscope.session import AdapterFacts, TracingSession

#: Megatron's DDP accumulates into ``param.main_grad``, a view into its contiguous grad buffer.
MEGATRON_GRAD_ATTRIBUTES = ("grad", "main_grad")


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
            AdapterFacts(
                static_estimate=None if static_estimate_provider is None else self._estimate,
                metadata=self._framework_metadata,
                training_settings=self._training_settings,
                grad_attributes=MEGATRON_GRAD_ATTRIBUTES,
                dashboard_sink=lambda: dashboard_sink(self._writers),
            ),
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
    def _estimate(self) -> dict[str, Any] | None:
        assert self.static_estimate_provider is not None
        return run_estimate(
            self.static_estimate_provider, self.args, self.parallel, self.model_facts
        )

    def _framework_metadata(self) -> dict[str, Any]:
        return framework_metadata(self.args, self._layer_numbers)

    def _training_settings(self) -> dict[str, Any]:
        spec = spec_source(self.static_estimate_provider, self.model_facts)
        return training_settings(self.args, self.parallel, spec)

    def set_dashboard_writers(self, tensorboard: Any = None, wandb: Any = None) -> None:
        """The writers this rank logs the job's step peaks to (before :meth:`start`); by
        default Megatron-LM's own (``megatron.training.global_vars``), where it has them."""
        self._writers = (tensorboard, wandb)

    def attach_model(self, model: torch.nn.Module | list[torch.nn.Module]) -> None:
        """Hook a module or Megatron's list of model chunks (every virtual stage)."""
        try:
            chunks = unwrap_chunks(model)
        except Exception as exc:
            self.session.abandon("attach_model", exc)
            return
        self.session.attach_model(chunks)
        pp_size, failures = self.parallel.pp_size, self.session.failures
        self.model_facts, self._layer_numbers = read_chunks(chunks, pp_size, failures)

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
        install_schedule_regions(self.session)

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
