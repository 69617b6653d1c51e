"""Megatron's parallel arguments -> the spec's ``ParallelSpec``: the sizes, the data-parallel
size a world size implies, virtual stages and the layer split."""

from __future__ import annotations

import math
import warnings
from typing import Any

from memscope.analysis.static.config import ParallelSpec
from memscope.analysis.static.pipeline_layout import layout_vpp, parse_layout
from memscope.analysis.static.validation import show
from memscope.inputs.args_access import get, get_flag, get_int, get_int_tuple, get_size
from memscope.inputs.values import as_int, as_str, label

CP_COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")


def parallel_spec(args: Any, tp: int, num_layers: int) -> ParallelSpec:
    """The parallel layout: sizes, data parallelism, virtual stages and the layer split."""
    pp = get_size(args, "pipeline_model_parallel_size")
    cp = get_size(args, "context_parallel_size")
    ep = get_size(args, "expert_model_parallel_size")
    etp = _expert_tp(args, tp)
    dp = _data_parallel(args, tp, pp, cp, ep, etp or tp)
    vpp, layout = _virtual_stages(args, num_layers, pp)
    return ParallelSpec(
        layout=layout,
        tp=tp,
        pp=pp,
        dp=int(dp),
        cp=cp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        sequence_parallel=get_flag(args, "sequence_parallel") and tp > 1,
        first_stage_layers=get_int(args, "decoder_first_pipeline_num_layers"),
        last_stage_layers=get_int(args, "decoder_last_pipeline_num_layers"),
        stage_layers=get_int_tuple(args, "hetero_stage_layers"),
        stage_meshes=stage_meshes(args),
        account_for_embedding=get_flag(args, "account_for_embedding_in_pipeline_split"),
        account_for_loss=get_flag(args, "account_for_loss_in_pipeline_split"),
        microbatch_group_size=get_int(args, "microbatch_group_size_per_vp_stage"),
        moe_a2a_overlap=get_flag(args, "overlap_moe_expert_parallel_comm"),
        overlap_p2p_comm=get_flag(args, "overlap_p2p_comm", True),  # Megatron-LM's default
        cp_comm_type=_cp_comm_type(args) if cp > 1 else "p2p",
        dp_assumed=_dp_assumed(args),
    )


def _expert_tp(args: Any, tp: int) -> int | None:
    """``expert_tensor_parallel_size``; None when it is tp (``ParallelSpec.expert_tp``):
    Megatron-LM 0.19's validate_args fills the default in for every model, 0.15.0rc5's leaves
    it None (both: megatron/training/arguments.py), so one command line reads the same from
    either."""
    etp = get_int(args, "expert_tensor_parallel_size", None, label("expert_tensor_parallel_size"))
    if etp is not None and etp < 1:
        raise ValueError(f"parallel.etp (expert_tensor_parallel_size) must be >= 1, got {etp}")
    return None if etp == tp else etp


def _dp_assumed(args: Any) -> bool:
    """Whether nothing gives the data-parallel size (the least EP allows is assumed)."""
    return (
        get(args, "data_parallel_size") is None
        and get(args, "world_size") is None
        and get(args, "hetero_stage_meshes") is None
    )


def _data_parallel(args: Any, tp: int, pp: int, cp: int, ep: int, etp: int) -> int:
    """``data_parallel_size``, else world / (tp pp cp); else the least that EP allows
    (tp x cp x dp must be a multiple of etp x ep), 1 without experts.

    megatron-core's ``initialize_model_parallel`` (megatron/core/parallel_state.py) requires
    world_size % (tp x pp x cp) == 0 (dp is the quotient) and world_size % (etp x ep x pp)
    == 0, i.e. etp x ep dividing tp x cp x dp (checked by :func:`.validate_moe`)."""
    dp = get(args, "data_parallel_size")
    world = get_int(args, "world_size", None, "parallel.world_size (world_size)")
    if world is not None and world < 1:
        raise ValueError(f"parallel.world_size (world_size) must be >= 1, got {world}")
    hetero = get(args, "hetero_stage_meshes") is not None or get(args, "enable_hetero")
    if dp is not None:
        dp = as_int(dp, label("data_parallel_size"), minimum=1)
        if world is not None and not hetero and world != tp * pp * cp * dp:
            raise ValueError(
                f"parallel.world_size (world_size) {world} is not tp x pp x cp x dp "
                f"({tp} x {pp} x {cp} x {dp})"
            )
        return dp
    if world is not None:
        if world % (tp * pp * cp):
            raise ValueError(
                f"parallel.world_size (world_size) {world} is not a multiple of tp x pp x cp "
                f"({tp} x {pp} x {cp}) (megatron-core initialize_model_parallel)"
            )
        return world // (tp * pp * cp)
    experts = etp * ep
    return experts // math.gcd(tp * cp, experts)  # the least dp with tp cp dp % (etp ep) == 0


