"""What the patched FlagScale / Megatron-LM training loop calls (see ``patches/``).

The patches add only guarded one-line calls to the framework's ``train.py``/``training.py``::

    try:
        from memscope.integrations.megatron.training_hooks import memscope_hooks
    except ImportError:
        memscope_hooks = None
    ...
    if memscope_hooks is not None:
        memscope_hooks.step_start(args.curr_iteration)

and wrap the ``extra_args_provider`` of ``train_gpt.py``/``pretrain_gpt.py`` with
:func:`with_memscope_args`. All the logic lives here, so that a patched loop behaves exactly as
before when MemScope is not installed (the import fails, every call is skipped) or when
``--memscope`` is off (:data:`memscope_hooks` holds no runtime and every method returns at
once). Nothing here raises into training: a failure is logged and tracing turns off.
"""

from __future__ import annotations

import logging
from typing import Any

from memscope.integrations.megatron.args import (
    ArgsProvider,
    add_memscope_args,
    compose_args_providers,
)
from memscope.integrations.megatron.runtime import MemScopeMegatronRuntime

logger = logging.getLogger("memscope")

__all__ = ["TrainingHooks", "memscope_hooks", "with_memscope_args"]


def with_memscope_args(provider: ArgsProvider | None = None) -> ArgsProvider:
    """``provider`` (the framework's own ``extra_args_provider``, may be None) plus ours."""
    return compose_args_providers(add_memscope_args, provider)


def _is_rank_zero() -> bool:
    import torch.distributed as dist

    return not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0


class TrainingHooks:
    """Owns the run's :class:`MemScopeMegatronRuntime`; every method is a no-op without one."""

    def __init__(self) -> None:
        self.runtime: MemScopeMegatronRuntime | None = None

    @property
    def enabled(self) -> bool:
        """Whether a runtime is tracing this process."""
        return self.runtime is not None

    def start(self, args: Any, model: Any, optimizer: Any = None) -> None:
        """Begin tracing when ``args.memscope`` is set (call once ``train()`` has the model)."""
        self.finalize()  # a second train() in this process starts a fresh runtime
        if not getattr(args, "memscope", False):
            return
        try:
            runtime = MemScopeMegatronRuntime.from_megatron_args(args)
            runtime.attach_model(model)
            if optimizer is not None:
                runtime.attach_optimizer(optimizer)
            runtime.start()
        except Exception as exc:
            logger.warning("memscope: tracing not started (%s: %s)", type(exc).__name__, exc)
            return
        if not runtime.active:  # start() logged why, once; this rank trains untraced
            return
        self.runtime = runtime
        if _is_rank_zero():
            logger.info("memscope: tracing on, reports under %s", runtime.config.outdir)

    def step_start(self, iteration: int) -> None:
        """Before the step's forward-backward passes (``args.curr_iteration``)."""
        if self.runtime is not None:
            self.runtime.on_train_step_start(step=int(iteration))

    def forward_backward_end(self, losses: Any = None) -> None:
        """After the (possibly re-run) forward-backward passes."""
        if self.runtime is not None:
            self.runtime.on_forward_backward_end(outputs=losses)

    def optimizer_step_start(self) -> None:
        """Just before ``optimizer.step()``."""
        if self.runtime is not None:
            self.runtime.on_optimizer_step_start()

    def optimizer_step_end(self) -> None:
        """Just after ``optimizer.step()``."""
        if self.runtime is not None:
            self.runtime.on_optimizer_step_end()

    def step_end(self, losses: Any = None, notes: str = "") -> None:
        """On every return path of ``train_step``; ``notes`` names the path."""
        if self.runtime is not None:
            self.runtime.on_train_step_end(outputs=losses, notes=notes)

    def finalize(self) -> None:
        """Write the final report and remove every hook (normal end and before ``sys.exit``)."""
        runtime, self.runtime = self.runtime, None
        if runtime is None:
            return
        try:
            runtime.finalize()
        except Exception as exc:
            logger.warning("memscope: finalize failed (%s: %s)", type(exc).__name__, exc)
            return
        if _is_rank_zero() and runtime.report_path:
            logger.info("memscope: wrote %s", runtime.report_path)


memscope_hooks = TrainingHooks()
"""The process-wide hooks object the patched training loop calls."""
