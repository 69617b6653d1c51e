"""The Muon optimizer (``--optimizer muon``) and its layer-wise distributed variant
(``--optimizer dist_muon``): optimizer state and step temporaries, from megatron-core 0.16.1
``megatron/core/optimizer/muon.py`` (``get_megatron_muon_optimizer``) and
``megatron/core/optimizer/layer_wise_optimizer.py`` (``LayerWiseDistributedOptimizer``).

Which tensors Muon updates: every 2-D parameter not tagged ``is_embedding_or_output_parameter``
(the pre_process chunk's word embedding and the post_process chunk's output layer); norms,
biases and those two go to Adam (``get_megatron_optimizer`` on what Muon leaves). Muon keeps one
``momentum_buffer`` per tensor (``muon_init_state_fn``: ``zeros_like`` of the fp32 main
parameter), Adam its two moments; under bf16 ``Float16OptimizerWithFloat16Params`` keeps an
fp32 main copy of every parameter. The distributed optimizer and fp16 are refused by Megatron.

``dist_muon``: ``LayerWiseDistributedOptimizer.shard_params`` sorts all of a rank's tensors by
size and deals whole tensors to the data-parallel (x context-parallel) ranks in a ping-pong
order (expert tensors over the expert-data-parallel ranks); a rank keeps main copies and state
only for its own tensors (the Float16 wrapper is applied after sharding), the gradients stay
whole (Megatron DDP all-reduces them). After the step ``allgather_params`` all-gathers every
rank's updated tensors: a flat buffer of the group's tensors plus the rank's own flattened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec
    from memscope.analysis.static.params import ParamTensor

FP32 = 4
MUON_OPTIMIZERS = ("muon", "dist_muon")
MUON_TP_MODES = ("blockwise", "duplicated", "distributed")  # OptimizerConfig.muon_tp_mode


def is_muon(spec: TrainingSpec) -> bool:
    return spec.precision.optimizer in MUON_OPTIMIZERS


def muon_managed(t: ParamTensor) -> bool:
    """Whether Muon (not Adam) updates ``t`` (``get_megatron_muon_optimizer``'s split)."""
    return t.ndim == 2 and not t.embedding_or_output


def _state_bytes(spec: TrainingSpec, t: ParamTensor) -> int:
    """Main copy plus optimizer state of one tensor, per element."""
    master = FP32 if spec.precision.mixed_precision else 0
    return (FP32 if muon_managed(t) else 2 * FP32) + master


def layer_wise_owned(params: list[ParamTensor], ranks: int, rank: int) -> list[ParamTensor]:
    """The tensors data-parallel rank ``rank`` of ``ranks`` updates under ``dist_muon``.

    ``shard_params`` deals the tensors, sorted by size (a stable sort over the Muon group
    first, then Adam's), to ranks ``0 .. ranks-1, ranks-1 .. 0`` in turn."""
    if ranks == 1:
        return list(params)
    order = sorted(
        [t for t in params if muon_managed(t)] + [t for t in params if not muon_managed(t)],
        key=lambda t: t.numel,
    )
    loop = list(range(ranks)) + list(range(ranks))[::-1]
    return [t for i, t in enumerate(order) if loop[i % len(loop)] == rank]


def _groups(spec: TrainingSpec, params: list[ParamTensor]) -> list[tuple[list[ParamTensor], int]]:
    """(tensors, data-parallel ranks sharing them): dense over dp x cp, experts over the
    expert-data-parallel group (megatron-core ``pg_collection.dp_cp`` / ``expt_dp``)."""
    p = spec.parallel
    dense = [t for t in params if not t.expert]
    expert = [t for t in params if t.expert]
    return [(dense, p.dp * p.cp), (expert, max(1, p.expert_dp))]


def muon_optimizer_bytes(spec: TrainingSpec, params: list[ParamTensor]) -> int:
    """Main copies and state on this rank; under ``dist_muon`` the most any data-parallel
    rank of this position keeps (whole tensors make the shares uneven)."""
    if spec.precision.optimizer == "muon":
        return sum(t.numel * _state_bytes(spec, t) for t in params)
    total = 0
    for tensors, ranks in _groups(spec, params):
        total += max(
            (
                sum(t.numel * _state_bytes(spec, t) for t in layer_wise_owned(tensors, ranks, r))
                for r in range(ranks)
            ),
            default=0,
        )
    return total


def muon_step_bytes(spec: TrainingSpec, params: list[ParamTensor], tp_mode: str) -> int:
    """Temporaries of the step: the larger of Newton-Schulz on the largest Muon tensor and,
    under ``dist_muon``, the parameter all-gather after it.

    muon.py ``scaled_orthogonalize_fn`` returns ``orth_grad * scale_factor *
    extra_scale_factor``: with the fp32 orthogonalised matrix, two more fp32 copies of it
    exist at that line (12 bytes per element); Newton-Schulz's own iterates are bf16 (fp32
    matmul precision "medium") and its Gram matrices ``[m, m]`` with ``m`` the smaller side,
    below that. ``muon_tp_mode`` "duplicated" all-gathers the tensor-parallel shards and
    orthogonalises the whole matrix on every rank (emerging_optimizers ``newton_schulz_tp``),
    so the full matrix counts; "blockwise" (Megatron's default) and "distributed" keep the
    shard. Only tensors with a rank of their own are updated by ``dist_muon``."""
    p = spec.parallel
    largest = 0  # whichever rank is dealt the largest Muon tensor
    for t in params:
        if not muon_managed(t):
            continue
        shards = p.expert_tp if t.expert else p.tp
        full = t.numel * shards if tp_mode == "duplicated" and ".router." not in t.name else t.numel
        largest = max(largest, full)
    newton_schulz = 3 * FP32 * largest
    gather = 0
    if spec.precision.optimizer == "dist_muon":
        for tensors, ranks in _groups(spec, params):
            if ranks > 1:
                own = max(sum(t.numel for t in layer_wise_owned(tensors, ranks, r))
                          for r in range(ranks))  # fmt: skip
                gather = max(gather, sum(t.numel for t in tensors) + own)
        gather *= spec.precision.param_bytes
    return max(newton_schulz, gather)


def validate_muon(spec: TrainingSpec) -> None:
    """What megatron-core 0.16.1 ``get_megatron_muon_optimizer`` refuses."""
    prec = spec.precision
    if prec.muon_tp_mode not in MUON_TP_MODES:
        raise ValueError(f"muon_tp_mode must be one of {', '.join(MUON_TP_MODES)}")
    if not is_muon(spec):
        return
    if prec.distributed_optimizer:
        raise ValueError(
            "muon with use_distributed_optimizer is not supported by megatron-core "
            "(use --optimizer dist_muon, the layer-wise distributed variant)"
        )
    if prec.params_dtype in ("float16", "fp16"):
        raise ValueError("muon with fp16 is not supported by megatron-core (use bf16)")
