"""Persistent per-rank memory terms: weights, gradients and optimizer state.

Conventions follow Megatron-LM: with bf16 (or ``accumulate_allreduce_grads_in_fp32``) the
DDP gradient buffer is fp32, else it has the parameter dtype; Adam keeps fp32 ``exp_avg`` and
``exp_avg_sq`` plus fp32 master weights under bf16/fp16; the distributed optimizer shards
all three over data parallel (the real shard includes bucket padding, not modelled here);
``torch.optim`` optimizers also keep a 4-byte ``step`` tensor per parameter tensor.

The precision-aware optimizer and optimizer CPU offload change the optimizer term
(:func:`adam_bytes_per_param`, :func:`gpu_share`); both are modelled from megatron-core
0.16.1's source and TE's FusedAdam / the hybrid optimizer need CUDA, so they are not
measured here.
"""

from __future__ import annotations

from dataclasses import dataclass

from memscope.analysis.static.config import STATE_DTYPE_BYTES, PrecisionSpec, TrainingSpec
from memscope.analysis.static.fsdp import Sharding, shard_bytes, sharding
from memscope.analysis.static.megatron_versions import megatron_fsdp_grad_bytes
from memscope.analysis.static.muon import is_muon, muon_optimizer_bytes
from memscope.analysis.static.params import ParamTensor

FP32 = 4


@dataclass(frozen=True)
class PersistentTerms:
    """Bytes that live for the whole run on one rank."""

    param_count: int
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    host_optimizer_bytes: int = 0  # optimizer CPU offload: state kept in host memory

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


