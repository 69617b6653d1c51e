"""Persistent per-rank memory terms: weights, gradients and optimizer state.

Conventions follow Megatron-LM: with bf16 (or ``accumulate_allreduce_grads_in_fp32``) the
DDP gradient buffer is fp32, else it has the parameter dtype; Adam keeps fp32 ``exp_avg`` and
``exp_avg_sq`` plus fp32 master weights under bf16/fp16; the distributed optimizer shards
all three over data parallel (the real shard includes bucket padding, not modelled here);
``torch.optim`` optimizers also keep a 4-byte ``step`` tensor per parameter tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.params import ParamTensor

FP32 = 4


@dataclass(frozen=True)
class PersistentTerms:
    """Bytes that live for the whole run on one rank."""

    param_count: int
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes


def optimizer_shards(spec: TrainingSpec) -> tuple[int, int]:
    """(dense, expert) shard counts of the distributed optimizer.

    megatron/core/distributed/distributed_data_parallel.py: dense parameters shard over the
    data-parallel group with context parallelism (dp x cp), routed experts over the
    expert-data-parallel group; with num_distributed_optimizer_instances each instance
    shards over its own part of those groups (megatron/core/parallel_state.py)."""
    p, instances = spec.parallel, spec.precision.distributed_optimizer_instances
    return p.dp * p.cp // instances, max(1, p.expert_dp // instances)


def persistent_terms(spec: TrainingSpec, params: list[ParamTensor]) -> PersistentTerms:
    """Weights, gradients and optimizer state for one rank's parameter tensors."""
    prec = spec.precision
    count = sum(t.numel for t in params)
    weights = count * prec.param_bytes
    grads = count * (FP32 if prec.grads_in_fp32 else prec.param_bytes)
    if prec.optimizer == "adam":
        per_param = 2 * FP32 + (FP32 if prec.mixed_precision else 0)
    else:
        per_param = (FP32 if prec.sgd_momentum else 0) + (FP32 if prec.mixed_precision else 0)
    optimizer = count * per_param
    if prec.distributed_optimizer:
        dense_shards, expert_shards = optimizer_shards(spec)
        expert = sum(t.numel for t in params if t.expert) * per_param
        dense = optimizer - expert
        optimizer = -(-dense // dense_shards) + -(-expert // expert_shards)
    if prec.torch_optimizer and prec.optimizer == "adam":
        optimizer += FP32 * len(params)  # one float32 ``step`` tensor per parameter tensor
    return PersistentTerms(count, weights, grads, optimizer)


def fp32_grad_copies(spec: TrainingSpec, params: list[ParamTensor]) -> int:
    """fp32 copies of 16-bit gradients the Megatron optimizer makes for its step.

    megatron/core/optimizer/optimizer.py ``_copy_model_grads_to_main_grads`` (and the
    distributed optimizer's ``_copy_model_grads_to_main_grads`` for its shard) sets each main
    parameter's ``.grad`` to ``main_grad.float()``: a no-op view when the gradient buffer is
    fp32 (bf16 training), a new fp32 tensor when it is 16-bit (fp16 without
    ``accumulate_allreduce_grads_in_fp32``). They live from the step until the next
    ``zero_grad`` at the start of the following step (never beside the activations)."""
    prec = spec.precision
    if not prec.mixed_precision or prec.grads_in_fp32 or prec.torch_optimizer:
        return 0
    count = sum(t.numel for t in params)
    if prec.distributed_optimizer:
        count = -(-count // optimizer_shards(spec)[0])
    return count * FP32
