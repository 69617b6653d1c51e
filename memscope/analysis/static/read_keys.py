"""The Megatron argument names the static estimator reads (and MemScope's own settings).

Data only: the args reader (:mod:`memscope.inputs.megatron_args`) reads these keys, the
coverage report (:mod:`.coverage`) and the in-run merge (:mod:`memscope.inputs.inrun`) compare
a config's keys with them.
"""

from __future__ import annotations

import functools

from memscope.analysis.static.distillation import KD_KEYS
from memscope.analysis.static.fp8 import QUANT_KEYS

# Megatron's store_false flags (megatron/training/arguments.py): the YAML/JSON key a user
# writes (``no_masked_softmax_fusion: true``) -> the argument it clears
NEGATED_FLAGS = {
    "no_masked_softmax_fusion": "masked_softmax_fusion",
    "no_bias_gelu_fusion": "bias_gelu_fusion",
    "no_bias_swiglu_fusion": "bias_swiglu_fusion",
    "no_gradient_accumulation_fusion": "gradient_accumulation_fusion",
    "no_rope_fusion": "apply_rope_fusion",
    "no_overlap_p2p_communication": "overlap_p2p_comm",
}
# Megatron argument names (and the JSON config's own) that the estimator reads.
READ_KEYS = frozenset(NEGATED_FLAGS) | frozenset(
    [
        "account_for_embedding_in_pipeline_split",
        "cpu_offloading",
        "cpu_offloading_activations",
        "cpu_offloading_num_layers",
        "cpu_offloading_weights",
        "exp_avg_dtype",
        "exp_avg_sq_dtype",
        "grad_reduce_in_bf16",
        "main_grads_dtype",
        "megatron_fsdp_main_grads_dtype",
        "main_params_dtype",
        "moe_layer_recompute",
        "muon_tp_mode",
        "data_parallel_sharding_strategy",
        "use_custom_fsdp",
        "use_megatron_fsdp",
        "use_torch_fsdp2",
        "fine_grained_activation_offloading",
        "tp_comm_overlap",
        "offload_modules",
        "min_offloaded_tensor_size",
        "optimizer_cpu_offload",
        "optimizer_offload_fraction",
        "recompute_activations",
        "recompute_modules",
        "store_param_remainders",
        "use_precision_aware_optimizer",
        "account_for_loss_in_pipeline_split",
        "accumulate_allreduce_grads_in_fp32",
        "add_bias_linear",
        "add_qkv_bias",
        "apply_rope_fusion",
        "apply_query_key_layer_scaling",
        "attention_backend",
        "attention_dropout",
        "attention_softmax_in_fp32",
        "bf16",
        "bias_gelu_fusion",
        "bias_swiglu_fusion",
        "context_parallel_size",
        "cp_comm_type",
        "cross_entropy_fusion_impl",
        "cross_entropy_loss_fusion",
        "data_parallel_size",
        "decoder_first_pipeline_num_layers",
        "decoder_last_pipeline_num_layers",
        "defer_embedding_wgrad_compute",
        "disable_bias_linear",
        "enable_hetero",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "expert_tensor_parallel_size_per_process_mesh",
        "ffn_hidden_size",
        "fp16",
        "global_batch_size",
        "gradient_accumulation_fusion",
        "group_query_attention",
        "hetero_pipeline_layer_split",
        "hetero_process_meshes",
        "hidden_dim_multiplier",
        "hidden_dropout",
        "hidden_size",
        "kv_channels",
        "kv_lora_rank",
        "make_vocab_size_divisible_by",
        "masked_softmax_fusion",
        "max_position_embeddings",
        "micro_batch_size",
        "microbatch_group_size_per_vp_stage",
        "moe_aux_loss_coeff",
        "moe_expert_capacity_factor",
        "moe_ffn_hidden_size",
        "moe_grouped_gemm",
        "moe_layer_freq",
        "moe_pad_expert_input_to_capacity",
        "moe_permute_fusion",
        "moe_router_dtype",
        "moe_router_load_balancing_type",
        "moe_router_score_function",
        "moe_router_enable_expert_bias",
        "moe_router_topk",
        "moe_token_dispatcher_type",
        "moe_token_imbalance",
        "moe_z_loss_coeff",
        "moe_shared_expert_intermediate_size",
        "moe_shared_expert_overlap",
        "moe_use_legacy_grouped_gemm",
        "mtp_num_layers",
        "multi_latent_attention",
        "multiple_of",
        "overlap_moe_expert_parallel_comm",
        "overlap_p2p_comm",
        "overlap_param_gather",
        "no_position_embedding",
        "normalization",
        "num_attention_heads",
        "num_distributed_optimizer_instances",
        "num_experts",
        "num_layers",
        "num_layers_per_virtual_pipeline_stage",
        "num_virtual_stages_per_pipeline_rank",
        "num_microbatches",
        "num_query_groups",
        "optimizer",
        "pad_vocab",
        "padded_vocab_size",
        "pipeline_model_parallel_layout",
        "pipeline_model_parallel_size",
        "position_embedding_type",
        "q_lora_rank",
        "qk_head_dim",
        "qk_layernorm",
        "qk_pos_emb_head_dim",
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "seq_length",
        "sequence_parallel",
        "sgd_momentum",
        "swiglu",
        "tensor_model_parallel_size",
        "torch_optimizer",
        "transformer_impl",
        "untie_embeddings_and_output_weights",
        "use_distributed_optimizer",
        "use_layer_wise_distributed_optimizer",
        "use_flash_attn",
        "use_rotary_position_embeddings",
        "v_head_dim",
        "virtual_pipeline_model_parallel_size",
        "vocab_size",
        "wgrad_deferral_limit",
        "world_size",
    ]
)
READ_KEYS |= QUANT_KEYS | KD_KEYS  # fp8.py, distillation.py


@functools.cache
def memscope_keys() -> frozenset[str]:
    """MemScope's own settings as a training config spells them (``memscope`` and
    ``memscope_<setting>``, :mod:`memscope.config`): the tracer reads them, the estimator
    has no use for them, so they are neither unused nor unknown."""
    from memscope.config import runtime_settings

    return frozenset({"memscope", *(s.dest for s in runtime_settings())})