def persistent_terms(
    spec: TrainingSpec, params: list[ParamTensor], pp_rank: int = 0
) -> PersistentTerms:
    """Weights, gradients and optimizer state for one rank's parameter tensors (on pipeline
    stage ``pp_rank``: dist_muon's bucket layout has no buckets after the first stage)."""
    prec = spec.precision
    count = sum(t.numel for t in params)
    weights = count * prec.param_bytes
    grads = count * (FP32 if prec.grads_in_fp32 else prec.param_bytes)
    if is_muon(spec):  # Muon: its own state and main-copy split (muon.py)
        return PersistentTerms(count, weights, grads, muon_optimizer_bytes(spec, params, pp_rank))
    shard = sharding(spec)
    if shard is not None:  # Megatron-FSDP / torch FSDP2 (fsdp.py)
        return _fsdp_terms(spec, params, shard)
    if prec.optimizer == "adam":
        per_param = adam_bytes_per_param(prec)
    else:
        per_param = (FP32 if prec.sgd_momentum else 0) + (FP32 if prec.mixed_precision else 0)
    optimizer = count * per_param
    if prec.distributed_optimizer:
        dense_shards, expert_shards = optimizer_shards(spec)
        expert = sum(t.numel for t in params if t.expert) * per_param
        dense = optimizer - expert
        optimizer = -(-dense // dense_shards) + -(-expert // expert_shards)
    host = 0
    if prec.optimizer_cpu_offload:
        on_gpu = int(optimizer * gpu_share(prec))
        optimizer, host = on_gpu, optimizer - on_gpu
    if prec.torch_optimizer and prec.optimizer == "adam":
        optimizer += FP32 * len(params)  # one float32 ``step`` tensor per parameter tensor
    return PersistentTerms(count, weights, grads, optimizer, host)


def _fsdp_terms(spec: TrainingSpec, params: list[ParamTensor], shard: Sharding) -> PersistentTerms:
    """Weights, gradients and main weights + optimizer state under FSDP, each whole or the
    rank's data-parallel share as :func:`.fsdp.sharding` says. torch FSDP2 keeps the
    gradients in the parameter dtype (its sharded ``param.grad``; Megatron's fp32 main-grad
    buffer belongs to its DDP)."""
    prec = spec.precision
    count = sum(t.numel for t in params)
    grad_dtype = prec.param_bytes if spec.torch_fsdp2 else megatron_fsdp_grad_bytes(spec)
    per_param = (
        adam_bytes_per_param(prec)
        if prec.optimizer == "adam"
        else (FP32 if prec.sgd_momentum else 0) + (FP32 if prec.mixed_precision else 0)
    )

    def held(per_element: float, sharded: bool) -> int:
        return shard_bytes(spec, params, per_element) if sharded else int(count * per_element)

    return PersistentTerms(
        count,
        held(prec.param_bytes, shard.params),
        held(grad_dtype, shard.grads),
        held(per_param, shard.optimizer),
    )


def adam_bytes_per_param(prec: PrecisionSpec) -> int:
    """Bytes of Adam state per parameter element (before the distributed optimizer shards it).

    Default: fp32 ``exp_avg`` and ``exp_avg_sq`` plus, under bf16/fp16, the distributed (or
    Float16) optimizer's fp32 main-parameter shard (megatron/core/optimizer/distrib_optimizer.py
    ``_build_model_and_main_param_groups``: ``shard_model_param.clone().float()``).

    ``use_precision_aware_optimizer`` (megatron/core/optimizer/__init__.py
    ``_get_megatron_optimizer_based_on_param_groups``): TE's FusedAdam gets ``exp_avg_dtype`` /
    ``exp_avg_sq_dtype``, and, when ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``
    (optimizer_config.py; always without FP8), ``master_weights=True`` with
    ``master_weight_dtype=main_params_dtype`` while the distributed optimizer keeps no main
    parameter of its own (``shard_main_param = None``). The master weight is an int16
    remainder (2 bytes) with ``store_param_remainders`` under bf16 (distrib_optimizer.py's
    state layout: ``init_shard(torch.int16)``), else ``main_params_dtype``; fp32 parameters
    need none.

    ``optimizer_cpu_offload``: the hybrid optimizer (megatron/core/optimizer/cpu_offloading/
    hybrid_optimizer.py ``_get_sub_optimizer_param_groups``, ``param_update_in_fp32=True``)
    keeps an fp32 copy of every 16-bit parameter shard and an Adam over it built without the
    precision-aware dtypes: 4 + 4 + 4 bytes, of which :func:`gpu_share` stays on the GPU."""
    master = FP32 if prec.mixed_precision else 0
    if prec.optimizer_cpu_offload or not prec.precision_aware:
        return 2 * FP32 + master
    if prec.mixed_precision:
        bf16 = prec.params_dtype in ("bfloat16", "bf16")
        fp32_main = prec.main_params_dtype == "fp32"
        remainders = prec.store_param_remainders and bf16 and fp32_main
        master = 2 if remainders else STATE_DTYPE_BYTES[prec.main_params_dtype]
    return STATE_DTYPE_BYTES[prec.exp_avg_dtype] + STATE_DTYPE_BYTES[prec.exp_avg_sq_dtype] + master


def adam_moment_bytes(spec: TrainingSpec, persistent: PersistentTerms) -> int:
    """Of ``persistent``'s GPU optimizer state, Adam's ``exp_avg`` and ``exp_avg_sq`` (and
    torch's per-tensor ``step``): what the first ``step()`` allocates (torch's and Transformer
    Engine's Adam create their state lazily; Megatron's optimizers call ``init_state_fn``
    only when loading a checkpoint). 0 for other optimizers and sharded (FSDP) state."""
    prec = spec.precision
    if prec.optimizer != "adam" or is_muon(spec) or sharding(spec) is not None:
        return 0
    moments = 2 * FP32  # (as adam_bytes_per_param counts them)
    if prec.precision_aware and not prec.optimizer_cpu_offload:
        moments = STATE_DTYPE_BYTES[prec.exp_avg_dtype] + STATE_DTYPE_BYTES[prec.exp_avg_sq_dtype]
    return persistent.optimizer_bytes * moments // adam_bytes_per_param(prec)


def gpu_share(prec: PrecisionSpec) -> float:
    """Share of the optimizer's state left on the GPU by ``optimizer_cpu_offload``.

    hybrid_optimizer.py ``_get_sub_optimizer_param_groups`` moves parameters to pinned host
    copies (with their fp32 copies and Adam state) in order until ``offload_fraction`` of
    the GPU parameters' elements is reached (whole tensors, so slightly more than the
    fraction); the rest is updated on the GPU. Modelled as exactly ``1 - fraction``."""
    return 1.0 - prec.optimizer_offload_fraction if prec.optimizer_cpu_offload else 1.0


def fp32_grad_copies(spec: TrainingSpec, params: list[ParamTensor]) -> int:
    """fp32 copies of 16-bit gradients the Megatron optimizer makes for its step.

    megatron/core/optimizer/optimizer.py ``_copy_model_grads_to_main_grads`` (and the
    distributed optimizer's ``_copy_model_grads_to_main_grads`` for its shard) sets each main
    parameter's ``.grad`` to ``main_grad.float()``: a no-op view when the gradient buffer is
    fp32 (bf16 training), a new fp32 tensor when it is 16-bit (fp16 without
    ``accumulate_allreduce_grads_in_fp32``). They live from the step until the next
    ``zero_grad`` at the start of the following step (never beside the activations).
    The precision-aware optimizer makes none; optimizer CPU offload makes them for the
    parameters it updates on the GPU (hybrid_optimizer.py ``_set_sub_optimizer_grads``)."""
    prec = spec.precision
    if spec.torch_fsdp2 and prec.mixed_precision:  # ``.float()`` of each 16-bit grad shard
        return shard_bytes(spec, params, FP32)
    if not prec.mixed_precision or prec.grads_in_fp32 or prec.torch_optimizer:
        return 0
    if prec.precision_aware and not prec.optimizer_cpu_offload:
        return 0  # TE's FusedAdam reads the 16-bit ``decoupled_grad`` in its kernel
    count = sum(t.numel for t in params)
    if prec.distributed_optimizer:
        count = -(-count // optimizer_shards(spec)[0])
    # the hybrid optimizer's ``fp32_param.grad = grad.to(fp32)`` for its GPU share
    return int(count * gpu_share(prec)) * FP32
