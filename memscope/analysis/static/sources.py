"""Where a :class:`~.config.TrainingSpec` comes from: Megatron args, FlagScale YAML, JSON.

Megatron's argument names are the lingua franca: a FlagScale training YAML is its
``system``/``model``/``data`` sections merged (as the FlagScale runner does before turning
them into ``--flags``), and the original MemScope JSON config is flattened through a few
aliases. Every problem is a ``ValueError`` that names the field.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import warnings
from dataclasses import replace
from typing import Any

from memscope.analysis.static.config import (
    DTYPE_BYTES,
    UNSUPPORTED,
    ModelSpec,
    ParallelSpec,
    PrecisionSpec,
    TrainingSpec,
    padded_vocab_size,
)
from memscope.analysis.static.distillation import distillation_from_args
from memscope.analysis.static.flagscale_checks import (
    VISION_KEYS,
    apply_hetero,
    entrypoint_refusal,
    eval_layer_pattern,
    megatron_defaults,
    refuse_non_gpt,
)
from memscope.analysis.static.flagscale_experiment import (
    read_yaml,
    runner_world_size,
    train_config_of,
)
from memscope.analysis.static.fp8 import quant_from_args
from memscope.analysis.static.pipeline_layout import layout_vpp, parse_layout
from memscope.analysis.static.validation import (
    MAX_LAYERS,
    MAX_NESTING,
    NEGATED_FLAGS,
    READ_KEYS,
    ConfigWarning,
    YamlRefusal,
    as_bool,
    as_float,
    as_int,
    as_int_list,
    as_str,
    check_batch,
    label,
    load_yaml,
    read_config_text,
    show,
    unknown_key_warnings,
)


def _get(src: Any, name: str, default: Any = None) -> Any:
    value = src.get(name, default) if isinstance(src, dict) else getattr(src, name, default)
    return default if value is None else value


def _int(src: Any, name: str, default: Any = None, field: str | None = None) -> Any:
    """``src.name`` as an int (``default`` when absent); anything else raises naming it."""
    value = _get(src, name, default)
    return None if value is None else as_int(value, field or label(name))


def _size(src: Any, name: str, default: int = 1) -> int:
    """A parallel size: an integer >= 1."""
    return as_int(_get(src, name, default), label(name), minimum=1)


def _flag(src: Any, name: str, default: bool = False) -> bool:
    return as_bool(_get(src, name, default), name)


def _float(src: Any, name: str, default: float, low: float, high: float | None = None) -> float:
    field = f"model.{name}" if name.endswith("dropout") else name
    return as_float(_get(src, name, default), field, low, high)


def _pipeline_layout(args: Any, pp: int) -> tuple[str, ...] | None:
    """``pipeline_model_parallel_layout`` as its flat stages: a string (Megatron-LM's
    ``--pipeline-model-parallel-layout``) or megatron-core's list of per-stage lists."""
    value = _get(args, "pipeline_model_parallel_layout")
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


def _name(src: Any, name: str, default: str) -> str:
    return as_str(_get(src, name, default), name)


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (
        isinstance(value, str) and value.strip().lstrip("+-").isdigit()
    )


def _vocab(args: Any, tp: int, vocab_size: int | None) -> int:
    """The padded vocabulary: ``padded_vocab_size``, else ``vocab_size`` (or the caller's,
    for a tokenizer-defined vocabulary) padded as Megatron does."""
    padded = _int(args, "padded_vocab_size", None, "model.padded_vocab_size")
    if padded is not None:
        return int(padded)
    raw = _get(args, "vocab_size")
    if raw is not None and not isinstance(raw, str):
        raw = as_int(raw, "model.vocab_size")  # a string may be a tokenizer placeholder
    if raw is None or not _is_int(raw):
        if vocab_size is None:
            given = f" (the config has the placeholder {show(raw)})" if raw is not None else ""
            raise ValueError(
                f"model.vocab_size: not given{given}; the tokenizer defines it -- pass "
                "--vocab-size (vocab_size=) with the tokenizer's unpadded vocabulary size"
            )
        raw = vocab_size
    raw = as_int(raw, "model.vocab_size")
    divisible = _size(args, "make_vocab_size_divisible_by", 128)
    for stage_tp, _ in _stage_meshes(args) or ():  # hetero: every stage's tp must divide it
        tp = math.lcm(tp, max(stage_tp, 1))
    return padded_vocab_size(raw, divisible, tp) if _flag(args, "pad_vocab", True) else raw


CP_COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")
DISPATCHERS = ("allgather", "alltoall", "flex")
AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")


def _choice(args: Any, name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _name(args, name, default)
    if value not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(choices)}")
    return value


def _router_dtype(args: Any) -> str | None:
    """``moe_router_dtype``: fp32 / fp64, or None (the activation dtype)."""
    value = _get(args, "moe_router_dtype")
    if value is None or str(value).lower() in ("none", "null", ""):
        return None
    value = as_str(value, "moe_router_dtype")
    if value not in ("fp32", "fp64"):
        raise ValueError(f"moe_router_dtype: {value!r} is not one of fp32, fp64")
    return value


