"""Synthetic data and the Megatron-style training step of the tiny GPT harness.

``train_step`` mirrors ``megatron.training.train_step``: zero grads, the real
``get_forward_backward_func()`` schedule, the optimizer step, and the five MemScope callbacks
(``on_train_step_start``, ``on_forward_backward_end``, ``on_optimizer_step_start``,
``on_optimizer_step_end``, ``on_train_step_end``) around them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from memscope.demo.tiny_gpt import (
    TinyGPTConfig,
    build_model,
    build_optimizer,
    destroy_process,
    init_process,
)


def _synthetic_microbatch(cfg: TinyGPTConfig, dp_rank: int, index: int) -> dict[str, torch.Tensor]:
    """Micro-batch ``index`` of DP rank ``dp_rank``: learnable arithmetic token sequences."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + dp_rank * 7_919 + index)
    b, s, v = cfg.micro_batch_size, cfg.seq_length, cfg.vocab_size
    start = torch.randint(0, v, (b, 1), generator=gen)
    stride = torch.randint(1, 4, (b, 1), generator=gen)
    seq = (start + stride * torch.arange(s + 1).unsqueeze(0)) % v
    return {
        "tokens": seq[:, :-1].contiguous(),
        "labels": seq[:, 1:].contiguous(),
        "loss_mask": torch.ones(b, s, dtype=torch.float32),
        # Megatron convention: True = masked out (upper triangle), shape [1, 1, s, s].
        "attention_mask": torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(
            1, 1, s, s
        ),
        "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous(),
    }


def _microbatch_stream(cfg: TinyGPTConfig, dp_rank: int) -> Iterator[dict[str, torch.Tensor]]:
    """Endless deterministic stream of micro-batches for one model chunk."""
    index = 0
    while True:
        yield _synthetic_microbatch(cfg, dp_rank, index)
        index += 1


def make_data_iterators(
    cfg: TinyGPTConfig, dp_rank: int | None = None
) -> list[Iterator[dict[str, torch.Tensor]]]:
    """One deterministic iterator per model chunk (all chunks see the same micro-batches).

    Every rank of a DP replica (all TP / PP ranks) gets identical data; ``dp_rank`` defaults to
    megatron's data-parallel rank.  Batches are dicts with ``tokens``, ``labels``, ``loss_mask``,
    ``attention_mask`` and ``position_ids``.
    """
    if dp_rank is None:
        from megatron.core import parallel_state

        dp_rank = parallel_state.get_data_parallel_rank()
    return [_microbatch_stream(cfg, dp_rank) for _ in range(cfg.vpp or 1)]


def megatron_loss(
    loss_mask: torch.Tensor, output_tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron ``pretrain_gpt`` style 3-tuple loss: (sum, num_tokens, report)."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.cat([loss.detach().view(1), num_tokens.detach().view(1).float()])
    return loss, num_tokens, {"lm loss": report}


def _forward_step(
    data_iterator: Iterator[dict[str, torch.Tensor]], model: torch.nn.Module
) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """Megatron ``forward_step_func``: (output, loss_func); GPTModel returns per-token loss."""
    batch = next(data_iterator)
    output = model(
        batch["tokens"],
        batch["position_ids"],
        batch["attention_mask"],
        labels=batch["labels"],
    )
    return output, partial(megatron_loss, batch["loss_mask"])


def _call(callbacks: Any, name: str, **kwargs: Any) -> None:
    """Call ``callbacks.name(**kwargs)`` when callbacks is set and implements it."""
    if callbacks is None:
        return
    method = getattr(callbacks, name, None)
    if method is not None:
        method(**kwargs)


def train_step(
    chunks: list[torch.nn.Module],
    optimizer: torch.optim.Optimizer,
    cfg: TinyGPTConfig,
    step: int,
    data_iterator: Iterator[dict[str, torch.Tensor]] | list[Iterator[dict[str, torch.Tensor]]],
    callbacks: Any = None,
) -> float | None:
    """One training iteration, mirroring ``megatron.training.train_step``.

    Returns the token-weighted mean loss of the step (averaged over DP) on the last pipeline
    stage, ``None`` on other stages.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for chunk in chunks:
        chunk.zero_grad(set_to_none=not cfg.grad_buffer)
    optimizer.zero_grad(set_to_none=not cfg.grad_buffer)
    forward_backward_func = get_forward_backward_func()
    world = dist.get_world_size() if dist.is_initialized() else 1
    notes = (
        f"tiny_gpt tp={cfg.tp} pp={cfg.pp} vpp={cfg.vpp} dp={cfg.dp(world)} "
        f"microbatches={cfg.num_microbatches} schedule={forward_backward_func.__name__}"
    )
    _call(callbacks, "on_train_step_start", step=step, batch=None, notes=notes)
    iterators = data_iterator if isinstance(data_iterator, list) else [data_iterator]
    losses = forward_backward_func(
        forward_step_func=_forward_step,
        data_iterator=iterators,
        model=chunks,
        num_microbatches=cfg.num_microbatches,
        seq_length=cfg.seq_length,
        micro_batch_size=cfg.micro_batch_size,
        forward_only=False,
    )
    _call(callbacks, "on_forward_backward_end", outputs=losses)
    _call(callbacks, "on_optimizer_step_start")
    optimizer.step()
    _call(callbacks, "on_optimizer_step_end")
    _call(callbacks, "on_train_step_end", outputs=losses)

    if not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return None
    total = torch.stack([item["lm loss"] for item in losses]).sum(dim=0)
    if parallel_state.get_data_parallel_world_size() > 1:
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return float(total[0] / total[1].clamp(min=1))


def run_training(
    rank: int,
    world_size: int,
    port: int,
    cfg: TinyGPTConfig,
    steps: int,
    callbacks_factory: Callable[[list[torch.nn.Module], torch.optim.Optimizer], Any] | None = None,
) -> list[float | None]:
    """Full worker: init, build model + optimizer, train ``steps`` steps, tear down.

    ``callbacks_factory(chunks, optimizer)`` may return a callbacks object (or None).
    Returns the per-step losses (``None`` entries on non-last pipeline stages).
    """
    init_process(rank, world_size, port, cfg)
    try:
        chunks = build_model(cfg)
        optimizer = build_optimizer(chunks, cfg)
        callbacks = callbacks_factory(chunks, optimizer) if callbacks_factory else None
        iterators = make_data_iterators(cfg)
        losses: list[float | None] = []
        for step in range(steps):
            loss = train_step(chunks, optimizer, cfg, step, iterators, callbacks)
            if loss is not None and not math.isfinite(loss):
                raise FloatingPointError(f"non-finite loss {loss} at step {step}")
            losses.append(loss)
        return losses
    finally:
        destroy_process()
