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
from memscope.analysis.static.rl import graph_batch_dimensions, kv_buffer_bytes, max_requests
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
    partial = dict(rl_partial_rollouts=True)
    assert flight(rl_num_parallel_generations=24, grpo_group_size=4, **partial) == 24
    assert flight(rl_num_parallel_generation_batches=2, grpo_prompts_per_step=8, **partial) == 32
    assert flight(rl_num_parallel_generation_batches=2, rl_generation_batch_size=3, **partial) == 12
    # what Megatron-LM's validate_args asserts
    refused = [
        ({"rl_num_parallel_generations": 10, "grpo_group_size": 4, **partial}, "divisible by"),
        ({"rl_num_parallel_generations": 8}, "require rl_partial_rollouts"),
        ({"rl_num_parallel_generations": 8, "rl_num_parallel_generation_batches": 2, **partial},
         "mutually exclusive"),
    ]  # fmt: skip
    for args, message in refused:
        with pytest.raises(ValueError, match=message):
            flight(**args)
    # the offload calls DDP's offload_grad_buffers, which an FSDP-wrapped model lacks
    with pytest.raises(ValueError, match="FSDP-wrapped"):
        _spec(
            rl_offload_optimizer_during_inference=True,
            use_torch_fsdp2=True,
            use_distributed_optimizer=False,
            gradient_accumulation_fusion=False,
        )


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
    # decode-only graphs (--decode-only-cuda-graphs): prefill steps always run eager
    decode_only = _spec(rl_parallel_generation_tasks=2, grpo_group_size=2,
                        cuda_graph_impl="local", inference_max_seq_length=16,
                        decode_only_cuda_graphs=True)  # fmt: skip
    assert eager_tokens(decode_only) == 1 * 16  # 4 rollouts over 4 engines


def test_the_forward_holds_two_hidden_states_and_one_layers_working_set():
    # 2 requests of 512-token contexts: 1024 tokens; TP 2, TE layers, fused SwiGLU, ffn 4 h
    spec = _spec(rl_parallel_generation_tasks=4, grpo_group_size=2)  # 8 / 4 engines
    t, h, f = 1024, 256, 1024 // 2
    # the MLP beside the attention's output: TE's fused norm inside fc1, or fc1 + act
    mlp = h + max(h + 2 * f, 2 * f + f)
    assert _rank(spec).rollout.forward_bytes == (2 * t * h + t * mlp) * 2


def test_the_offload_moves_the_optimizer_and_the_first_chunks_gradients():
    est = _rank(_spec(rl_offload_optimizer_during_inference=True))
    r, per = est.rollout, est.persistent
    assert r.offloaded_optimizer_bytes == per.optimizer_bytes > 0
    assert r.offloaded_grad_bytes == per.grad_bytes  # one chunk: all of them
    kept = _rank(_spec(rl_offload_optimizer_during_inference=True, rl_training_cuda_graphs=True))
    assert kept.rollout.offloaded_grad_bytes == 0  # grad buffers stay for the graphs
    assert _rank(_spec()).rollout.offloaded_bytes == 0  # no offload flag
    # virtual pipeline chunks: model[0] alone offloads its buffers; on stage 1, chunk 0 is
    # one decoder layer at TP 2: QKV 256 x (256 + 2 x 4 x 32) / 2, projection 256 x 256 / 2,
    # SwiGLU fc1 256 x 2 x 1024 / 2 and fc2 1024 x 256 / 2, two LayerNorms' weight and bias
    vpp = dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1,
               rl_offload_optimizer_during_inference=True)  # fmt: skip
    layer = 256 * 512 // 2 + 256 * 256 // 2 + 256 * 2048 // 2 + 1024 * 256 // 2 + 4 * 256
    chunked = _rank(_spec(**vpp), pp_rank=1)
    assert chunked.rollout.offloaded_grad_bytes == layer * 4  # fp32 main gradients


def test_the_kv_buffer_comes_back_for_the_rollout_where_the_step_runs_without_it():
    resident = _rank(_spec())
    assert resident.rollout.kv_cache_bytes == 0  # already in the steady state
    recompute = _spec(rl_kv_cache_management_mode="recompute")
    est = _rank(recompute)
    assert "rl_inference_kv_cache" not in est.workspaces
    assert est.rollout.kv_cache_bytes == kv_buffer_bytes(recompute)
    records = {op["name"]: op for op in operator_records(recompute, est)}
    assert records["rl_rollout.kv_cache"]["category"] == "other"
    # a 2 GiB buffer the rollout brings back sets the peak; it counts as a buffer there
    big = _spec(rl_kv_cache_management_mode="recompute",
                inference_dynamic_batching_buffer_size_gb=2.0)  # fmt: skip
    peak = _rank(big)
    assert peak.peak_stage == "rl_rollout"
    assert peak.components()["other"] == peak.workspace_bytes + kv_buffer_bytes(big)


