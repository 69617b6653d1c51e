"""The RL loop's inference engine (analysis/static/rl.py): the KV-cache buffer as megatron-core's
own ``DynamicInferenceContext`` allocates it (built on the CPU), the separate inference model's
weights, and when each stays on the GPU while the trainer steps."""

from __future__ import annotations

import dataclasses
import warnings
from unittest import mock

import pytest

from memscope.analysis.static.coverage import modelled_features
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition, rank_param_count
from memscope.analysis.static.read_keys import READ_KEYS
from memscope.analysis.static.rl import (
    RL_KEYS,
    graph_batch_dimensions,
    inference_graph_bytes,
    inference_parallel,
    kv_block_bytes,
    kv_buffer_bytes,
    max_requests,
)
from memscope.inputs.megatron_args import spec_from_megatron_args

ARGS = dict(num_layers=6, hidden_size=256, num_attention_heads=8, num_query_groups=4,
            group_query_attention=True, kv_channels=32, seq_length=512, vocab_size=8192,
            micro_batch_size=1, global_batch_size=8, bf16=True, tensor_model_parallel_size=2,
            world_size=8, swiglu=True, disable_bias_linear=True,
            untie_embeddings_and_output_weights=True, transformer_impl="transformer_engine",
            attention_backend="flash")  # fmt: skip
RL = dict(perform_rl_step=True, inference_dynamic_batching_buffer_size_gb=0.01)


def _spec(**extra):
    return dataclasses.replace(spec_from_megatron_args({**ARGS, **extra}), gpu="h100")


def _rank(spec, tp_rank=0):
    return estimate_rank(spec, RankPosition(tp_rank, 0))


@pytest.mark.parametrize(
    ("layers", "heads", "groups", "head_dim", "tp", "gib"),
    [(3, 4, 4, 16, 2, 0.01), (6, 8, 2, 32, 2, 0.02), (4, 16, 8, 64, 4, 0.05)],
)
def test_the_kv_buffer_is_the_one_megatron_cores_dynamic_context_allocates(
    layers, heads, groups, head_dim, tp, gib
):
    import torch

    with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):  # CPU build
        from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext

        # Megatron-LM passes the KV heads (num_query_groups) and num_layers // pp
        context = DynamicInferenceContext(
            params_dtype=torch.bfloat16, num_layers=layers, kv_channels=head_dim,
            num_attention_heads=groups, max_sequence_length=512, buffer_size_gb=gib,
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        )  # fmt: skip
    spec = _spec(
        perform_rl_step=True, num_layers=layers, num_attention_heads=heads, num_query_groups=groups,
        kv_channels=head_dim, hidden_size=heads * head_dim, tensor_model_parallel_size=tp,
        world_size=8, inference_dynamic_batching_buffer_size_gb=gib,
    )  # fmt: skip
    assert kv_block_bytes(spec) == context.block_size_bytes
    assert kv_buffer_bytes(spec) == context.memory_buffer.nbytes


def test_the_kv_buffer_stays_allocated_beside_the_training_state():
    base, rl = _rank(_spec()), _rank(_spec(**RL))
    kv = rl.workspaces["rl_inference_kv_cache"]
    # 0.01 GiB in whole blocks of 2 (K, V) x 6 layers x 256 tokens x 2 heads x 32 x 2 bytes
    block = 2 * 6 * 256 * 2 * 32 * 2
    assert kv == int(0.01 * 1024**3) // block * block
    assert rl.steady_bytes == base.steady_bytes + kv
    # the peak also holds the loss's full-vocabulary logits (rl_loss.py), not cross entropy's
    assert rl.peak_memory_bytes > base.peak_memory_bytes + kv
    assert rl.activations.peak_moment == "rl_log_probs_backward"
    assert rl.activations.detail["rl_log_probs_saved"] == 1 * 512 * 8192 * 2  # [b, s, V] bf16
    assert rl.persistent == base.persistent and rl.weight_terms == {}  # no second model
    assert any(f.startswith("RL loop") for f in modelled_features(_spec(**RL)))


@pytest.mark.parametrize(
    ("extra", "counted"),
    [
        ({}, True),  # persist, the default: deallocate_inference_state_buffers returns
        ({"rl_kv_cache_management_mode": "recompute"}, False),  # deleted
        # unified memory: deallocate_inference_state_buffers returns at once
        (
            {
                "rl_kv_cache_management_mode": "recompute",
                "inference_dynamic_batching_unified_memory_level": 1,
            },
            True,
        ),
        # --rl-persist-cuda-graphs: a torch_memory_saver region, paused, blocks still counted
        ({"rl_kv_cache_management_mode": "offload", "rl_persist_cuda_graphs": True}, True),
        ({"rl_kv_cache_management_mode": "recompute", "rl_persist_cuda_graphs": True}, True),
        ({"rl_remove_kv_cache_during_training": True}, False),  # the older flags
        ({"rl_offload_kv_cache_during_training": True}, True),  # a torch_memory_saver pause
    ],
)
def test_the_kv_buffer_leaves_the_counter_only_where_megatron_deletes_it(extra, counted):
    est = _rank(_spec(**RL, cuda_graph_impl="local", **extra))
    assert ("rl_inference_kv_cache" in est.workspaces) is counted
    assert "rl_inference_cuda_graphs" in est.workspaces  # the runners keep their outputs