def _aux_loss_enabled(args: Any) -> bool:
    """Megatron's ``Router.is_aux_loss_enabled`` (megatron/core/transformer/moe/router.py): a
    load-balancing type among aux_loss / seq_aux_loss / global_aux_loss whose
    ``moe_aux_loss_coeff`` (one per type when a list) is positive."""
    types_ = _get(args, "moe_router_load_balancing_type", "aux_loss")
    coeffs = _get(args, "moe_aux_loss_coeff", 0.0)
    types_ = list(types_) if isinstance(types_, (list, tuple)) else [types_]
    coeffs = list(coeffs) if isinstance(coeffs, (list, tuple)) else [coeffs] * len(types_)
    return any(
        str(t) in AUX_LOSS_TYPES and as_float(c, "moe_aux_loss_coeff", 0.0) > 0
        for t, c in zip(types_, coeffs, strict=False)
    )


def _capacity_factor(args: Any) -> float | None:
    value = _get(args, "moe_expert_capacity_factor")
    if value is None:
        return None
    return as_float(value, "moe_expert_capacity_factor")


def _cp_comm_type(args: Any) -> str:
    """Megatron's ``cp_comm_type``: one value (default ``p2p``) or one per layer
    (megatron/training/arguments.py); a per-layer list mixing kinds is estimated with one of
    them (the first in :data:`CP_COMM_TYPES` order) for every layer, and a warning says so."""
    raw = _get(args, "cp_comm_type", "p2p")
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


def _moe_pattern(args: Any, num_layers: int) -> tuple[int, ...] | None:
    """Megatron's ``moe_layer_freq``: N (one MoE layer every N, from layer 0), ``"N"``, or a
    list / list expression with one 0 (dense) or 1 (MoE) per layer."""
    if not _int(args, "num_experts", None, "model.num_experts"):
        return None
    freq = _get(args, "moe_layer_freq", 1)
    if isinstance(freq, str) and "[" in freq:
        freq = eval_layer_pattern(freq)
    if isinstance(freq, (list, tuple)):
        return tuple(as_int_list(freq, "moe_layer_freq"))
    n = as_int(freq, "moe_layer_freq")
    if n < 1:
        raise ValueError(f"moe_layer_freq: must be >= 1, got {n}")
    return tuple(1 if i % n == 0 else 0 for i in range(num_layers))


def _fsdp_grads_dtype(args: Any) -> str | None:
    """``megatron_fsdp_main_grads_dtype`` (Megatron-LM 0.19 arguments.py): None for ``auto``."""
    value = _get(args, "megatron_fsdp_main_grads_dtype")
    if value is None or str(value) == "auto":
        return None
    if str(value) not in ("fp32", "bf16", "fp16"):
        raise ValueError(
            f"megatron_fsdp_main_grads_dtype: one of fp32, bf16, fp16, auto; got {value!r}"
        )
    return str(value)


def _installed_megatron_core() -> str | None:
    """The installed megatron-core's version: the one that builds the model where the spec is
    read in the run (memscope/analysis/static/megatron_versions.py); None when absent."""
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None


def _expert_fields(args: Any, num_layers: int) -> dict[str, Any]:
    """ModelSpec's MoE, MLA and MTP fields from Megatron's argument names."""
    experts = _int(args, "num_experts", None, "model.num_experts")
    if experts is not None and experts < 1:
        raise ValueError(f"model.num_experts must be >= 1, got {experts}")
    out: dict[str, Any] = dict(
        num_experts=experts,
        moe_ffn_hidden_size=_int(args, "moe_ffn_hidden_size", None, "model.moe_ffn_hidden_size"),
        moe_shared_expert_intermediate_size=_int(args, "moe_shared_expert_intermediate_size"),
        moe_layer_pattern=_moe_pattern(args, num_layers),
        moe_router_topk=_int(args, "moe_router_topk", 2, "model.moe_router_topk"),
        moe_grouped_gemm=_flag(args, "moe_grouped_gemm"),
        moe_use_legacy_grouped_gemm=_flag(args, "moe_use_legacy_grouped_gemm"),
        moe_router_enable_expert_bias=_flag(args, "moe_router_enable_expert_bias"),
        moe_token_dispatcher=_choice(args, "moe_token_dispatcher_type", "allgather", DISPATCHERS),
        moe_router_dtype=_router_dtype(args),
        moe_router_score_function=_choice(
            args, "moe_router_score_function", "softmax", ("softmax", "sigmoid")
        ),
        moe_aux_loss=_aux_loss_enabled(args),
        moe_z_loss=_get(args, "moe_z_loss_coeff") is not None,
        moe_expert_capacity_factor=_capacity_factor(args),
        moe_pad_expert_input_to_capacity=_flag(args, "moe_pad_expert_input_to_capacity"),
        moe_permute_fusion=_flag(args, "moe_permute_fusion"),
        moe_shared_expert_overlap=_flag(args, "moe_shared_expert_overlap"),
        moe_token_imbalance=_float(args, "moe_token_imbalance", 1.0, 1.0),
        multi_latent_attention=_flag(args, "multi_latent_attention"),
        q_lora_rank=_int(args, "q_lora_rank"),
        kv_lora_rank=_int(args, "kv_lora_rank", 32),
        qk_head_dim=_int(args, "qk_head_dim", 128),
        qk_pos_emb_head_dim=_int(args, "qk_pos_emb_head_dim", 64),
        v_head_dim=_int(args, "v_head_dim", 128),
        mtp_num_layers=_int(args, "mtp_num_layers") or None,
        # megatron/training/arguments.py: --transformer-impl defaults to transformer_engine
        transformer_impl=_name(args, "transformer_impl", "transformer_engine"),
    )
    if experts is not None:
        if not out["moe_router_topk"] >= 1:
            raise ValueError(f"model.moe_router_topk must be >= 1, got {out['moe_router_topk']}")
        capacity = _get(args, "moe_expert_capacity_factor")
        if capacity is not None and as_float(capacity, "moe_expert_capacity_factor") == 0:
            raise ValueError(
                "moe_expert_capacity_factor must be > 0 (a negative value turns it off, as in "
                "Megatron), got 0"
            )
        coeff = _get(args, "moe_aux_loss_coeff", 0.0)
        for value in coeff if isinstance(coeff, (list, tuple)) else [coeff]:
            as_float(value, "moe_aux_loss_coeff", 0.0)
    if not out["num_experts"]:
        out.update(num_experts=None, moe_ffn_hidden_size=None)
        out["moe_shared_expert_intermediate_size"] = None
    return out


