"""Validation of the mixture-of-experts, multi-latent attention and multi-token prediction
fields of a spec: the constraints megatron-core 0.16 asserts when it builds those modules,
raised as ``ValueError`` naming the field."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memscope.analysis.static.megatron_versions import (
    MLA_QK_NORM_RESOLVER,
    MoeBias,
    at_least,
    legacy_grouped_mlp,
    moe_bias_rule,
)

if TYPE_CHECKING:
    from memscope.analysis.static.config import ModelSpec, ParallelSpec, TrainingSpec


def validate_moe(m: ModelSpec, p: ParallelSpec) -> None:
    """Expert counts, layer pattern and expert sharding (EP x ETP)."""
    if p.etp is not None and p.etp < 1:
        raise ValueError(f"parallel.etp must be >= 1, got {p.etp}")
    if m.num_experts is None:
        if p.ep > 1:
            raise ValueError(f"parallel.ep ({p.ep}) > 1 needs model.num_experts")
        for name in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size"):
            if getattr(m, name) is not None:
                raise ValueError(f"model.{name} is set but model.num_experts is not")
        if m.moe_layer_pattern is not None:
            raise ValueError("model.moe_layer_pattern is set but model.num_experts is not")
        return
    if m.num_experts < 1:
        raise ValueError(f"model.num_experts must be >= 1, got {m.num_experts}")
    if m.num_experts % p.ep:
        raise ValueError(f"parallel.ep ({p.ep}) must divide model.num_experts ({m.num_experts})")
    if not 1 <= m.moe_router_topk <= m.num_experts:
        raise ValueError(
            f"model.moe_router_topk ({m.moe_router_topk}) must be in 1..model.num_experts "
            f"({m.num_experts})"
        )
    pattern = m.moe_layer_pattern
    if pattern is not None:
        if len(pattern) != m.num_layers:
            raise ValueError(
                f"model.moe_layer_pattern has {len(pattern)} entries, model.num_layers is "
                f"{m.num_layers}"
            )
        if set(pattern) - {0, 1}:
            raise ValueError("model.moe_layer_pattern entries must be 0 (dense) or 1 (MoE)")
    if m.moe_ffn < 1 or m.moe_ffn % p.expert_tp:
        raise ValueError(
            f"parallel.etp ({p.expert_tp}) must divide model.moe_ffn_hidden_size ({m.moe_ffn})"
        )
    if (p.tp * p.cp * p.dp) % (p.expert_tp * p.ep):
        raise ValueError(
            f"parallel.ep x etp ({p.ep} x {p.expert_tp}) must divide parallel.tp x cp x dp "
            f"({p.tp} x {p.cp} x {p.dp})"
        )
    bias_rule = moe_bias_rule(m) if m.add_bias_linear else None
    if bias_rule is MoeBias.REFUSED:
        raise ValueError(
            f"model.add_bias_linear with MoE: megatron-core {m.megatron_core_version} refuses "
            "expert biases (0.13 to 0.15.0rc5)"
        )
    if bias_rule is MoeBias.ETP1 and p.expert_tp > 1:
        raise ValueError("model.add_bias_linear with MoE needs parallel.etp == 1 (megatron-core)")
    if bias_rule is MoeBias.ANY_ETP and m.moe_token_dispatcher != "allgather":
        raise ValueError(  # 0.12 token_dispatcher.py MoEAlltoAllTokenDispatcher
            f"model.add_bias_linear with MoE: megatron-core {m.megatron_core_version}'s "
            f"{m.moe_token_dispatcher} dispatcher refuses expert biases"
        )
    if bias_rule is MoeBias.ANY_ETP and m.moe_grouped_gemm:
        raise ValueError(  # experts.py GroupedMLP refuses; TEGroupedMLP's bias path is not read
            "model.add_bias_linear with MoE grouped GEMM before megatron-core 0.13 is not modelled"
        )
    if m.add_bias_linear and m.transformer_impl == "local" and legacy_grouped_mlp(m):
        raise ValueError("model.moe_grouped_gemm (local GroupedMLP) needs add_bias_linear off")
    shared = m.moe_shared_expert_intermediate_size
    if shared is not None:
        if shared < 1 or shared % p.tp:
            raise ValueError(
                f"parallel.tp ({p.tp}) must divide model.moe_shared_expert_intermediate_size "
                f"({shared})"
            )
        if m.add_bias_linear:
            raise ValueError(
                "model.moe_shared_expert_intermediate_size needs add_bias_linear off "
                "(megatron-core)"
            )


def validate_mla_mtp(m: ModelSpec, p: ParallelSpec) -> None:
    """Multi-latent attention dimensions and their TP sharding; MTP depth."""
    if m.mtp_num_layers is not None and m.mtp_num_layers < 1:
        raise ValueError(f"model.mtp_num_layers must be >= 1, got {m.mtp_num_layers}")
    if not m.multi_latent_attention:
        return
    for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
        if getattr(m, name) < 1:
            raise ValueError(f"model.{name} must be positive, got {getattr(m, name)}")
    if m.q_lora_rank is not None and m.q_lora_rank < 1:
        raise ValueError(f"model.q_lora_rank must be positive, got {m.q_lora_rank}")
    if m.transformer_impl == "local":  # the local spec shards the down-projections over TP
        kv_down = m.kv_lora_rank + m.qk_pos_emb_head_dim
        if kv_down % p.tp:
            raise ValueError(
                f"parallel.tp ({p.tp}) must divide model.kv_lora_rank + qk_pos_emb_head_dim "
                f"({kv_down}) with the local MLA spec"
            )
        if m.q_lora_rank is not None and m.q_lora_rank % p.tp:
            raise ValueError(
                f"parallel.tp ({p.tp}) must divide model.q_lora_rank ({m.q_lora_rank}) with the "
                "local MLA spec"
            )
        if m.qk_layernorm and m.q_lora_rank is None and at_least(m, MLA_QK_NORM_RESOLVER):
            raise ValueError(  # megatron_versions.MLA_QK_NORM_RESOLVER
                f"model.qk_layernorm without model.q_lora_rank: megatron-core "
                f"{m.megatron_core_version}'s local MLA spec cannot build the query norm (it "
                "needs Transformer Engine's fused norm+linear)"
            )


def validate_savers(spec: TrainingSpec) -> None:
    """Precision-aware optimizer, optimizer and activation offload, recompute modules: what
    megatron-core 0.16.1 asserts (optimizer/optimizer_config.py ``__post_init__``,
    transformer/transformer_config.py ``__post_init__``) and Megatron-LM's arguments.py
    (optimizer CPU offload needs the precision-aware optimizer)."""
    from memscope.analysis.static.config import (
        MAIN_GRADS_DTYPES,
        MAIN_PARAMS_DTYPES,
        RECOMPUTE_MODULES,
        STATE_DTYPE_BYTES,
    )

    prec, m = spec.precision, spec.model
    dtypes = {
        "main_grads_dtype": MAIN_GRADS_DTYPES,
        "main_params_dtype": MAIN_PARAMS_DTYPES,
        "exp_avg_dtype": tuple(STATE_DTYPE_BYTES),
        "exp_avg_sq_dtype": tuple(STATE_DTYPE_BYTES),
    }
    for name, choices in dtypes.items():
        value = getattr(prec, name)
        if value not in choices:
            raise ValueError(f"{name}: {value!r} is not one of {', '.join(choices)}")
        if value != "fp32" and not prec.precision_aware:
            raise ValueError(f"{name} can only be fp32 without use_precision_aware_optimizer")
    if prec.precision_aware and (prec.optimizer != "adam" or not prec.distributed_optimizer):
        raise ValueError(
            "use_precision_aware_optimizer needs the adam optimizer and "
            "use_distributed_optimizer (megatron-core OptimizerConfig)"
        )
    if prec.optimizer_cpu_offload and not prec.precision_aware:
        raise ValueError(
            "optimizer_cpu_offload needs use_precision_aware_optimizer (Megatron-LM arguments.py)"
        )
    if not 0.0 <= prec.optimizer_offload_fraction <= 1.0:
        raise ValueError(
            f"optimizer_offload_fraction must be in [0, 1], got {prec.optimizer_offload_fraction}"
        )
    if spec.cpu_offloading:
        if not 0 <= spec.cpu_offloading_num_layers < m.num_layers:
            raise ValueError(
                f"cpu_offloading_num_layers ({spec.cpu_offloading_num_layers}) must be in "
                f"0..{m.num_layers - 1} (megatron-core TransformerConfig)"
            )
        if spec.parallel.pp > 1:
            raise ValueError("cpu_offloading does not support pipeline parallelism (pp > 1)")
        if spec.recompute is not None:
            raise ValueError("cpu_offloading does not work with activation recompute")
    if spec.recompute == "selective":
        unknown = sorted(set(spec.recompute_modules) - set(RECOMPUTE_MODULES))
        if unknown:
            raise ValueError(
                f"recompute_modules: {', '.join(unknown)} not among {', '.join(RECOMPUTE_MODULES)}"
            )
        if "moe_act" in spec.recompute_modules and not m.moe_grouped_gemm:
            raise ValueError("recompute_modules moe_act needs moe_grouped_gemm")
        if "mla_up_proj" in spec.recompute_modules and not m.multi_latent_attention:
            raise ValueError("recompute_modules mla_up_proj needs multi_latent_attention")