def test_unified_memory_adds_the_paused_buffers_blocks():
    paused = dict(RL, inference_dynamic_batching_paused_buffer_size_gb=0.005)
    plain = _spec(**paused)
    unified = _spec(**paused, inference_dynamic_batching_unified_memory_level=1)
    block = 2 * 6 * 256 * 2 * 32 * 2  # K and V x 6 layers x 256 tokens x 2 groups/rank x 32 x 2
    assert kv_buffer_bytes(plain) == int(0.01 * 1024**3) // block * block
    extra = int(0.005 * 1024**3) // block * block
    assert kv_buffer_bytes(unified) == kv_buffer_bytes(plain) + extra


def _hand_count(tp: int) -> int:
    """Parameters of one tensor rank of ARGS' model, counted by hand: untied 8192-token
    embedding and output layer, the learned 512-position table, 6 layers of QKV (8 heads + 2
    x 4 groups of 32), proj, SwiGLU fc1 (2 x 1024) and fc2, two LayerNorms (weight and bias)
    each, the final LayerNorm (the tables and norms other than the vocabulary's are
    replicated)."""
    h, ffn, kv = 256, 4 * 256, 4 * 32
    layer = (h * (h + 2 * kv) + h * h + h * 2 * ffn + ffn * h) // tp + 2 * 2 * h
    return 2 * 8192 * h // tp + 512 * h + 6 * layer + 2 * h


def test_a_separate_inference_model_adds_its_weights_at_the_inference_sizes():
    # trained at TP 2, rolled out at TP 4: a second copy of the weights, a quarter per rank
    base = _spec(**RL)
    separate = _spec(**RL, rl_inference_tensor_model_parallel_size=4)
    assert rank_param_count(base, RankPosition(1, 0)) == _hand_count(2)
    est = _rank(separate, tp_rank=1)
    assert est.weight_terms == {"rl_inference_model_weights": 2 * _hand_count(4)}
    assert est.persistent.grad_bytes == _rank(base, tp_rank=1).persistent.grad_bytes
    # its KV cache is split at the inference TP: 4 query groups over 4 ranks
    assert kv_block_bytes(separate) == kv_block_bytes(base) // 2
    # counted also when idle-offloaded: unified-memory prefetch or a torch_memory_saver
    # pause moves the pages, torch's blocks stay
    idle = _rank(_spec(**RL, rl_inference_tensor_model_parallel_size=4,
                       rl_offload_inference_model_weights_when_idle=True), tp_rank=1)  # fmt: skip
    assert idle.weight_terms == est.weight_terms


def test_the_inference_models_expert_tensor_size_is_the_trainers_unless_given():
    moe = dict(RL, num_experts=4, moe_ffn_hidden_size=128, expert_model_parallel_size=2,
               moe_grouped_gemm=True, rl_inference_tensor_model_parallel_size=1)  # fmt: skip
    trained = _spec(**moe)
    assert inference_parallel(trained).tp == 1
    assert inference_parallel(trained).etp == 2  # the trainer's (expert) tensor size, 2
    given = _spec(**moe, rl_inference_expert_tensor_model_parallel_size=1)
    assert inference_parallel(given).etp == 1


def test_rl_settings_are_read_and_bad_ones_refused():
    assert _spec().rl is None
    rl = _spec(**RL, rl_inference_tensor_model_parallel_size=0, cuda_graph_impl="local").rl
    assert rl is not None and not rl.separate_model  # a size of 0 is not given
    assert rl.inference_cuda_graphs == 16  # Megatron-LM's default count
    assert _spec(**RL).rl.inference_cuda_graphs is None  # no local graphs, none captured
    assert _spec(**RL, enable_cuda_graph=True).rl.inference_cuda_graphs == 16  # local too
    refused = [
        ({"rl_kv_cache_management_mode": "keep"}, "rl_kv_cache_management_mode"),
        ({"rl_kv_cache_management_mode": "offload"}, "requires rl_persist_cuda_graphs"),
        ({"rl_kv_cache_management_mode": "offload", "rl_persist_cuda_graphs": True,
          "inference_dynamic_batching_unified_memory_level": 1}, "incompatible"),
        ({"inference_dynamic_batching_unified_memory_level": 2}, "is not 0 or 1"),
        ({"rl_inference_tensor_model_parallel_size": 3}, "RL inference model"),
        ({"rl_inference_pipeline_model_parallel_size": 2}, "pipeline stages"),
        ({"inference_dynamic_batching_buffer_size_gb": 0.0001, "cuda_graph_impl": "local"},
         "holds no request"),
        ({"inference_dynamic_batching_max_requests": 3}, "must divide by"),
        ({"inference_dynamic_batching_max_requests": 64,
          "inference_dynamic_batching_max_tokens": 32}, "must be at least"),
        ({"num_speculative_tokens": 2}, "speculative"),
        ({"multi_latent_attention": True, "kv_lora_rank": 64, "q_lora_rank": None,
          "qk_head_dim": 32, "qk_pos_emb_head_dim": 16, "v_head_dim": 32},
         "multi-latent-attention"),
    ]  # fmt: skip
    for extra, message in refused:
        with pytest.raises(ValueError, match=message):
            _spec(**{**RL, **extra})
    assert RL_KEYS <= READ_KEYS  # read, so never reported as ignored
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _spec(**RL)