def _data_parallel(args: Any, tp: int, pp: int, cp: int, ep: int, etp: int) -> int:
    """``data_parallel_size``, else world / (tp pp cp); else the least that EP allows
    (tp x cp x dp must be a multiple of etp x ep), 1 without experts.

    megatron-core's ``initialize_model_parallel`` (megatron/core/parallel_state.py) requires
    world_size % (tp x pp x cp) == 0 (dp is the quotient) and world_size % (etp x ep x pp)
    == 0, i.e. etp x ep dividing tp x cp x dp (checked by :func:`.validate_moe`)."""
    dp = _get(args, "data_parallel_size")
    world = _int(args, "world_size", None, "parallel.world_size (world_size)")
    if world is not None and world < 1:
        raise ValueError(f"parallel.world_size (world_size) must be >= 1, got {world}")
    hetero = _get(args, "hetero_stage_meshes") is not None or _get(args, "enable_hetero")
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


def _position_embedding(args: Any) -> str:
    kind = _name(args, "position_embedding_type", "learned_absolute")
    if _flag(args, "use_rotary_position_embeddings") or kind in ("mrope", "yarn"):
        kind = "rope"  # rotary variants have no parameters
    if _flag(args, "no_position_embedding") and kind == "learned_absolute":
        kind = "none"
    return kind


