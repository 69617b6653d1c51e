"""A traced worker: the tiny real megatron-core GPT trained with MemScope wired in.

This is the training loop of ``memscope demo``, of the multi-process tests and of
``tools/bench_overhead.py``. It wires the runtime exactly as the FlagScale / Megatron-LM
patches do (``from_megatron_args`` → ``attach_model`` → ``start`` → step callbacks →
``finalize``; ``on_exception`` when training raises).
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from memscope.demo.tiny_gpt import (
    TinyGPTConfig,
    build_model,
    build_optimizer,
    destroy_process,
    init_process,
)
from memscope.demo.tiny_gpt_training import make_data_iterators, train_step
from memscope.integrations.megatron.args import add_memscope_args
from memscope.integrations.megatron.runtime import MemScopeMegatronRuntime


@dataclass
class WorkerResult:
    """What one rank reports back to the launcher."""

    rank: int
    losses: list[float | None]
    grad_digest: str
    param_digest: str
    step_times: list[float] = field(default_factory=list)
    report_path: str | None = None
    param_bytes: int = 0
    optimizer_state_bytes: int = 0
    handles_left: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def megatron_like_args(cfg: TinyGPTConfig, memscope_argv: list[str]) -> argparse.Namespace:
    """A namespace shaped like Megatron's parsed args, with MemScope's flags parsed in."""
    parser = add_memscope_args(argparse.ArgumentParser(allow_abbrev=False))
    args = parser.parse_args(memscope_argv)
    args.tensor_model_parallel_size = cfg.tp
    args.pipeline_model_parallel_size = cfg.pp
    args.virtual_pipeline_model_parallel_size = cfg.vpp
    args.context_parallel_size = 1
    args.expert_model_parallel_size = 1
    args.params_dtype = torch.float32
    args.bf16 = args.fp16 = False
    args.num_layers = cfg.num_layers
    args.hidden_size = cfg.hidden_size
    args.num_attention_heads = cfg.num_attention_heads
    args.seq_length = cfg.seq_length
    args.micro_batch_size = cfg.micro_batch_size
    # What the static estimator reads (Megatron's names for the harness' settings).
    args.padded_vocab_size = cfg.vocab_size
    args.num_query_groups = cfg.num_query_groups
    args.group_query_attention = cfg.num_query_groups is not None
    args.ffn_hidden_size = cfg.ffn_hidden_size
    args.swiglu = cfg.swiglu
    args.sequence_parallel = cfg.sequence_parallel and cfg.tp > 1
    args.recompute_granularity = cfg.recompute
    args.recompute_method = "uniform" if cfg.recompute == "full" else None
    args.recompute_num_layers = 1 if cfg.recompute == "full" else None
    args.hidden_dropout = args.attention_dropout = cfg.dropout
    args.num_microbatches = cfg.num_microbatches
    args.untie_embeddings_and_output_weights = not (
        cfg.share_embeddings if cfg.share_embeddings is not None else cfg.pp == 1
    )
    args.optimizer = cfg.optimizer
    args.sgd_momentum = 0.0  # build_optimizer's plain SGD
    args.torch_optimizer = True  # torch.optim keeps a float32 ``step`` tensor per parameter
    args.transformer_impl = "local"
    return args


def _digest(tensors: Sequence[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def _count_hooks(chunks: list[torch.nn.Module]) -> int:
    total = 0
    for chunk in chunks:
        for m in chunk.modules():
            total += len(m._forward_hooks) + len(m._forward_pre_hooks)
        for p in chunk.parameters():
            total += len(p._backward_hooks or {}) + len(
                getattr(p, "_post_accumulate_grad_hooks", None) or {}
            )
    return total


def traced_worker(
    rank: int,
    world_size: int,
    port: int,
    cfg: TinyGPTConfig,
    steps: int,
    memscope_argv: list[str] | None,
    fault: str | None = None,
) -> WorkerResult:
    """Train ``steps`` steps; with ``memscope_argv`` (e.g. ``["--memscope", ...]``) traced.

    ``fault`` injects an error inside MemScope (``"module_hooks"``, ``"output_grads"``,
    ``"param_grads"``, ``"step_callbacks"``, ``"static_estimator"``) to show training is
    unaffected.
    """
    torch.set_num_threads(1)
    init_process(rank, world_size, port, cfg)
    runtime: MemScopeMegatronRuntime | None = None
    try:
        chunks = build_model(cfg)
        optimizer = build_optimizer(chunks, cfg)
        hooks_before = _count_hooks(chunks)
        if memscope_argv is not None:
            runtime = MemScopeMegatronRuntime.from_megatron_args(
                megatron_like_args(cfg, memscope_argv)
            )
            runtime.attach_model(chunks)
            runtime.attach_optimizer(optimizer)
            runtime.start()
            if fault is not None:
                _inject_fault(runtime, fault)
        iterators = make_data_iterators(cfg)
        losses: list[float | None] = []
        times: list[float] = []
        try:
            for step in range(steps):
                t = time.perf_counter()
                losses.append(train_step(chunks, optimizer, cfg, step, iterators, runtime))
                times.append(time.perf_counter() - t)
        except BaseException as exc:
            if runtime is not None:
                runtime.on_exception(exc)
            raise
        params = [p for c in chunks for p in c.parameters()]
        grads = [p.grad for p in params if p.grad is not None]
        result = WorkerResult(
            rank=rank,
            losses=losses,
            grad_digest=_digest(grads),
            param_digest=_digest(params),
            step_times=times,
            param_bytes=sum(p.numel() * p.element_size() for p in params),
            optimizer_state_bytes=sum(
                v.numel() * v.element_size()
                for st in optimizer.state.values()
                for v in st.values()
                if isinstance(v, torch.Tensor)
            ),
        )
        if runtime is not None:
            runtime.finalize()
            result.report_path = runtime.report_path
        result.handles_left = _count_hooks(chunks) - hooks_before
        return result
    finally:
        if runtime is not None:
            runtime.finalize()
        destroy_process()


def _inject_fault(runtime: MemScopeMegatronRuntime, fault: str) -> None:
    tracer = runtime.tracer
    assert tracer is not None

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"injected fault in {fault}")

    targets = {
        "module_hooks": (tracer, "module_enter"),
        "output_grads": (tracer, "output_grad"),
        "param_grads": (tracer, "param_grad_accumulated"),
        "step_callbacks": (tracer, "phase_end"),
        "static_estimator": (runtime, "static_estimate_provider"),
    }
    if fault not in targets:
        raise ValueError(f"unknown fault {fault!r}; choose from {sorted(targets)}")
    obj, name = targets[fault]
    setattr(obj, name, boom)