def _virtual_stages(
    args: Any, num_layers: int, pp: int
) -> tuple[int | None, tuple[str, ...] | None]:
    """(vpp, layout): ``virtual_pipeline_model_parallel_size``, else what
    ``num_virtual_stages_per_pipeline_rank``, ``num_layers_per_virtual_pipeline_stage`` or
    ``pipeline_model_parallel_layout`` imply (megatron/training/arguments.py accepts one)."""
    vpp = get_int(args, "virtual_pipeline_model_parallel_size", None, "parallel.vpp")
    per_vstage = get_int(args, "num_layers_per_virtual_pipeline_stage")
    stages = get_int(args, "num_virtual_stages_per_pipeline_rank")
    if per_vstage and stages:
        raise ValueError(
            "num_layers_per_virtual_pipeline_stage and num_virtual_stages_per_pipeline_rank "
            "are exclusive (Megatron accepts one of them)"
        )
    if vpp is None and stages:
        vpp = stages
    if vpp is None and per_vstage:
        if per_vstage < 1 or num_layers // pp < per_vstage:
            raise ValueError(
                f"num_layers_per_virtual_pipeline_stage ({per_vstage}) must be in 1..the "
                f"layers per pipeline stage ({num_layers // pp})"
            )
        vpp = num_layers // (pp * per_vstage)
    layout = _pipeline_layout(args, pp)
    if layout is not None:
        if per_vstage or stages:
            raise ValueError(
                "pipeline_model_parallel_layout cannot be combined with "
                "num_layers_per_virtual_pipeline_stage / num_virtual_stages_per_pipeline_rank"
            )
        vpp = vpp if vpp is not None else layout_vpp(layout, pp)
    return vpp, layout


def _pipeline_layout(args: Any, pp: int) -> tuple[str, ...] | None:
    """``pipeline_model_parallel_layout`` as its flat stages: a string (Megatron-LM's
    ``--pipeline-model-parallel-layout``) or megatron-core's list of per-stage lists."""
    value = get(args, "pipeline_model_parallel_layout")
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        names = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}  # LayerType
        rows = []
        for row in value:
            if not isinstance(row, (list, tuple)):
                raise ValueError("pipeline_model_parallel_layout: expected a list of lists")
            keys = [str(getattr(x, "name", x)).strip().lower() for x in row]
            for key in keys:
                if key not in names:
                    raise ValueError(
                        f"pipeline_model_parallel_layout: {show(key)} is not one of "
                        f"{', '.join(names)}"
                    )
            rows.append("".join(names[k] for k in keys))
        value = "|".join(rows)
    text = as_str(value, "pipeline_model_parallel_layout")
    stages = parse_layout(text)
    if len(stages) % pp:
        raise ValueError(
            f"pipeline_model_parallel_layout: {len(stages)} stages are not divisible by "
            f"parallel.pp ({pp})"
        )
    return stages


def _cp_comm_type(args: Any) -> str:
    """Megatron's ``cp_comm_type``: one value (default ``p2p``) or one per layer
    (megatron/training/arguments.py); a per-layer list mixing kinds is estimated with one of
    them (the first in :data:`CP_COMM_TYPES` order) for every layer, and a warning says so."""
    raw = get(args, "cp_comm_type", "p2p")
    values = [as_str(v, "cp_comm_type") for v in (raw if isinstance(raw, (list, tuple)) else [raw])]
    for v in values:
        if v not in CP_COMM_TYPES:
            raise ValueError(f"cp_comm_type: {v!r} is not one of {', '.join(CP_COMM_TYPES)}")
    kinds = sorted(set(values), key=CP_COMM_TYPES.index)
    if len(kinds) > 1:
        warnings.warn(
            f"cp_comm_type differs per layer ({', '.join(kinds)}): every layer is estimated "
            f"with {kinds[0]}",
            stacklevel=2,
        )
    return kinds[0] if kinds else "p2p"


def stage_meshes(args: Any) -> tuple[tuple[int, int], ...] | None:
    value = get(args, "hetero_stage_meshes")
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in value
    ):
        raise ValueError(
            f"hetero_stage_meshes: expected a list of (tp, dp) pairs, got {show(value)}"
        )
    return tuple(
        (as_int(tp, "hetero_stage_meshes", 1), as_int(dp, "hetero_stage_meshes", 1))
        for tp, dp in value
    )