def spec_from_megatron_args(
    args: Any, vocab_size: int | None = None, world_size: int | None = None
) -> TrainingSpec:
    """From a Megatron args namespace (or a dict with the same underscore keys).

    ``vocab_size`` (unpadded) is used when the source has none (tokenizer-defined vocab);
    ``world_size`` (from the launcher: ``--world-size``, nnodes x nproc_per_node, a hostfile)
    when given must agree with the config's own ``world_size``.
    """
    if world_size is not None:
        own = _int(args, "world_size", None, "parallel.world_size (world_size)")
        if own is not None and own != world_size:
            raise ValueError(
                f"parallel.world_size (world_size) {own} in the config contradicts the "
                f"launcher's world size {world_size}"
            )
        args = {**(args if isinstance(args, dict) else vars(args)), "world_size": world_size}
    args = _negated_flags(args)
    for name, what in UNSUPPORTED.items():
        if _get(args, name):
            raise ValueError(f"{name}: {what} are not supported by the static estimator")
    tp = _size(args, "tensor_model_parallel_size")
    vocab = _vocab(args, tp, vocab_size)
    num_layers = _int(args, "num_layers", None, "model.num_layers")
    seq = _int(args, "seq_length", None, "model.seq_length")
    for name, value in (("num_layers", num_layers), ("seq_length", seq)):
        if value is None:
            raise ValueError(f"model.{name} is required")
    if num_layers > MAX_LAYERS:  # before any per-layer list is built
        raise ValueError(
            f"model.num_layers ({num_layers}) is beyond the {MAX_LAYERS} layers the static "
            "estimator lists"
        )
    bf16, fp16 = _flag(args, "bf16"), _flag(args, "fp16")
    if bf16 and fp16:
        raise ValueError("precision: bf16 and fp16 are both set")
    dtype = "bfloat16" if bf16 else "float16" if fp16 else "float32"
    groups = None
    if _flag(args, "group_query_attention", True):
        groups = _int(args, "num_query_groups", None, "model.num_query_groups")
    model = ModelSpec(
        num_layers=num_layers,
        hidden_size=_int(args, "hidden_size", 0, "model.hidden_size"),
        num_attention_heads=_int(args, "num_attention_heads", 0, "model.num_attention_heads"),
        vocab_size=int(vocab),
        seq_length=int(seq),
        num_query_groups=groups,
        ffn_hidden_size=_int(args, "ffn_hidden_size", None, "model.ffn_hidden_size"),
        kv_channels=_int(args, "kv_channels", None, "model.kv_channels"),
        max_position_embeddings=_int(args, "max_position_embeddings"),
        gated_linear_unit=_flag(args, "swiglu"),
        add_bias_linear=not _flag(args, "disable_bias_linear")
        and _flag(args, "add_bias_linear", True),
        add_qkv_bias=_flag(args, "add_qkv_bias"),
        qk_layernorm=_flag(args, "qk_layernorm"),
        normalization=_name(args, "normalization", "LayerNorm"),
        position_embedding_type=_position_embedding(args),
        tie_embeddings=not _flag(args, "untie_embeddings_and_output_weights"),
        hidden_dropout=_float(args, "hidden_dropout", 0.1, 0.0, 1.0),
        # megatron/training/arguments.py: the fusions default on (--no-*-fusion turns them
        # off); bias_gelu_fusion is turned off with the biases
        bias_activation_fusion=_flag(args, "bias_swiglu_fusion", True)
        if _flag(args, "swiglu")
        else _flag(args, "bias_gelu_fusion", True)
        and not _flag(args, "disable_bias_linear")
        and _flag(args, "add_bias_linear", True),
        masked_softmax_fusion=_flag(args, "masked_softmax_fusion", True),
        rope_fusion=_flag(args, "apply_rope_fusion", True),
        megatron_core_version=_installed_megatron_core(),
        attention_softmax_in_fp32=_flag(args, "attention_softmax_in_fp32")
        or _flag(args, "apply_query_key_layer_scaling"),
        attention_dropout=_float(args, "attention_dropout", 0.1, 0.0, 1.0),
        **_expert_fields(args, num_layers),
    )
    pp = _size(args, "pipeline_model_parallel_size")
    cp = _size(args, "context_parallel_size")
    ep = _size(args, "expert_model_parallel_size")
    etp = _int(args, "expert_tensor_parallel_size", None, label("expert_tensor_parallel_size"))
    if etp is not None and etp < 1:
        raise ValueError(f"parallel.etp (expert_tensor_parallel_size) must be >= 1, got {etp}")
    if etp == tp:
        # None is "tp" (ParallelSpec.expert_tp); Megatron-LM 0.19's validate_args fills the
        # default in for every model, 0.15.0rc5's leaves it None (both: megatron/training/
        # arguments.py, validate_args), so one command line reads the same from either.
        etp = None
    dp = _data_parallel(args, tp, pp, cp, ep, etp or tp)
    dp_assumed = (
        _get(args, "data_parallel_size") is None
        and _get(args, "world_size") is None
        and _get(args, "hetero_stage_meshes") is None
    )
    vpp = _int(args, "virtual_pipeline_model_parallel_size", None, "parallel.vpp")
    per_vstage = _int(args, "num_layers_per_virtual_pipeline_stage")
    stages = _int(args, "num_virtual_stages_per_pipeline_rank")
    if per_vstage and stages:  # megatron/training/arguments.py accepts one of the two
        raise ValueError(
            "num_layers_per_virtual_pipeline_stage and num_virtual_stages_per_pipeline_rank "
            "are exclusive (Megatron accepts one of them)"
        )
    if vpp is None and stages:
        vpp = stages
    if vpp is None and per_vstage:
        if per_vstage < 1 or model.num_layers // pp < per_vstage:
            raise ValueError(
                f"num_layers_per_virtual_pipeline_stage ({per_vstage}) must be in 1..the "
                f"layers per pipeline stage ({model.num_layers // pp})"
            )
        vpp = model.num_layers // (pp * per_vstage)
    layout = _pipeline_layout(args, pp)
    if layout is not None:
        if per_vstage or stages:  # megatron/training/arguments.py: at most one of the three
            raise ValueError(
                "pipeline_model_parallel_layout cannot be combined with "
                "num_layers_per_virtual_pipeline_stage / num_virtual_stages_per_pipeline_rank"
            )
        vpp = vpp if vpp is not None else layout_vpp(layout, pp)
    parallel = ParallelSpec(
        layout=layout,
        tp=tp,
        pp=pp,
        dp=int(dp),
        cp=cp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        sequence_parallel=_flag(args, "sequence_parallel") and tp > 1,
        first_stage_layers=_int(args, "decoder_first_pipeline_num_layers"),
        last_stage_layers=_int(args, "decoder_last_pipeline_num_layers"),
        stage_layers=_int_tuple(args, "hetero_stage_layers"),
        stage_meshes=_stage_meshes(args),
        account_for_embedding=_flag(args, "account_for_embedding_in_pipeline_split"),
        account_for_loss=_flag(args, "account_for_loss_in_pipeline_split"),
        microbatch_group_size=_int(args, "microbatch_group_size_per_vp_stage"),
        moe_a2a_overlap=_flag(args, "overlap_moe_expert_parallel_comm"),
        cp_comm_type=_cp_comm_type(args) if cp > 1 else "p2p",
        dp_assumed=dp_assumed,
    )
    savers = _optimizer_savers(args)
    precision = PrecisionSpec(
        params_dtype=dtype,
        grads_in_fp32=_grads_in_fp32(args, bf16, savers["main_grads_dtype"]),
        megatron_fsdp_main_grads_dtype=_fsdp_grads_dtype(args),
        **savers,
        optimizer=_name(args, "optimizer", "adam"),
        distributed_optimizer=_flag(args, "use_distributed_optimizer"),
        torch_optimizer=_flag(args, "torch_optimizer"),
        distributed_optimizer_instances=_size(args, "num_distributed_optimizer_instances"),
        sgd_momentum=_float(args, "sgd_momentum", 0.9, 0.0) > 0,
    )
    mbs = _int(args, "micro_batch_size", 1, "training.micro_batch_size")
    gbs = _int(args, "global_batch_size", None, "training.global_batch_size")
    microbatches = check_batch(
        gbs, mbs, parallel.dp, _int(args, "num_microbatches", None, "training.num_microbatches")
    )
    recompute, modules = _recompute(args)
    method = _name(args, "recompute_method", "uniform")
    recompute_layers = _int(args, "recompute_num_layers", 1, "recompute_num_layers")
    flash = _flash_attention(args, model.transformer_impl)
    cross_entropy = "unfused"
    if _flag(args, "cross_entropy_loss_fusion"):
        cross_entropy = _name(args, "cross_entropy_fusion_impl", "native")
    spec = TrainingSpec(
        model,
        parallel,
        precision,
        micro_batch_size=mbs,
        num_microbatches=microbatches,
        recompute=recompute,
        recompute_method=method,
        recompute_num_layers=recompute_layers,
        flash_attention=flash,
        cross_entropy=cross_entropy,
        defer_embedding_wgrad=_flag(args, "defer_embedding_wgrad_compute"),
        wgrad_deferral_limit=_int(args, "wgrad_deferral_limit", 0, "wgrad_deferral_limit"),
        gradient_accumulation_fusion=_flag(args, "gradient_accumulation_fusion", True),
        recompute_modules=modules,
        **_activation_offload(args),
        quant=quant_from_args(args, _get),
        **_fsdp(args),
        **_fine_grained_offload(args),
    ).validate()
    kd = distillation_from_args(args, spec)  # the teacher is built from these same args
    return replace(spec, distillation=kd) if kd is not None else spec


