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

From megatron-core 0.18 (:data:`.megatron_versions.LAYER_WISE_PARAM_LAYOUT`) Megatron-LM
(``megatron/training/training.py`` ``wrap_model_chunks_with_ddp``, unless
``--no-use-layer-wise-param-layout``) wraps the model in DDP with
``use_distributed_optimizer`` and a ``full_param_layout`` from
``LayerWiseDistributedOptimizer.compute_full_param_layout``: the Muon tensors get buffers of
their own whose buckets are bin-packed, whole tensors per data-parallel shard
(:func:`bucket_layout_owned`), and ``shard_params`` (``_shard_params_from_layout``) gives a
rank the tensors in its shard of every bucket; the other tensors go to a separate
``DistributedOptimizer`` (``optimizer/__init__.py``), which byte-shards their Adam state. The
updated parameters are all-gathered in place in the DDP parameter buffer
(``use_buffer_param_sync``), so no flat gather buffers. Not counted: the layout's padding of
the gradient and parameter buffers (the shards are padded to the largest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memscope.analysis.static.megatron_versions import LAYER_WISE_PARAM_LAYOUT, at_least

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


def pad_to(value: int, divisor: int) -> int:
    """``optimizer/param_layout.py`` ``pad_to_divisor``."""
    return -(-value // divisor) * divisor


def uses_bucket_layout(spec: TrainingSpec) -> bool:
    """Whether ``dist_muon`` shards by the DDP bucket layout (0.18+, the default
    ``use_layer_wise_param_layout``, more than one data-parallel rank: ``shard_params``
    shards nothing over one)."""
    p = spec.parallel
    return (
        spec.precision.optimizer == "dist_muon"
        and spec.precision.layer_wise_param_layout
        and at_least(spec.model, LAYER_WISE_PARAM_LAYOUT)
        and p.dp * p.cp > 1
    )


def ddp_bucket_size(spec: TrainingSpec, pp_rank: int, chunk: int) -> int | None:
    """Elements per DDP bucket of virtual chunk ``chunk`` (``None``: one bucket).

    Megatron-LM ``megatron/training/training.py`` ``resolve_ddp_bucket_size``:
    ``--ddp-bucket-size``, else ``max(40_000_000, 1_000_000 * dp_cp)``; ``None`` without
    ``--overlap-grad-reduce``. ``get_model`` disables bucketing for every chunk but the first
    and on pipeline stages after the first (as ``DistributedDataParallel.__init__`` does)."""
    prec, p = spec.precision, spec.parallel
    if not prec.overlap_grad_reduce or chunk > 0 or pp_rank > 0:
        return None
    return prec.ddp_bucket_size or max(40_000_000, 1_000_000 * p.dp * p.cp)


def bucket_layout_owned(
    tensors: list[ParamTensor], ranks: int, bucket_size: int | None
) -> list[list[ParamTensor]]:
    """The tensors of one Muon buffer (model order) in each data-parallel shard.

    ``LayerWiseDistributedOptimizer._compute_per_buffer_param_layout``: walk the tensors in
    backprop (reverse) order into a chunk until it holds ``max(bucket_size, int(ranks *
    largest * 0.9))`` elements, then bin-pack the chunk: largest first (a stable sort), each
    to the shard with the smallest cursor (the first such), its start padded to 64 elements
    (``param_layout.pad_param_start``). Tied embeddings (``shared_embedding``) get a bucket
    of their own, but they are tagged ``is_embedding_or_output_parameter``: not Muon's."""
    shards: list[list[ParamTensor]] = [[] for _ in range(ranks)]

    def emit(chunk: list[ParamTensor]) -> None:
        cursors = [0] * ranks
        for t in sorted(chunk, key=lambda t: -t.numel):
            least = min(range(ranks), key=lambda s: cursors[s])
            cursors[least] = pad_to(cursors[least], 64) + t.numel
            shards[least].append(t)

    chunk: list[ParamTensor] = []
    numel = largest = 0
    for t in reversed(tensors):
        chunk.append(t)
        numel += t.numel
        largest = max(largest, t.numel)
        if bucket_size is not None and numel >= max(bucket_size, int(ranks * largest * 0.9)):
            emit(chunk)
            chunk, numel, largest = [], 0, 0
    if chunk:
        emit(chunk)
    return shards


def _chunks(params: list[ParamTensor]) -> list[list[ParamTensor]]:
    """A rank's tensors by virtual chunk (:func:`.params.rank_params` prefixes ``chunkN.``)."""
    out: dict[str, list[ParamTensor]] = {}
    for t in params:
        head = t.name.split(".", 1)[0]
        out.setdefault(head if head.startswith("chunk") else "", []).append(t)
    return list(out.values())


def _layout_bytes(spec: TrainingSpec, params: list[ParamTensor], pp_rank: int) -> int:
    """Main copies and state under the bucket layout on the data-parallel rank that keeps
    the most: its Muon shards of every chunk's dense and expert buffers (the two have their
    own ranks), plus a byte shard of the rest's Adam state (``DistributedOptimizer`` over
    dp x cp)."""
    total = 0
    for kind in (False, True):
        ranks = max(1, spec.parallel.expert_dp) if kind else spec.parallel.dp * spec.parallel.cp
        per_rank = [0] * ranks
        for i, chunk in enumerate(_chunks(params)):
            muon = [t for t in chunk if muon_managed(t) and t.expert == kind]
            size = ddp_bucket_size(spec, pp_rank, i)
            for r, owned in enumerate(bucket_layout_owned(muon, ranks, size)):
                per_rank[r] += sum(t.numel * _state_bytes(spec, t) for t in owned)
        total += max(per_rank)
    p = spec.parallel
    adam = sum(t.numel * _state_bytes(spec, t) for t in params if not muon_managed(t))
    return total + -(-adam // (p.dp * p.cp))


def _groups(spec: TrainingSpec, params: list[ParamTensor]) -> list[tuple[list[ParamTensor], int]]:
    """(tensors, data-parallel ranks sharing them): dense over dp x cp, experts over the
    expert-data-parallel group (megatron-core ``pg_collection.dp_cp`` / ``expt_dp``)."""
    p = spec.parallel
    dense = [t for t in params if not t.expert]
    expert = [t for t in params if t.expert]
    return [(dense, p.dp * p.cp), (expert, max(1, p.expert_dp))]


def muon_optimizer_bytes(spec: TrainingSpec, params: list[ParamTensor], pp_rank: int = 0) -> int:
    """Main copies and state on this rank; under ``dist_muon`` the most any data-parallel
    rank of this position keeps (whole tensors make the shares uneven)."""
    if spec.precision.optimizer == "muon":
        return sum(t.numel * _state_bytes(spec, t) for t in params)
    if uses_bucket_layout(spec):
        return _layout_bytes(spec, params, pp_rank)
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
    gather = 0  # the bucket layout all-gathers in place in DDP's parameter buffer
    if spec.precision.optimizer == "dist_muon" and not uses_bucket_layout(spec):
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
    m = spec.model
    if uses_bucket_layout(spec) and m.num_experts and m.add_bias_linear:
        # optimizer/__init__.py: the separate DistributedOptimizer of the layout path asserts
        # that no expert-parallel group is Adam's (the experts' biases would be)
        raise ValueError(
            "dist_muon's layer-wise parameter layout does not support expert biases in "
            f"megatron-core {m.megatron_core_version} (set no_use_layer_wise_param_layout)"
        )
