"""Megatron's MoE, multi-latent attention and MTP arguments -> the spec's model fields."""

from __future__ import annotations

from typing import Any

from memscope.inputs.args_access import (
    get,
    get_choice,
    get_flag,
    get_float,
    get_int,
    get_name,
)
from memscope.inputs.flagscale_checks import eval_layer_pattern
from memscope.inputs.values import as_float, as_int, as_int_list, as_str

DISPATCHERS = ("allgather", "alltoall", "flex")

AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")


def expert_fields(args: Any, num_layers: int) -> dict[str, Any]:
    """ModelSpec's MoE, MLA and MTP fields from Megatron's argument names."""
    experts = get_int(args, "num_experts", None, "model.num_experts")
    if experts is not None and experts < 1:
        raise ValueError(f"model.num_experts must be >= 1, got {experts}")
    out = {**_moe_fields(args, num_layers, experts), **_mla_mtp_fields(args)}
    if experts is not None:
        _check_moe_numbers(args, out["moe_router_topk"])
    if not out["num_experts"]:
        out.update(num_experts=None, moe_ffn_hidden_size=None)
        out["moe_shared_expert_intermediate_size"] = None
    return out


def _moe_fields(args: Any, num_layers: int, experts: int | None) -> dict[str, Any]:
    """The experts, router and token dispatcher (megatron/training/arguments.py names)."""
    return dict(
        num_experts=experts,
        moe_ffn_hidden_size=get_int(args, "moe_ffn_hidden_size", None, "model.moe_ffn_hidden_size"),
        moe_shared_expert_intermediate_size=get_int(args, "moe_shared_expert_intermediate_size"),
        moe_layer_pattern=_moe_pattern(args, num_layers),
        moe_router_topk=get_int(args, "moe_router_topk", 2, "model.moe_router_topk"),
        moe_grouped_gemm=get_flag(args, "moe_grouped_gemm"),
        moe_use_legacy_grouped_gemm=get_flag(args, "moe_use_legacy_grouped_gemm"),
        moe_router_enable_expert_bias=get_flag(args, "moe_router_enable_expert_bias"),
        moe_token_dispatcher=get_choice(
            args, "moe_token_dispatcher_type", "allgather", DISPATCHERS
        ),
        moe_router_dtype=_router_dtype(args),
        moe_router_score_function=get_choice(
            args, "moe_router_score_function", "softmax", ("softmax", "sigmoid")
        ),
        moe_aux_loss=_aux_loss_enabled(args),
        moe_z_loss=get(args, "moe_z_loss_coeff") is not None,
        moe_expert_capacity_factor=_capacity_factor(args),
        moe_pad_expert_input_to_capacity=get_flag(args, "moe_pad_expert_input_to_capacity"),
        moe_permute_fusion=get_flag(args, "moe_permute_fusion"),
        moe_shared_expert_overlap=get_flag(args, "moe_shared_expert_overlap"),
        moe_token_imbalance=get_float(args, "moe_token_imbalance", 1.0, 1.0),
    )


def _mla_mtp_fields(args: Any) -> dict[str, Any]:
    """Multi-latent attention, multi-token prediction and the transformer implementation."""
    return dict(
        multi_latent_attention=get_flag(args, "multi_latent_attention"),
        q_lora_rank=get_int(args, "q_lora_rank"),
        kv_lora_rank=get_int(args, "kv_lora_rank", 32),
        qk_head_dim=get_int(args, "qk_head_dim", 128),
        qk_pos_emb_head_dim=get_int(args, "qk_pos_emb_head_dim", 64),
        v_head_dim=get_int(args, "v_head_dim", 128),
        mtp_num_layers=get_int(args, "mtp_num_layers") or None,
        # megatron/training/arguments.py: --transformer-impl defaults to transformer_engine
        transformer_impl=get_name(args, "transformer_impl", "transformer_engine"),
    )


def _check_moe_numbers(args: Any, topk: int) -> None:
    """Top-k >= 1, a capacity factor other than 0, aux-loss coefficients >= 0."""
    if not topk >= 1:
        raise ValueError(f"model.moe_router_topk must be >= 1, got {topk}")
    capacity = get(args, "moe_expert_capacity_factor")
    if capacity is not None and as_float(capacity, "moe_expert_capacity_factor") == 0:
        raise ValueError(
            "moe_expert_capacity_factor must be > 0 (a negative value turns it off, as in "
            "Megatron), got 0"
        )
    coeff = get(args, "moe_aux_loss_coeff", 0.0)
    for value in coeff if isinstance(coeff, (list, tuple)) else [coeff]:
        as_float(value, "moe_aux_loss_coeff", 0.0)


def _router_dtype(args: Any) -> str | None:
    """``moe_router_dtype``: fp32 / fp64, or None (the activation dtype)."""
    value = get(args, "moe_router_dtype")
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
    types_ = get(args, "moe_router_load_balancing_type", "aux_loss")
    coeffs = get(args, "moe_aux_loss_coeff", 0.0)
    types_ = list(types_) if isinstance(types_, (list, tuple)) else [types_]
    coeffs = list(coeffs) if isinstance(coeffs, (list, tuple)) else [coeffs] * len(types_)
    return any(
        str(t) in AUX_LOSS_TYPES and as_float(c, "moe_aux_loss_coeff", 0.0) > 0
        for t, c in zip(types_, coeffs, strict=False)
    )


def _capacity_factor(args: Any) -> float | None:
    value = get(args, "moe_expert_capacity_factor")
    if value is None:
        return None
    return as_float(value, "moe_expert_capacity_factor")


def _moe_pattern(args: Any, num_layers: int) -> tuple[int, ...] | None:
    """Megatron's ``moe_layer_freq``: N (one MoE layer every N, from layer 0), ``"N"``, or a
    list / list expression with one 0 (dense) or 1 (MoE) per layer."""
    if not get_int(args, "num_experts", None, "model.num_experts"):
        return None
    freq = get(args, "moe_layer_freq", 1)
    if isinstance(freq, str) and "[" in freq:
        freq = eval_layer_pattern(freq)
    if isinstance(freq, (list, tuple)):
        return tuple(as_int_list(freq, "moe_layer_freq"))
    n = as_int(freq, "moe_layer_freq")
    if n < 1:
        raise ValueError(f"moe_layer_freq: must be >= 1, got {n}")
    return tuple(1 if i % n == 0 else 0 for i in range(num_layers))