# --main-grads-dtype and friends as Megatron-LM's arguments.py maps them (a parsed namespace
# already holds torch dtypes)
_STATE_DTYPES = {
    "fp32": "fp32", "float32": "fp32", "torch.float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "torch.float16": "fp16",
    "fp8": "fp8", "uint8": "fp8", "torch.uint8": "fp8",
}  # fmt: skip


def _state_dtype(args: Any, name: str) -> str:
    value = _get(args, name, "fp32")
    key = str(value).strip().lower()
    if key not in _STATE_DTYPES:
        raise ValueError(f"{name}: {show(value)} is not one of fp32, bf16, fp16, fp8")
    return _STATE_DTYPES[key]


def _optimizer_savers(args: Any) -> dict[str, Any]:
    """PrecisionSpec's precision-aware optimizer and optimizer CPU offload fields
    (megatron/core/optimizer/optimizer_config.py names; Megatron-LM's
    ``--optimizer-offload-fraction`` defaults to 1.0)."""
    return dict(
        precision_aware=_flag(args, "use_precision_aware_optimizer"),
        muon_tp_mode=_name(args, "muon_tp_mode", "blockwise"),
        main_grads_dtype=_state_dtype(args, "main_grads_dtype"),
        main_params_dtype=_state_dtype(args, "main_params_dtype"),
        exp_avg_dtype=_state_dtype(args, "exp_avg_dtype"),
        exp_avg_sq_dtype=_state_dtype(args, "exp_avg_sq_dtype"),
        store_param_remainders=_flag(args, "store_param_remainders", True),
        optimizer_cpu_offload=_flag(args, "optimizer_cpu_offload"),
        optimizer_offload_fraction=_float(args, "optimizer_offload_fraction", 1.0, 0.0, 1.0),
    )


def _grads_in_fp32(args: Any, bf16: bool, main_grads_dtype: str) -> bool:
    """The DDP gradient buffer's dtype: Megatron-LM's arguments.py under bf16 turns
    ``accumulate_allreduce_grads_in_fp32`` on unless ``grad_reduce_in_bf16`` or
    ``main_grads_dtype`` bf16; training.py passes it to DDP as ``grad_reduce_in_fp32``
    (megatron/core/distributed/distributed_data_parallel.py: ``grad_dtype = torch.float if
    grad_reduce_in_fp32 else param.dtype``)."""
    if _flag(args, "accumulate_allreduce_grads_in_fp32"):
        if main_grads_dtype != "fp32":
            raise ValueError(
                "main_grads_dtype can only be fp32 with accumulate_allreduce_grads_in_fp32"
            )
        return True
    return bf16 and main_grads_dtype == "fp32" and not _flag(args, "grad_reduce_in_bf16")