@pytest.mark.parametrize(
    ("gib", "graphs", "seq", "tp"),
    [(0.01, 1, 128, 2), (0.05, 4, 256, 2), (0.02, 16, 1024, 4), (0.03, 3, 64, 1)],
)
def test_the_captured_batch_dimensions_are_megatron_cores(gib, graphs, seq, tp):
    import torch

    with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):  # CPU build
        from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext

        context = DynamicInferenceContext(
            params_dtype=torch.bfloat16, num_layers=6, kv_channels=32, num_attention_heads=4,
            max_sequence_length=seq, buffer_size_gb=gib, tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=1, num_cuda_graphs=graphs,
        )  # fmt: skip
    spec = _spec(
        perform_rl_step=True, cuda_graph_impl="local", tensor_model_parallel_size=tp,
        inference_dynamic_batching_buffer_size_gb=gib,
        inference_dynamic_batching_num_cuda_graphs=graphs, inference_max_seq_length=seq,
    )  # fmt: skip
    assert max_requests(spec) == context.max_requests
    captured = {
        (d.token_count, d.prefill_req_count, d.decode_req_count)
        for d in context.cuda_graph_batch_dimensions_list
    }
    assert graph_batch_dimensions(spec) == captured and captured


def test_the_inference_graphs_keep_each_layers_output_and_the_first_layers_input():
    # 0.01 GiB at TP 2, 1 graph, max_sequence_length 128: max_requests 24 (the test above
    # checks it and the dimensions against megatron-core), so a mixed (16 prefill + 8
    # decode), a prefill-only and a decode-only dimension of 24 tokens
    one = dict(RL, cuda_graph_impl="local", inference_dynamic_batching_num_cuda_graphs=1,
               inference_max_seq_length=128)  # fmt: skip
    graphed = _spec(**one)
    assert graph_batch_dimensions(graphed) == {(24, 16, 8), (24, 24, 0), (24, 0, 24)}
    # per dimension 6 layers' outputs and the embedding's output, [24, 1, 256] bf16
    assert inference_graph_bytes(graphed) == 3 * (6 + 1) * 24 * 256 * 2
    assert _rank(graphed).workspaces["rl_inference_cuda_graphs"] == 3 * 7 * 24 * 256 * 2
    decode_only = _spec(**one, decode_only_cuda_graphs=True)
    assert graph_batch_dimensions(decode_only) == {(24, 0, 24)}
    # sequence parallelism splits each graphed hidden state over the tensor ranks
    assert inference_graph_bytes(_spec(**one, sequence_parallel=True)) == 3 * 7 * 12 * 256 * 2
    # interleaved stages: one first-layer input per model chunk (6 layers, pp 2, vpp 3 -> 3
    # chunks of one layer per stage)
    vpp = _spec(**one, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1)
    assert inference_graph_bytes(vpp, 1) == len(graph_batch_dimensions(vpp)) * 3 * 2 * (
        max_requests(vpp) * 256 * 2
    )
    # RoPE: the captures' rotary table, [max(128, 24), 1, 1, 32 channels] fp32, once (every
    # dimension asks for the same length); half the channels with rotary_percent 0.5
    outputs = 3 * 7 * 24 * 256 * 2
    rope = _spec(**one, position_embedding_type="rope")
    assert inference_graph_bytes(rope) == outputs + 128 * 32 * 4
    half = _spec(**one, position_embedding_type="rope", rotary_percent=0.5)
    assert inference_graph_bytes(half) == outputs + 128 * 16 * 4
    # a token count above the context's length asks for its own, longer table
    long = _spec(**{**one, "inference_max_seq_length": 16}, position_embedding_type="rope")
    assert {t for t, _, _ in graph_batch_dimensions(long)} == {24}
    assert inference_graph_bytes(long) - outputs == 24 * 32 * 4


def test_the_planner_passes_over_layouts_the_rl_engine_refuses():
    from memscope.analysis.static.planner import plan

    # on 6 GPUs an inference TP of 4 divides nothing: every layout is refused, none raises
    separate = _spec(**RL, rl_inference_tensor_model_parallel_size=4)
    assert plan(separate, 6, 80 * 1024**3, top=3)["world_size"] == 6
    # a KV buffer of a few blocks holds no request at TP 8: that layout is left out
    tiny = _spec(**{**RL, "cuda_graph_impl": "local",
                    "inference_dynamic_batching_buffer_size_gb": 0.002})  # fmt: skip
    assert plan(tiny, 8, 80 * 1024**3, top=3)["world_size"] == 8
