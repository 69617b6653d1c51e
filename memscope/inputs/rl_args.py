"""The inference side of Megatron-LM's RL loop, read from Megatron args.

``--perform-rl-step`` (``train_rl.py``) turns it on; the names, defaults and the combinations
refused are Megatron-LM's ``megatron/training/arguments.py`` (at 4e85d74ae9). A size or count
of 0 is read as not given, as ``None`` is. What the inference side costs is
:mod:`memscope.analysis.static.rl`.
"""

from __future__ import annotations

from typing import Any

from memscope.analysis.static.config import RlSpec
from memscope.inputs.args_access import get_choice, get_flag, get_float, get_int, get_size

KV_MODES = ("persist", "offload", "recompute")  # --rl-kv-cache-management-mode
DEFAULT_CUDA_GRAPHS = 16  # --inference-dynamic-batching-num-cuda-graphs
AUTOMATIC_CUDA_GRAPHS = -1  # Megatron's own list of token counts
DEFAULT_GROUP_SIZE = 2  # --grpo-group-size
DEFAULT_PROMPTS_PER_STEP = 32  # --grpo-prompts-per-step
DEFAULT_GENERATION_TASKS = 512  # validate_args: rl_parallel_generation_tasks otherwise


def _unset_or_positive(args: Any, name: str) -> int | None:
    """A size or count that may be left unset (None or 0)."""
    value = get_int(args, name)
    if value is not None and value < 0:
        raise ValueError(f"{name}: {value} must not be negative")
    return value or None


def _cuda_graphs(args: Any, cuda_graph_impl: str) -> int | None:
    """The engine's graph count with Megatron's own (local) CUDA graphs, else None
    (``get_inference_config_from_model_and_args``: ``num_cuda_graphs`` only for ``local``)."""
    if cuda_graph_impl != "local":
        return None
    graphs = get_int(args, "inference_dynamic_batching_num_cuda_graphs", DEFAULT_CUDA_GRAPHS)
    if graphs < AUTOMATIC_CUDA_GRAPHS:
        raise ValueError(
            f"inference_dynamic_batching_num_cuda_graphs: {graphs} is neither -1 nor a count"
        )
    return int(graphs)


def requests_in_flight(args: Any) -> int:
    """The rollouts the RL agent keeps generating at once, over all engines: groups in flight
    (``rl_parallel_generation_tasks``, as Megatron-LM's ``validate_args`` resolves it) times
    ``--grpo-group-size``. ``GroupedRolloutGenerator.get_grouped_rollouts`` (megatron/rl/agent/
    api.py at 4e85d74ae9) starts that many group tasks, each asking for its group's rollouts.
    Unresolved args resolve as ``validate_args`` does: ``--rl-num-parallel-generations``
    rollouts, or ``--rl-num-parallel-generation-batches`` x ``--rl-generation-batch-size``
    (default ``--grpo-prompts-per-step``) groups, else 512 groups. A raw
    ``--rl-parallel-generation-tasks`` (deprecated) is taken as groups without the
    ``--rl-partial-rollouts`` Megatron then requires: resolved args carry it too."""
    group = get_size(args, "grpo_group_size", DEFAULT_GROUP_SIZE)
    tasks = _unset_or_positive(args, "rl_parallel_generation_tasks")
    rollouts = _unset_or_positive(args, "rl_num_parallel_generations")
    batches = _unset_or_positive(args, "rl_num_parallel_generation_batches")
    if rollouts is not None and batches is not None:
        raise ValueError(
            "rl_num_parallel_generations and rl_num_parallel_generation_batches are mutually "
            "exclusive"
        )
    if (rollouts is not None or batches is not None) and not get_flag(args, "rl_partial_rollouts"):
        raise ValueError(
            "rl_num_parallel_generations and rl_num_parallel_generation_batches require "
            "rl_partial_rollouts"
        )
    if tasks is not None:
        return tasks * group
    if rollouts is not None:
        if rollouts % group:
            raise ValueError(
                f"rl_num_parallel_generations ({rollouts}) must be divisible by grpo_group_size "
                f"({group})"
            )
        return rollouts
    if batches is not None:
        per_batch = _unset_or_positive(args, "rl_generation_batch_size") or get_size(
            args, "grpo_prompts_per_step", DEFAULT_PROMPTS_PER_STEP
        )
        return batches * per_batch * group
    return DEFAULT_GENERATION_TASKS * group