def _recompute(args: Any) -> tuple[str | None, tuple[str, ...]]:
    """(recompute_granularity, recompute_modules): ``recompute_activations`` and
    ``moe_layer_recompute`` are Megatron's older spellings of selective recompute (of the
    default ``core_attn``, and adding ``moe``; megatron-core TransformerConfig)."""
    recompute = _get(args, "recompute_granularity")
    if recompute is not None:
        recompute = as_str(recompute, "training.recompute_granularity")
    if recompute is None and _flag(args, "recompute_activations"):
        recompute = "selective"
    raw = _get(args, "recompute_modules")
    if raw is None:
        modules = ["core_attn"]
    elif isinstance(raw, (list, tuple)):
        modules = [as_str(v, "recompute_modules") for v in raw]
    else:
        modules = as_str(raw, "recompute_modules").replace(",", " ").split()
    if _flag(args, "moe_layer_recompute"):
        if recompute == "full":
            raise ValueError("moe_layer_recompute cannot be combined with full recompute")
        recompute = "selective"
        modules += [] if "moe" in modules else ["moe"]
    return recompute, tuple(modules)


def _fine_grained_offload(args: Any) -> dict[str, Any]:
    """TrainingSpec's fine-grained activation offloading fields (megatron-core
    ``TransformerConfig`` names; ``offload_modules`` a list or a comma-separated string)."""
    modules = _get(args, "offload_modules") or ()
    if isinstance(modules, str):
        modules = [m for m in modules.replace(",", " ").split() if m]
    if not isinstance(modules, (list, tuple)):
        raise ValueError(f"offload_modules: expected a list of module names, got {show(modules)}")
    return {
        "fine_grained_offloading": _flag(args, "fine_grained_activation_offloading"),
        "offload_modules": tuple(as_str(m, "offload_modules") for m in modules),
        "min_offloaded_tensor_size": _int(args, "min_offloaded_tensor_size", 1024 * 1024),
    }


def _fsdp(args: Any) -> dict[str, Any]:
    """TrainingSpec's ``fsdp`` / ``torch_fsdp2`` (Megatron-LM ``--use-megatron-fsdp`` (formerly
    ``--use-custom-fsdp``) with ``--data-parallel-sharding-strategy``, default ``no_shard``;
    ``--use-torch-fsdp2``)."""
    megatron = _flag(args, "use_megatron_fsdp") or _flag(args, "use_custom_fsdp")
    strategy = _name(args, "data_parallel_sharding_strategy", "no_shard") if megatron else None
    return {"fsdp": strategy, "torch_fsdp2": _flag(args, "use_torch_fsdp2")}


def _activation_offload(args: Any) -> dict[str, Any]:
    """TrainingSpec's ``cpu_offloading*`` fields (megatron/core/model_parallel_config.py).
    Megatron-LM's parser (core_v0.16.1 ``megatron/training/arguments.py``) has no
    ``--cpu-offloading`` flag: ``--cpu-offloading-num-layers N`` with N > 0 turns it on."""
    layers = _int(args, "cpu_offloading_num_layers", 0)
    return dict(
        cpu_offloading=_flag(args, "cpu_offloading") or layers > 0,
        cpu_offloading_num_layers=layers,
        cpu_offloading_activations=_flag(args, "cpu_offloading_activations", True),
        cpu_offloading_weights=_flag(args, "cpu_offloading_weights"),
    )


def _negated_flags(args: Any) -> Any:
    """``args`` with every ``no_<flag>: true`` turned into ``<flag>: false`` (a dict source;
    a parsed namespace already holds the destinations)."""
    if not isinstance(args, dict) or not any(k in args for k in NEGATED_FLAGS):
        return args
    out = dict(args)
    for key, dest in NEGATED_FLAGS.items():
        if key in out and _flag(out, key):
            if dest in out and _flag(out, dest):
                raise ValueError(f"{key} contradicts {dest}: true")
            out[dest] = False
    return out


def _flash_attention(args: Any, impl: str) -> bool:
    """Whether attention runs a flash/fused kernel, as megatron-core picks it.

    Transformer Engine (``TEDotProductAttention``) with ``attention_backend`` ``auto``,
    ``flash`` or ``fused`` runs a fused kernel; ``unfused`` runs TE's unfused path. The local
    spec's ``DotProductAttention`` (megatron/core/transformer/dot_product_attention.py) has
    no flash path: ``use_flash_attn`` does not change it (warned)."""
    backend = _name(args, "attention_backend", "auto").split(".")[-1]
    if impl == "transformer_engine":
        return backend in ("auto", "flash", "fused")
    if _flag(args, "use_flash_attn") or backend in ("flash", "fused"):
        _warn_all(
            [
                "use_flash_attn / attention_backend flash|fused with transformer_impl local: "
                "megatron-core's local DotProductAttention has no flash path, so attention is "
                "modelled unfused (as it runs)"
            ]
        )
    return False


def spec_from_flagscale_yaml(
    config: dict[str, Any], vocab_size: int | None = None, world_size: int | None = None
) -> TrainingSpec:
    """From a FlagScale training YAML (its ``system``/``model``/``data`` sections merged).

    The merged keys get Megatron's argument defaults (:func:`.megatron_defaults`); a YAML for
    a model other than ``GPTModel`` is refused, heterogeneous meshes are resolved."""
    return _from_flagscale_yaml(config, vocab_size, world_size)[0]


