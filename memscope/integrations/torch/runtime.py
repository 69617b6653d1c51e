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
re-raised; tracing failures never reach the loop. There is no static estimate (that needs a
Megatron config), so the report's ``comparisons`` says so.
"""

from __future__ import annotations

import contextlib
import difflib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

import torch

from memscope.capture.parallel import process_parallel_info
from memscope.config import RuntimeConfig, runtime_settings
from memscope.session import TracingSession

NO_STATIC_ESTIMATE = "no static estimate: it needs a Megatron config (memscope analyze-static)"


class MemScopeTorchRuntime:
    """Traces one rank of a plain PyTorch training loop."""

    def __init__(
        self,
        model: torch.nn.Module | Sequence[torch.nn.Module],
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        config: RuntimeConfig | None = None,
        **settings: Any,
    ) -> None:
        """``config`` (or keyword ``settings`` such as ``outdir="..."``, ``backend="storage"``,
        overriding it) holds the same settings as the ``--memscope-*`` flags; tracing is on."""
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
        self.session = TracingSession(
            cfg,
            process_parallel_info(),
            static_estimate=None,
            no_estimate_reason=NO_STATIC_ESTIMATE,
            framework_metadata=self._framework_metadata,
        )
        chunks = [model] if isinstance(model, torch.nn.Module) else list(model)
        self.session.attach_model(chunks)
        if optimizer is not None:
            opts = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
            self.session.attach_optimizers(opts)
        self._in_step = False
        self._optimizer_phase = False

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
