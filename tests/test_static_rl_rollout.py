"""The RL loop's rollout moment (analysis/static/rl_rollout.py): what the offload moves to the
host, how many requests one engine runs at once, which steps run eager, and when the
rollout, not the training step, is the rank's peak. Counts by hand against Megatron-LM's
code at 4e85d74ae9; the step's terms themselves are measured in
tests/test_rl_rollout_measured.py."""

from __future__ import annotations

import dataclasses

import pytest

from memscope.analysis.static.coverage import not_modelled
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition
from memscope.analysis.static.report import operator_records
from memscope.analysis.static.rl import kv_buffer_bytes, max_requests
from memscope.analysis.static.rl_rollout import eager_tokens, engine_requests
from memscope.inputs.megatron_args import spec_from_megatron_args
from memscope.inputs.rl_args import requests_in_flight

ARGS = dict(num_layers=4, hidden_size=256, num_attention_heads=8, num_query_groups=4,
            group_query_attention=True, kv_channels=32, seq_length=512, vocab_size=32000,
            micro_batch_size=1, global_batch_size=8, bf16=True, tensor_model_parallel_size=2,
            world_size=8, swiglu=True, disable_bias_linear=True,
            untie_embeddings_and_output_weights=True, transformer_impl="transformer_engine",
            attention_backend="flash", use_distributed_optimizer=True,
            perform_rl_step=True, inference_dynamic_batching_buffer_size_gb=0.05,
            inference_max_seq_length=512)  # fmt: skip


def _spec(**extra):
    return dataclasses.replace(spec_from_megatron_args({**ARGS, **extra}), gpu="h100")


def _rank(spec, pp_rank=0):
    return estimate_rank(spec, RankPosition(0, pp_rank))


def test_the_agents_in_flight_rollouts_resolve_as_megatron_lm_does():
    def flight(**args):
        return requests_in_flight(args)

    assert flight() == 512 * 2  # 512 groups of the default group size
    assert flight(grpo_group_size=8) == 512 * 8
    assert flight(rl_parallel_generation_tasks=16, grpo_group_size=4) == 64  # groups
    assert flight(rl_num_parallel_generations=24, grpo_group_size=4) == 24  # rollouts
    assert flight(rl_num_parallel_generation_batches=2, grpo_prompts_per_step=8) == 2 * 8 * 2
    assert flight(rl_num_parallel_generation_batches=2, rl_generation_batch_size=3) == 12
    with pytest.raises(ValueError, match="divisible by grpo_group_size"):
        flight(rl_num_parallel_generations=10, grpo_group_size=4)
    with pytest.raises(ValueError, match="cannot both be positive"):
        _spec(rl_default_top_k=5, rl_default_top_p=0.5)


def test_one_engine_runs_its_round_robin_share_at_most_max_requests():
    # world 8 at TP 2: 4 data-parallel engines
    spec = _spec(rl_parallel_generation_tasks=10, grpo_group_size=2)
    assert engine_requests(spec) == 5  # ceil(20 / 4)
    spec = _spec(rl_parallel_generation_tasks=4096, grpo_group_size=2)
    assert engine_requests(spec) == max_requests(spec) < 4096 * 2 // 4


def test_steps_run_eager_unless_a_captured_graph_covers_every_one():
    spec = _spec(rl_parallel_generation_tasks=10, grpo_group_size=2)
    assert eager_tokens(spec) == 5 * 512  # every request's context, under max_tokens 16384
    spec = _spec(rl_parallel_generation_tasks=10, grpo_group_size=2,
                 inference_dynamic_batching_max_tokens=2048)  # fmt: skip
    assert eager_tokens(spec) == 2048
    # 5 requests, no more than the graphs' 16 mixed prefill requests, but 2560 tokens: eager
    graphed = _spec(rl_parallel_generation_tasks=10, grpo_group_size=2, cuda_graph_impl="local")
    assert eager_tokens(graphed) == 5 * 512
    # short contexts fit the largest graph (max_requests tokens): nothing runs eager
    short = _spec(rl_parallel_generation_tasks=2, grpo_group_size=2, cuda_graph_impl="local",
                  inference_max_seq_length=16)  # fmt: skip
    assert eager_tokens(short) == 0
    assert _rank(short).rollout.forward_bytes == 0