def _from_flagscale_yaml(
    config: dict[str, Any], vocab_size: int | None, world_size: int | None
) -> tuple[TrainingSpec, dict[str, Any]]:
    """:func:`spec_from_flagscale_yaml` and the merged keys as the YAML gives them."""
    merged: dict[str, Any] = {}
    for section in ("system", "model", "data"):
        part = config.get(section) or {}
        if not isinstance(part, dict):
            raise ValueError(
                f"{section}: expected a mapping in a FlagScale training YAML, got {show(part)}"
            )
        for key, value in _flatten(part, section).items():
            merged[key.replace("-", "_")] = value
    if not merged:
        raise ValueError("no system/model/data sections: not a FlagScale training YAML")
    _warn_all(unknown_key_warnings(merged, READ_KEYS | set(VISION_KEYS), yaml=True))
    given = dict(merged)  # before the defaults below fill it in
    refuse_non_gpt(merged)
    megatron_defaults(merged)
    apply_hetero(merged)
    return spec_from_megatron_args(merged, vocab_size, world_size), given


# The original MemScope JSON config's names (and common synonyms) -> Megatron arg names.
JSON_ALIASES = {
    "num_heads": "num_attention_heads",
    "n_heads": "num_attention_heads",
    "num_kv_heads": "num_query_groups",
    "n_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "seq_len": "seq_length",
    "sequence_length": "seq_length",
    "batch_size": "micro_batch_size",
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "dp": "data_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
}


JSON_SECTIONS = ("model", "train", "training", "parallel", "precision")
JSON_KNOWN = READ_KEYS | set(JSON_ALIASES) | {"dtype", "model_type"}
JSON_KNOWN |= {"hetero_stage_layers", "hetero_stage_meshes"}  # what apply_hetero sets


def spec_from_json_config(
    config: dict[str, Any], vocab_size: int | None = None, world_size: int | None = None
) -> TrainingSpec:
    """From the original MemScope JSON config: sections flattened, aliases and ``dtype``."""
    return _from_json_config(config, vocab_size, world_size)[0]


def _from_json_config(
    config: dict[str, Any], vocab_size: int | None, world_size: int | None
) -> tuple[TrainingSpec, dict[str, Any]]:
    """:func:`spec_from_json_config` and the flattened keys under Megatron's names."""
    for section in JSON_SECTIONS:
        if section in config and not isinstance(config[section], dict):
            raise ValueError(f"{section}: expected a mapping, got {show(config[section])}")
    raw = _flatten(config, "", leaves=frozenset(_LEAF_KEYS))
    _warn_all(unknown_key_warnings(raw, JSON_KNOWN, yaml=False))
    flat = {JSON_ALIASES.get(k, k): v for k, v in raw.items()}
    given = dict(flat)  # before dtype and the model_type defaults are resolved
    dtype = flat.pop("dtype", None)
    if dtype is not None:
        name = as_str(dtype, "dtype").lower()
        if name not in DTYPE_BYTES:
            raise ValueError(
                f"dtype {show(dtype)} is unknown; use one of {sorted(set(DTYPE_BYTES))}"
            )
        want = {"bf16": name in ("bf16", "bfloat16"), "fp16": name in ("fp16", "float16")}
        for flag, value in want.items():
            if flat.get(flag) is not None and as_bool(flat[flag], flag) != value:
                raise ValueError(f"dtype {show(dtype)} contradicts {flag}={show(flat[flag])}")
            flat[flag] = value
    model_type = flat.get("model_type")
    if model_type is not None and as_str(model_type, "model_type").lower() in (
        "llama", "qwen", "mistral"
    ):  # fmt: skip
        flat.setdefault("swiglu", True)
        flat.setdefault("normalization", "RMSNorm")
        flat.setdefault("position_embedding_type", "rope")
        flat.setdefault("disable_bias_linear", True)
        flat.setdefault("untie_embeddings_and_output_weights", True)
        flat.setdefault("hidden_dropout", 0.0)  # LLaMA recipes train without dropout
        flat.setdefault("attention_dropout", 0.0)
    return spec_from_megatron_args(flat, vocab_size, world_size), given


def load_config_file(
    path: str, vocab_size: int | None = None, world_size: int | None = None
) -> TrainingSpec:
    """A JSON (original MemScope) or YAML (FlagScale training) config file -> spec.

    Whatever the file holds, the only exception is a one-line ``ValueError`` (naming the
    field where there is one); suspicious values give :class:`.ConfigWarning` warnings."""
    return load_config(path, vocab_size, world_size)[0]


