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
    assert rl.peak_memory_bytes == base.peak_memory_bytes + kv
    assert rl.persistent == base.persistent and rl.weight_terms == {}  # no second model
    assert any(f.startswith("RL loop") for f in modelled_features(_spec(**RL)))


@pytest.mark.parametrize(
    ("extra", "resident"),
    [
        ({}, True),  # persist, the default
        ({"rl_kv_cache_management_mode": "offload"}, False),
        ({"rl_kv_cache_management_mode": "recompute"}, False),
        # under unified memory deallocate_inference_state_buffers returns at once
        (
            {
                "rl_kv_cache_management_mode": "offload",
                "inference_dynamic_batching_unified_memory_level": 1,
            },
            True,
        ),
        ({"rl_offload_kv_cache_during_training": True}, False),  # the older flags
        ({"rl_remove_kv_cache_during_training": True}, False),
    ],
)
def test_the_kv_buffer_leaves_the_gpu_for_training_only_where_megatron_frees_it(extra, resident):
    est = _rank(_spec(**RL, **extra))
    assert ("rl_inference_kv_cache" in est.workspaces) is resident


def test_unified_memory_adds_the_paused_buffers_blocks():
    paused = dict(RL, inference_dynamic_batching_paused_buffer_size_gb=0.005)
    plain, unified = (
        _spec(**paused),
        _spec(**paused, inference_dynamic_batching_unified_memory_level=1),
    )
    block = kv_block_bytes(plain)
    assert kv_buffer_bytes(plain) == int(0.01 * 1024**3) // block * block
    extra = int(0.005 * 1024**3) // block * block
    assert kv_buffer_bytes(unified) == kv_buffer_bytes(plain) + extra


def test_a_separate_inference_model_adds_its_weights_at_the_inference_sizes():
    # trained at TP 2, rolled out at TP 4: a second copy of the weights, a quarter per rank
    base = _spec(**RL)
    separate = _spec(**RL, rl_inference_tensor_model_parallel_size=4)
    est = _rank(separate, tp_rank=1)
    inference = dataclasses.replace(
        separate, parallel=dataclasses.replace(separate.parallel, tp=4, dp=2), rl=None
    )
    weights = 2 * rank_param_count(inference, RankPosition(1, 0))
    assert est.weight_terms == {"rl_inference_model_weights": weights}
    trained = 2 * rank_param_count(base, RankPosition(1, 0))
    assert 0.4 * trained < weights < 0.6 * trained  # half the trainer's TP 2 shard
    assert est.persistent.grad_bytes == _rank(base, tp_rank=1).persistent.grad_bytes
    # its KV cache is split at the inference TP: 4 query groups over 4 ranks
    assert kv_block_bytes(separate) == kv_block_bytes(base) // 2


def test_a_separate_model_paused_outside_the_allocator_is_not_counted():
    idle = dict(RL, rl_inference_tensor_model_parallel_size=4,
                rl_offload_inference_model_weights_when_idle=True)  # fmt: skip
    assert _rank(_spec(**idle)).weight_terms == {}  # torch_memory_saver, outside torch
    managed = _rank(_spec(**idle, rl_inference_model_unified_memory_level=1))
    assert "rl_inference_model_weights" in managed.weight_terms  # pages move, blocks stay


def test_rl_settings_are_read_and_bad_ones_refused():
    assert _spec().rl is None
    rl = _spec(**RL, rl_inference_tensor_model_parallel_size=0, cuda_graph_impl="local").rl
    assert rl is not None and not rl.separate_model  # a size of 0 is not given
    assert rl.inference_cuda_graphs == 16  # Megatron-LM's default count
    with pytest.raises(ValueError, match="rl_kv_cache_management_mode"):
        _spec(**RL, rl_kv_cache_management_mode="keep")
    with pytest.raises(ValueError, match="do not divide the world size"):
        _rank(_spec(**RL, rl_inference_tensor_model_parallel_size=3))
    with pytest.raises(ValueError, match="multi-latent-attention"):
        _rank(_spec(**RL, multi_latent_attention=True, kv_lora_rank=64, q_lora_rank=None,
                    qk_head_dim=32, qk_pos_emb_head_dim=16, v_head_dim=32))  # fmt: skip
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
    graphed = _spec(**RL, cuda_graph_impl="local", inference_dynamic_batching_num_cuda_graphs=4)
    dims = graph_batch_dimensions(graphed)
    # 6 layers' outputs and the embedding's output, [T, 1, 256] bf16, per batch dimension
    assert inference_graph_bytes(graphed) == sum((6 + 1) * t * 256 * 2 for t, _, _ in dims)
    est = _rank(graphed)
    assert est.workspaces["rl_inference_cuda_graphs"] == inference_graph_bytes(graphed)
    assert "rl_inference_cuda_graphs" not in _rank(_spec(**RL)).workspaces  # no local graphs
    freed = _spec(**RL, cuda_graph_impl="local", rl_kv_cache_management_mode="offload")
    assert "rl_inference_cuda_graphs" not in _rank(freed).workspaces  # deleted with the cache
    decode_only = _spec(**RL, cuda_graph_impl="local", decode_only_cuda_graphs=True)
    assert {p for _, p, _ in graph_batch_dimensions(decode_only)} == {0}
    # sequence parallelism splits each graphed hidden state over the tensor ranks
    sp = _spec(**RL, cuda_graph_impl="local", sequence_parallel=True)
    assert inference_graph_bytes(sp) * 2 == inference_graph_bytes(
        _spec(**RL, cuda_graph_impl="local")
    )
