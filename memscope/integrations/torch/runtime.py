"""``MemScopeTorchRuntime``: the plain-PyTorch adapter over the tracing session.

A few lines give a plain ``nn.Module`` + optimizer loop the same per-rank reports as a
Megatron run::

    from memscope.integrations.torch import MemScopeTorchRuntime

    with MemScopeTorchRuntime(model, optimizer, outdir="memscope_out") as ms:
        for step, batch in enumerate(loader):
            with ms.step(step):
                loss = model(batch).sum()
                loss.backward()
                with ms.optimizer_step():
                    optimizer.step()
                optimizer.zero_grad()

An exception leaving the ``with`` block marks the report ``crashed`` (or ``oom``) and is
re-raised; tracing failures never reach the loop.

A megatron-core model (``GPTModel`` chunks) driven by this loop gets the static estimate too:
the model gives its own settings (:mod:`memscope.integrations.megatron.model_spec`), the
optimizer object its kind, ``torch.distributed`` / ``parallel_state`` the data-parallel
size, and ``training=`` (Megatron's names: ``seq_length``, ``micro_batch_size``,
``num_microbatches`` or ``global_batch_size``, and ``optimizer`` ... to override what was
discovered) what only the trainer knows. Any other model has no static estimate, and the
report's ``comparisons`` says why.
"""

from __future__ import annotations

import contextlib
import difflib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from types import SimpleNamespace, TracebackType
from typing import Any

import torch

from memscope.capture.device import device_type
from memscope.capture.parallel import ParallelInfo
from memscope.config import RuntimeConfig, runtime_settings
from memscope.inputs.inrun import ModelFacts
from memscope.integrations.megatron.model_spec import read_model_facts
from memscope.integrations.megatron.parallel import megatron_parallel_info
from memscope.integrations.megatron.training_settings import training_settings
from memscope.session import AdapterFacts, TracingSession

NO_STATIC_ESTIMATE = (
    "no static estimate: the model is not a megatron-core model (memscope analyze-static "
    "estimates from a config)"
)
#: ``training.static_spec`` of a megatron-core model traced by this adapter.
SPEC_FROM_MODEL_AND_TRAINER = (
    "the attached model (TransformerConfig, module classes), then the trainer's settings"
)

#: What only the trainer knows and the estimate needs (Megatron's names).
TRAINER_KEYS = ("seq_length", "micro_batch_size")


def optimizer_settings(optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, Any]:
    """What the optimizer objects say, in Megatron's names: ``optimizer`` (``adam`` for
    ``Adam`` / ``AdamW``, ``sgd`` for ``SGD``, with ``sgd_momentum`` from its first param
    group) and ``torch_optimizer`` (torch's optimizers keep a ``step`` tensor per parameter).
    An optimizer of another kind gives nothing (the trainer's ``training=`` may say)."""
    kinds = {type(o).__name__ for o in optimizers}
    if kinds <= {"Adam", "AdamW"} and kinds:
        return {"optimizer": "adam", "torch_optimizer": True}
    if kinds == {"SGD"}:
        momentum = float(optimizers[0].param_groups[0].get("momentum", 0.0) or 0.0)
        return {"optimizer": "sgd", "sgd_momentum": momentum, "torch_optimizer": True}
    return {}


