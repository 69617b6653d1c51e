"""The inference side of Megatron-LM's RL loop, read from Megatron args.

``--perform-rl-step`` (``train_rl.py``) turns it on; the names and defaults are Megatron-LM's
``megatron/training/arguments.py`` (at 4e85d74ae9). A size of 0 is read as not given, as
``None`` is. What the inference side costs is :mod:`memscope.analysis.static.rl`.
"""

from __future__ import annotations

from typing import Any

from memscope.analysis.static.config import RlSpec
from memscope.analysis.static.rl import kv_buffer_resident
from memscope.inputs.args_access import get, get_choice, get_flag, get_float, get_int

KV_MODES = ("persist", "offload", "recompute")  # --rl-kv-cache-management-mode
DEFAULT_CUDA_GRAPHS = 16  # --inference-dynamic-batching-num-cuda-graphs


def _size(args: Any, name: str) -> int | None:
    """A size or count that may be left unset (None or 0)."""
    value = get_int(args, name)
    if value is not None and value < 0:
        raise ValueError(f"{name}: {value} must not be negative")
    return value or None


def rl_from_args(args: Any) -> RlSpec | None:
    """The RL inference engine's settings, or None when the args do not run the RL loop."""
    if not get_flag(args, "perform_rl_step"):
        return None
    unified = get_int(args, "inference_dynamic_batching_unified_memory_level", 0)
    mode = get_choice(args, "rl_kv_cache_management_mode", "persist", KV_MODES)
    freed = get_flag(args, "rl_offload_kv_cache_during_training") or get_flag(
        args, "rl_remove_kv_cache_during_training"
    )
    model_unified = get_int(args, "rl_inference_model_unified_memory_level", 0)
    paused_by_saver = get_flag(args, "rl_offload_inference_model_weights_when_idle") and not (
        model_unified
    )
    local_graphs = get(args, "cuda_graph_impl", "none") == "local"
    graphs = get_int(args, "inference_dynamic_batching_num_cuda_graphs", DEFAULT_CUDA_GRAPHS)
    return RlSpec(
        buffer_size_gib=get_float(args, "inference_dynamic_batching_buffer_size_gb", 40.0, 0.0),
        paused_buffer_size_gib=get_float(
            args, "inference_dynamic_batching_paused_buffer_size_gb", 0.0, 0.0
        ),
        block_size_tokens=_positive(args, "inference_dynamic_batching_block_size", 256),
        unified_memory_level=unified,
        kv_resident=kv_buffer_resident(mode, unified, freed),
        inference_tp=_size(args, "rl_inference_tensor_model_parallel_size"),
        inference_pp=_size(args, "rl_inference_pipeline_model_parallel_size"),
        inference_ep=_size(args, "rl_inference_expert_model_parallel_size"),
        inference_etp=_size(args, "rl_inference_expert_tensor_model_parallel_size"),
        inference_model_resident=not paused_by_saver,
        inference_cuda_graphs=graphs if local_graphs else 0,
        max_sequence_length=_positive(args, "inference_max_seq_length", 2560),
        max_requests=_size(args, "inference_dynamic_batching_max_requests"),
        max_tokens=_size(args, "inference_dynamic_batching_max_tokens"),
        mixed_prefill_requests=get_int(
            args, "inference_dynamic_batching_cuda_graph_mixed_prefill_count", 16
        ),
        decode_only_cuda_graphs=get_flag(args, "decode_only_cuda_graphs"),
    )


def _positive(args: Any, name: str, default: int) -> int:
    value = get_int(args, name, default)
    if value < 1:
        raise ValueError(f"{name}: {value} must be at least 1")
    return int(value)
