"""Read what a live megatron-core model says about itself into plain :class:`ModelFacts`.

Each chunk of a megatron-core language model (``GPTModel`` and friends) carries the
``TransformerConfig`` it was built with and the module classes its layer spec chose; those,
not the args namespace, are what runs. This module reads them -- the config's fusions,
softmax precision, recompute, MoE, MLA, MTP, normalization, dropout and parallel sizes; the
classes of the linear layers (Transformer Engine or local) and of the core attention
(``DotProductAttention`` or ``TEDotProductAttention``); the model's padded vocabulary, maximum
sequence length, decoder layers per chunk and which chunk holds the embedding and the output
layer -- under Megatron's argument names, so :mod:`memscope.inputs.inrun` can merge
them with the args (torch stays on this side).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from memscope.inputs.inrun import ModelFacts

# TransformerConfig fields read under the same name as Megatron-LM's argument
# (megatron/training/arguments.py core_transformer_config_from_args copies them by name).
SAME_NAME = (
    "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
    "kv_channels",
    "hidden_dropout", "attention_dropout", "add_bias_linear", "add_qkv_bias", "normalization",
    "qk_layernorm", "masked_softmax_fusion", "apply_rope_fusion", "attention_softmax_in_fp32",
    "apply_query_key_layer_scaling", "gradient_accumulation_fusion", "bias_dropout_fusion",
    "persist_layer_norm", "recompute_granularity", "recompute_method", "recompute_num_layers",
    "recompute_modules", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
    "defer_embedding_wgrad_compute", "wgrad_deferral_limit",
    "microbatch_group_size_per_vp_stage", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "cpu_offloading", "cpu_offloading_num_layers",
    "cpu_offloading_activations", "cpu_offloading_weights", "fp16", "bf16", "mtp_num_layers",
    "multi_latent_attention", "overlap_moe_expert_parallel_comm", "cp_comm_type",
    "overlap_p2p_comm",
    "moe_layer_recompute", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "moe_router_topk", "moe_grouped_gemm", "moe_use_legacy_grouped_gemm",
    "moe_router_enable_expert_bias", "moe_token_dispatcher_type", "moe_router_dtype",
    "moe_router_score_function", "moe_router_load_balancing_type", "moe_aux_loss_coeff",
    "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_permute_fusion",
    "moe_shared_expert_overlap", "moe_z_loss_coeff",
    "fp8", "fp8_recipe", "fp8_amax_history_len", "fp4", "fp4_recipe", "fp4_param",
    "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
    "disable_parameter_transpose_cache",
    "fine_grained_activation_offloading", "offload_modules", "min_offloaded_tensor_size",
    "cuda_graph_impl", "cuda_graph_scope", "cuda_graph_modules", "cuda_graph_warmup_steps",
)  # fmt: skip
# MLATransformerConfig's own fields (megatron/core/transformer/transformer_config.py).
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
# TransformerConfig name -> Megatron-LM argument name, where they differ.
RENAMED = {
    "num_moe_experts": "num_experts",
    "num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
    "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
    # core_transformer_config_from_args: kw_args['fp8_param'] = args.fp8_param_gather
    "fp8_param": "fp8_param_gather",
}
TE_MODULES = ("transformer_engine", "megatron.core.extensions.transformer_engine")


def plain(value: Any) -> Any:
    """A config value as plain data: dtypes and enums by name, sequences as lists."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    name = getattr(value, "name", None)  # an enum member (AttnBackend.auto -> "auto")
    return name if isinstance(name, str) else str(value)


def language_model(chunk: torch.nn.Module) -> torch.nn.Module | None:
    """The megatron-core language model in ``chunk`` (itself or a submodule): the first
    module with a ``TransformerConfig``-like ``config`` and a ``decoder``."""
    for module in chunk.modules():
        config = getattr(module, "config", None)
        if hasattr(module, "decoder") and all(
            hasattr(config, k) for k in ("num_layers", "hidden_size", "num_attention_heads")
        ):
            return module
    return None


