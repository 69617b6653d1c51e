"""Where a Megatron run's job-wide step peaks are logged: Megatron-LM's own TensorBoard and
W&B writers on this rank (or writers the caller gives), at Megatron's iteration."""

from __future__ import annotations

from typing import Any

from memscope.session.step_peaks import DashboardSink, Sink

#: Megatron's logged iteration minus MemScope's step: ``train()`` passes
#: ``args.curr_iteration`` (the step) to ``train_step``, then ``iteration += 1`` and logs
#: ``training_log(..., iteration)`` (megatron/training/training.py).
MEGATRON_ITERATION_OFFSET = 1


def megatron_writers() -> tuple[Any, Any]:
    """Megatron-LM's TensorBoard and W&B writers on this rank (``None`` where it has none, or
    where Megatron-LM's training package is absent: megatron-core alone has no writers)."""
    try:
        from megatron.training.global_vars import get_tensorboard_writer, get_wandb_writer

        return get_tensorboard_writer(), get_wandb_writer()
    except Exception:
        return None, None


def dashboard_sink(writers: tuple[Any, Any] | None) -> Sink | None:
    """The sink over ``writers`` (TensorBoard, W&B; by default Megatron-LM's), or ``None``
    when this rank has neither."""
    tensorboard, wandb = writers if writers else megatron_writers()
    if tensorboard is None and wandb is None:
        return None
    return DashboardSink(tensorboard, wandb, iteration_offset=MEGATRON_ITERATION_OFFSET)