def rl_from_args(args: Any, cuda_graph_impl: str = "none") -> RlSpec | None:
    """The RL inference engine's settings, or None when the args do not run the RL loop.
    ``cuda_graph_impl`` is the spec's (``--enable-cuda-graph`` read as ``local``)."""
    if not get_flag(args, "perform_rl_step"):
        return None
    unified = get_int(args, "inference_dynamic_batching_unified_memory_level", 0)
    if unified not in (0, 1):
        raise ValueError(
            f"inference_dynamic_batching_unified_memory_level: {unified} is not 0 or 1"
        )
    mode = get_choice(args, "rl_kv_cache_management_mode", "persist", KV_MODES)
    persist_graphs = get_flag(args, "rl_persist_cuda_graphs")
    if mode == "offload" and unified:
        raise ValueError("rl_kv_cache_management_mode offload is incompatible with unified memory")
    if mode == "offload" and not persist_graphs:
        raise ValueError("rl_kv_cache_management_mode offload requires rl_persist_cuda_graphs")
    if get_int(args, "num_speculative_tokens", 0):
        raise ValueError("speculative decoding in the RL loop's engine is not modelled")
    max_requests = _unset_or_positive(args, "inference_dynamic_batching_max_requests")
    max_tokens = _unset_or_positive(args, "inference_dynamic_batching_max_tokens")
    if max_requests and max_tokens and max_tokens < max_requests:
        raise ValueError(
            f"inference_dynamic_batching_max_tokens ({max_tokens}) must be at least "
            f"inference_dynamic_batching_max_requests ({max_requests})"
        )
    return RlSpec(
        buffer_size_gib=get_float(args, "inference_dynamic_batching_buffer_size_gb", 40.0, 0.0),
        paused_buffer_size_gib=get_float(
            args, "inference_dynamic_batching_paused_buffer_size_gb", 0.0, 0.0
        ),
        block_size_tokens=get_size(args, "inference_dynamic_batching_block_size", 256),
        unified_memory_level=unified,
        kv_cache_mode=mode,
        persist_cuda_graphs=persist_graphs,
        remove_kv_flag=get_flag(args, "rl_remove_kv_cache_during_training"),
        inference_tp=_unset_or_positive(args, "rl_inference_tensor_model_parallel_size"),
        inference_pp=_unset_or_positive(args, "rl_inference_pipeline_model_parallel_size"),
        inference_ep=_unset_or_positive(args, "rl_inference_expert_model_parallel_size"),
        inference_etp=_unset_or_positive(args, "rl_inference_expert_tensor_model_parallel_size"),
        inference_cuda_graphs=_cuda_graphs(args, cuda_graph_impl),
        max_sequence_length=get_size(args, "inference_max_seq_length", 2560),
        max_requests=max_requests,
        max_tokens=max_tokens,
        mixed_prefill_requests=get_int(
            args, "inference_dynamic_batching_cuda_graph_mixed_prefill_count", 16
        ),
        decode_only_cuda_graphs=get_flag(args, "decode_only_cuda_graphs"),
        offload_optimizer=get_flag(args, "rl_offload_optimizer_during_inference"),
        training_cuda_graphs=get_flag(args, "rl_training_cuda_graphs"),
        requests_in_flight=requests_in_flight(args),
        sampling_top_p=get_float(args, "rl_default_top_p", 0.0, 0.0, 1.0),
        return_log_probs=get_flag(args, "return_log_probs"),
    )