def load_config(
    path: str, vocab_size: int | None = None, world_size: int | None = None
) -> tuple[TrainingSpec, dict[str, Any]]:
    """:func:`load_config_file`, plus the config's own keys under Megatron's names (a YAML's
    ``system``/``model``/``data`` sections merged, a JSON config flattened with its aliases),
    before any default is filled in: what :mod:`.coverage` compares with what was read."""
    text = read_config_text(path)
    try:
        is_json = os.path.splitext(path)[1].lower() == ".json"
        data = _parse_json(path, text) if is_json else _parse_yaml(path, text)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the config must be a mapping at the top level")
        _refuse_memscope_output(path, data)
        if is_json:
            return _from_json_config(data, vocab_size, world_size)
        train = train_config_of(path, data)  # an experiment YAML: the train config it names
        refusal = entrypoint_refusal(train.path)
        if refusal:
            raise ValueError(refusal)
        _warn_all(train.notes)
        try:
            return _from_flagscale_yaml(train.data, vocab_size, world_size)
        except ValueError as exc:
            if train.experiment is None:
                raise
            raise ValueError(f"train config {train.path}: {exc}") from None
    except (ArithmeticError, LookupError, TypeError, AttributeError, RecursionError) as exc:
        # A safety net: every check above should have refused the config first.
        raise ValueError(
            f"{path}: the config could not be read ({UNEXPECTED}: {type(exc).__name__})"
        ) from None


UNEXPECTED = "unexpected value"  # the safety net's words (the fuzz tests look for them)


def _refuse_memscope_output(path: str, data: dict[str, Any]) -> None:
    """A file MemScope wrote (it has a ``report_type`` and a ``schema_version``) is no
    training config: say so instead of asking it for a vocabulary size."""
    kind = data.get("report_type")
    if isinstance(kind, str) and "schema_version" in data:
        raise ValueError(
            f"{path}: this is a MemScope {kind} report, not a training config (give a "
            "FlagScale YAML or a MemScope JSON config; a runtime report is read by summarize, "
            "visualize-runtime and diff)"
        )


def _parse_json(path: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise ValueError(f"{path}: invalid JSON (nested too deeply)") from None
    except ValueError:  # e.g. an integer with more digits than Python converts
        raise ValueError(f"{path}: invalid JSON (a number too long to read)") from None


def _parse_yaml(path: str, text: str) -> Any:
    import yaml

    try:
        return load_yaml(text)
    except YamlRefusal as exc:
        raise ValueError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}: invalid YAML ({type(exc).__name__}{where})") from None
    except RecursionError:
        raise ValueError(f"{path}: invalid YAML (nested too deeply)") from None
    except ValueError:  # e.g. an integer with more digits than Python converts
        raise ValueError(f"{path}: invalid YAML (a value it cannot convert)") from None


def _warn_all(messages: list[str]) -> None:
    for message in messages:
        warnings.warn(ConfigWarning(message), stacklevel=3)


# JSON keys whose value is one number, flag or name: a mapping there is a mistake, not a
# section (FlagScale YAMLs do use ``optimizer:`` as a section of optimizer settings).
_LEAF_KEYS = (READ_KEYS | set(JSON_ALIASES) | {"dtype", "model_type"}) - {"optimizer"}


def _flatten(
    d: dict[str, Any], where: str, depth: int = 0, leaves: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Nested sections merged into one mapping (later keys win, as FlagScale's runner does);
    a key in ``leaves`` holding a mapping is refused."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if not isinstance(key, str):
            raise ValueError(f"{where or 'config'}: key {show(key)} is not a string")
        if isinstance(value, dict):
            if key in leaves:
                raise ValueError(f"{key}: expected a value, got a mapping")
            if depth >= MAX_NESTING:
                raise ValueError(f"{key}: sections nested more than {MAX_NESTING} deep")
            out.update(_flatten(value, key, depth + 1, leaves))
        else:
            out[key] = value
    return out


def _int_tuple(args: Any, name: str) -> tuple[int, ...] | None:
    value = _get(args, name)
    return None if value is None else tuple(as_int_list(value, name))


def _stage_meshes(args: Any) -> tuple[tuple[int, int], ...] | None:
    value = _get(args, "hetero_stage_meshes")
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


def read_hostfile(path: str) -> int:
    """The world size of a hostfile: the sum of its ``host slots=N`` lines (FlagScale's
    runner starts ``slots`` processes per host; ``#`` comments and blank lines skipped)."""
    total = 0
    for number, line in enumerate(read_config_text(path).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        slots = [f for f in line.split()[1:] if f.startswith("slots=")]
        if not slots:
            raise ValueError(f"{path}: line {number}: expected 'host slots=N', got {show(line)}")
        total += as_int(slots[0][len("slots=") :], f"{path}: line {number}: slots", minimum=1)
    if total == 0:
        raise ValueError(f"{path}: no 'host slots=N' line")
    return total


def experiment_world_size(path: str) -> tuple[int, str] | None:
    """(world size, where from) of a FlagScale experiment YAML's ``experiment.runner`` (see
    :func:`.flagscale_experiment.runner_world_size`); a YAML without a runner is refused."""
    data = read_yaml(path)
    experiment = data.get("experiment") if isinstance(data, dict) else None
    if not isinstance(experiment, dict) or not isinstance(experiment.get("runner"), dict):
        raise ValueError(f"{path}: experiment.runner: missing (not a FlagScale experiment YAML)")
    return runner_world_size(data, path)