def _is_te(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith(TE_MODULES)


def _config_values(config: Any) -> dict[str, Any]:
    out = {k: plain(getattr(config, k)) for k in SAME_NAME if hasattr(config, k)}
    out.update({new: plain(getattr(config, old, None)) for old, new in RENAMED.items()})
    if getattr(config, "multi_latent_attention", False):
        out.update({k: plain(getattr(config, k, None)) for k in MLA_FIELDS})
    gated = bool(getattr(config, "gated_linear_unit", False))
    out["swiglu"] = gated
    # core_transformer_config_from_args: bias_activation_fusion is bias_swiglu_fusion under
    # swiglu, else bias_gelu_fusion
    fusion = "bias_swiglu_fusion" if gated else "bias_gelu_fusion"
    out[fusion] = bool(getattr(config, "bias_activation_fusion", False))
    out["disable_bias_linear"] = not out.get("add_bias_linear", True)
    groups, heads = getattr(config, "num_query_groups", None), config.num_attention_heads
    out["group_query_attention"] = groups is not None and groups != heads
    layout = getattr(config, "pipeline_model_parallel_layout", None)
    # TransformerConfig.__post_init__ replaces the string or list by a parsed
    # PipelineParallelLayerLayout, which keeps what it was given as ``input_data``
    # (transformer/pipeline_parallel_layer_layout.py)
    given = getattr(layout, "input_data", layout)
    if isinstance(given, (str, list)):
        out["pipeline_model_parallel_layout"] = plain(given)
    return out


def _implementation(models: Sequence[torch.nn.Module], backend: Any) -> tuple[dict, list[str]]:
    """``transformer_impl`` and ``attention_backend`` from the module classes.

    Linear layers of ``megatron.core.extensions.transformer_engine`` (``TELinear``,
    ``TELayerNormColumnParallelLinear`` ...) mean the TE spec; ``TEDotProductAttention`` runs
    the config's ``attention_backend``, megatron-core's own ``DotProductAttention`` is the
    unfused local path (``AttnBackend.local``)."""
    notes: list[str] = []
    te = any(_is_te(m) for model in models for m in model.modules())
    attention = {
        type(m).__name__
        for model in models
        for name, m in model.named_modules()
        if name.endswith("core_attention")
    }
    out: dict[str, Any] = {"transformer_impl": "transformer_engine" if te else "local"}
    if attention == {"DotProductAttention"}:
        out["attention_backend"] = "local"
    elif attention == {"TEDotProductAttention"}:
        out["attention_backend"] = plain(backend)
        if not te:
            notes.append(
                "TEDotProductAttention with local linear layers: attention is modelled as "
                "local (unfused)"
            )
    elif attention:
        notes.append(f"core attention {sorted(attention)}: modelled from attention_backend")
        out["attention_backend"] = plain(backend)
    return out, notes


def read_model_facts(chunks: Sequence[Any]) -> ModelFacts | None:
    """What this rank's model chunks say; ``None`` when none is a megatron-core model."""
    models = [m for m in (language_model(c) for c in chunks if isinstance(c, torch.nn.Module)) if m]
    if not models:
        return None
    config = models[0].config
    values = _config_values(config)
    notes = [
        f"chunk {i}: its TransformerConfig differs from chunk 0's; chunk 0's is used"
        for i, m in enumerate(models[1:], 1)
        if _config_values(m.config) != values
    ]
    impl, impl_notes = _implementation(models, getattr(config, "attention_backend", None))
    values.update(impl)
    first = models[0]
    vocab = getattr(first, "vocab_size", None)
    if isinstance(vocab, int):
        values["padded_vocab_size"] = vocab
    max_len = getattr(first, "max_sequence_length", None)
    if isinstance(max_len, int):
        values["max_position_embeddings"] = max_len
    position = getattr(first, "position_embedding_type", None)
    if isinstance(position, str):
        values["position_embedding_type"] = position
    rotary = getattr(first, "rotary_percent", None)  # GPTModel keeps its argument
    if isinstance(rotary, (int, float)) and not isinstance(rotary, bool):
        values["rotary_percent"] = float(rotary)
    share = getattr(first, "share_embeddings_and_output_weights", None)
    if isinstance(share, bool):
        values["untie_embeddings_and_output_weights"] = not share
    if len(models) > 1 and not values.get("virtual_pipeline_model_parallel_size"):
        values["virtual_pipeline_model_parallel_size"] = len(models)
    return ModelFacts(
        values=values,
        chunk_layers=tuple(len(getattr(m.decoder, "layers", ())) for m in models),
        chunk_embedding=tuple(bool(getattr(m, "pre_process", False)) for m in models),
        chunk_output=tuple(bool(getattr(m, "post_process", False)) for m in models),
        notes=tuple(notes + impl_notes),
    )