class MemScopeTorchRuntime:
    """Traces one rank of a plain PyTorch training loop."""

    def __init__(
        self,
        model: torch.nn.Module | Sequence[torch.nn.Module],
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        config: RuntimeConfig | None = None,
        training: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        """``config`` (or keyword ``settings`` such as ``outdir="..."``, ``backend="storage"``,
        overriding it) holds the same settings as the ``--memscope-*`` flags; tracing is on.
        ``training``: for a megatron-core model, the batch sizes (and anything else) the
        static estimate needs, under Megatron's argument names."""
        base = config or RuntimeConfig()
        known = {s.name for s in runtime_settings()}
        unknown = sorted(set(settings) - known)
        notes = list(base.notes)
        for name in unknown:  # never a TypeError into training: said once, then ignored
            near = difflib.get_close_matches(name, sorted(known), n=1)
            notes.append(
                f"memscope: unknown setting {name!r} ignored"
                + (f" (did you mean {near[0]!r}?)" if near else "")
            )
            warnings.warn(notes[-1], stacklevel=2)
        cfg = replace(base, enabled=True, **{k: v for k, v in settings.items() if k not in unknown})
        cfg.notes = notes
        chunks = [model] if isinstance(model, torch.nn.Module) else list(model)
        opts: list[torch.optim.Optimizer] = []
        if optimizer is not None:
            opts = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
        self.parallel: ParallelInfo = megatron_parallel_info(None)  # parallel_state if set up
        self.model_facts: ModelFacts | None = None
        reason = NO_STATIC_ESTIMATE
        try:  # reading the model never stops training: the comparison says why it is missing
            self.model_facts = read_model_facts(chunks)
            self.training = {**optimizer_settings(opts), **(training or {})}
        except Exception as exc:
            self.model_facts, self.training = None, dict(training or {})
            reason = f"no static estimate: reading the model failed ({type(exc).__name__}: {exc})"
        estimate = self._static_estimate if self.model_facts is not None else None
        self.session = TracingSession(
            cfg,
            self.parallel,
            AdapterFacts(
                static_estimate=estimate,
                no_estimate_reason=reason,
                metadata=self._framework_metadata,
                training_settings=self._training_settings if estimate is not None else None,
            ),
        )
        self.session.attach_model(chunks)
        if opts:
            self.session.attach_optimizers(opts)
        self._in_step = False
        self._optimizer_phase = False

    def _static_estimate(self) -> dict[str, Any]:
        from memscope.inputs.runtime_estimate import estimate_for_runtime

        missing = [k for k in TRAINER_KEYS if self.training.get(k) is None]
        if missing:
            raise ValueError(
                f"the trainer's {' and '.join(missing)} are not known: pass them as "
                "MemScopeTorchRuntime(..., training={...})"
            )
        return estimate_for_runtime(
            None, self.parallel, device_type(), model=self.model_facts, settings=self.training
        )

    def _training_settings(self) -> dict[str, Any]:
        assert self.model_facts is not None
        settings = SimpleNamespace(**{**self.training, **self.model_facts.values})
        return training_settings(settings, self.parallel, SPEC_FROM_MODEL_AND_TRAINER)

    def _framework_metadata(self) -> dict[str, Any]:
        dtypes = {p.dtype for c in self.session.chunks for p in c.parameters()}
        name = str(next(iter(dtypes))).replace("torch.", "") if len(dtypes) == 1 else "mixed"
        return {"dtype": name, "framework": "torch"}

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Begin tracing (``with`` does this)."""
        self.session.start()

    def finalize(self) -> None:
        """Write the final report and remove every hook (``with`` does this)."""
        self.session.finalize()

    def __enter__(self) -> MemScopeTorchRuntime:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.session.record_exception(exc)
        self.finalize()

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """One training step: the forward and backward passes, and optionally the optimizer
        step inside :meth:`optimizer_step`."""
        self.session.step_start(step)
        self._in_step, self._optimizer_phase = True, False
        try:
            yield
        except BaseException as exc:
            self.session.record_exception(exc)  # before the step closes: where it failed
            raise
        finally:
            if not self._optimizer_phase:
                self.session.forward_backward_end()
            self._in_step = False
            self.session.step_end()

    @contextlib.contextmanager
    def optimizer_step(self) -> Iterator[None]:
        """Around ``optimizer.step()``, inside :meth:`step`."""
        if not self._in_step:
            raise ValueError("optimizer_step() belongs inside a `with runtime.step(n):` block")
        self._optimizer_phase = True
        self.session.forward_backward_end()
        self.session.optimizer_step_start()
        try:
            yield
        finally:
            self.session.optimizer_step_end()

    @property
    def report_path(self) -> str | None:
        """The last report written, if any."""
        return self.session.report_path

    @property
    def report_dir(self) -> str:
        return self.session.report_dir