def test_the_offload_moves_the_optimizer_and_the_first_chunks_gradients():
    est = _rank(_spec(rl_offload_optimizer_during_inference=True))
    r, per = est.rollout, est.persistent
    assert r.offloaded_optimizer_bytes == per.optimizer_bytes > 0
    assert r.offloaded_grad_bytes == per.grad_bytes  # one chunk: all of them
    kept = _rank(_spec(rl_offload_optimizer_during_inference=True, rl_training_cuda_graphs=True))
    assert kept.rollout.offloaded_grad_bytes == 0  # grad buffers stay for the graphs
    assert _rank(_spec()).rollout.offloaded_bytes == 0  # no offload flag
    # virtual pipeline chunks: model[0] alone offloads its buffers
    vpp = dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1,
               rl_offload_optimizer_during_inference=True)  # fmt: skip
    chunked = _rank(_spec(**vpp), pp_rank=1)
    first = sum(t.numel for t in chunked.params if t.name.startswith("chunk0."))
    assert 0 < first < chunked.persistent.param_count
    grads = chunked.persistent.grad_bytes * first // chunked.persistent.param_count
    assert chunked.rollout.offloaded_grad_bytes == grads


def test_the_kv_buffer_comes_back_for_the_rollout_where_the_step_runs_without_it():
    resident = _rank(_spec())
    assert resident.rollout.kv_cache_bytes == 0  # already in the steady state
    recompute = _spec(rl_kv_cache_management_mode="recompute")
    est = _rank(recompute)
    assert "rl_inference_kv_cache" not in est.workspaces
    assert est.rollout.kv_cache_bytes == kv_buffer_bytes(recompute)


def test_a_full_engine_without_the_offload_peaks_in_the_rollout():
    # 4096 requests per engine over a 32000-token vocabulary: ~1.6 GiB of logits work
    full = _spec(rl_parallel_generation_tasks=8192, grpo_group_size=2,
                 inference_dynamic_batching_buffer_size_gb=2.0,
                 inference_dynamic_batching_max_requests=4096)  # fmt: skip
    est = _rank(full)
    r = est.rollout
    assert r.requests == 4096
    assert r.logits_bytes == 4096 * 32000 * (2 + 12)  # bf16 logits + fp32 copy, rows, log_softmax
    assert est.peak_stage == "rl_rollout"
    between = est.steady_bytes - est.persistent.total_bytes - est.workspace_bytes
    assert est.transient_bytes == between + r.transient_bytes
    assert sum(est.components().values()) == est.peak_memory_bytes
    records = {op["name"]: op["memory_bytes"] for op in operator_records(full, est)}
    assert records["rl_rollout.logits"] == r.logits_bytes
    # the offload lowers the rollout's moment by what it moves to the host
    on_host = dataclasses.replace(full, rl=dataclasses.replace(full.rl, offload_optimizer=True))
    offloaded = _rank(on_host)
    moved = offloaded.rollout.offloaded_bytes
    assert moved == est.persistent.optimizer_bytes + est.persistent.grad_bytes
    assert offloaded.rollout.transient_bytes == r.transient_bytes - moved
    assert offloaded.peak_stage == "rl_rollout"  # the logits still outweigh this small model
    assert offloaded.peak_memory_bytes == est.peak_memory_bytes - moved
    components = offloaded.components()
    assert components["optimizer_state"] == 0 and components["gradients"] == 0


def test_training_graphs_stay_warned_while_their_flag_is_read():
    spec = _spec(rl_training_cuda_graphs=True, cuda_graph_impl="local")
    keys = {item.key for item in not_modelled({"rl_training_cuda_graphs": True}, spec)}
    assert keys == {"rl_training_cuda_graphs"}