def test_a_full_engine_without_the_offload_peaks_in_the_rollout():
    # 4096 requests per engine over a 32000-token vocabulary: ~1.6 GiB of logits work
    full = _spec(rl_parallel_generation_tasks=8192, grpo_group_size=2,
                 inference_dynamic_batching_buffer_size_gb=2.0,
                 inference_dynamic_batching_max_requests=4096)  # fmt: skip
    est = _rank(full)
    r = est.rollout
    assert r.requests == 4096
    # bf16 logits + their fp32 copy, the indexed rows, log_softmax (the TP 2 gather: 2.5 x 2)
    assert r.logits_bytes == 4096 * 32000 * (2 + 12)
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


def test_return_log_probs_keeps_every_tokens_logits_padded_to_the_graph():
    # one request per engine, 20-token contexts: the step's 20 tokens replay the smallest
    # dimension covering them (graphs every 16 tokens), whose logits are all kept
    spec = _spec(rl_parallel_generation_tasks=2, grpo_group_size=2, cuda_graph_impl="local",
                 inference_max_seq_length=20, return_log_probs=True)  # fmt: skip
    covering = min(t for t, p, _ in graph_batch_dimensions(spec) if t >= 20 and p >= 1)
    assert covering == 32
    assert _rank(spec).rollout.logits_bytes == covering * 32000 * (2 + 4 + 4)


def test_a_decode_step_takes_the_last_token_branch_even_with_return_log_probs():
    # max_tokens = max_requests = 64: 64 decode requests' rows cost more per row (the
    # indexed copy) than the 64-token step's full-sequence branch
    spec = _spec(rl_parallel_generation_tasks=128, grpo_group_size=2, return_log_probs=True,
                 inference_dynamic_batching_max_requests=64,
                 inference_dynamic_batching_max_tokens=64)  # fmt: skip
    assert engine_requests(spec) == 64
    assert _rank(spec).rollout.logits_bytes == 64 * 32000 * (2 + 4 + 4 + 4)


def test_return_log_probs_keeps_every_tokens_logits():
    base = dict(rl_parallel_generation_tasks=10, grpo_group_size=2)  # 5 requests per engine
    est = _rank(_spec(**base, return_log_probs=True))
    tokens, rows = 5 * 512, 5  # the step's every token; sampling on the last tokens' rows
    every = tokens * 32000
    # the fp32 copy of [T, V] bf16 logits and its log_softmax, above the logits
    assert est.rollout.logits_bytes == every * (2 + 4 + 4)
    assert every * (2 + 4 + 4) > every * 2 + rows * 32000 * (2 + 3 * 2)  # sampling's is less
    assert _rank(_spec(**base)).rollout.logits_bytes == rows * 32000 * (2 + 12)


def test_the_graphs_capture_runs_the_layers_and_the_logits_eagerly():
    spec = _spec(rl_parallel_generation_tasks=10, grpo_group_size=2, cuda_graph_impl="local",
                 inference_dynamic_batching_max_requests=64)  # fmt: skip
    r = _rank(spec).rollout
    t, h, f = 64, 256, 1024 // 2  # the largest graph: max_requests tokens
    # the warm-ups' input, its zeros_like copy and the previous output beside the layer
    forward = (3 * t * h + t * (h + max(h + 2 * f, 3 * f))) * 2
    logits = 64 * 32000 * 2 * 2 + 64 * 16000 * 2  # all-gather buffer, concatenation, shard
    assert r.capture_bytes == max(forward, logits) == logits
    assert _rank(_spec()).rollout.capture_bytes == 0  # no local graphs
    # off the last stage the warm-up's logits are the broadcast buffer alone
    staged = _spec(rl_parallel_generation_tasks=10, grpo_group_size=2, cuda_graph_impl="local",
                   inference_dynamic_batching_max_requests=64,
                   pipeline_model_parallel_size=2)  # fmt: skip
    assert _rank(staged, pp_rank=0).rollout.capture_bytes == 64 * 32000 * 2
    assert _rank(staged, pp_rank=1).rollout.capture_bytes == logits


def test_a_prefill_graph_covers_any_step_it_fits():
    # 4 rollouts per engine of 16-token contexts: 64 tokens, every request in prefill, more
    # than the mixed dimensions' 2 prefill requests; the prefill-only dimension at the
    # largest token count (max_requests) holds as many prefill requests: it fits
    fits = _spec(rl_parallel_generation_tasks=8, grpo_group_size=2, cuda_graph_impl="local",
                 inference_max_seq_length=16,
                 inference_dynamic_batching_cuda_graph_mixed_prefill_count=2)  # fmt: skip
    top = max_requests(fits)
    assert (top, top, 0) in graph_batch_dimensions(fits)
    assert engine_requests(fits) == 4 and eager_tokens(fits) == 0


def test_the_forward_on_a_one_layer_stage_holds_one_hidden_state():
    one = _spec(rl_parallel_generation_tasks=4, grpo_group_size=2, num_layers=2,
                pipeline_model_parallel_size=2, world_size=8)  # fmt: skip
    assert engine_requests(one) == 4  # 8 rollouts over 2 data-parallel engines (TP 2, PP 2)
    t, h, f = 4 * 512, 256, 1024 // 2  # 4 requests' 512-token contexts
    mlp = h + max(h + 2 * f, 3 * f)
    assert _rank(one).rollout.forward_bytes == (1 * t * h + t * mlp) * 2
