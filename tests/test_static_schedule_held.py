"""Direction and size of the terms that brought the CPU accuracy matrix within 1%.

Each term is derived from megatron-core 0.16.1's code (named in activations.py) and measured
by ``tools/bench_static_accuracy.py`` (rows pp2-full, pp2-m8-swiglu, pp2-selective-gqa,
pp2-vpp2-m4, selective-mqa, selective-gqa-h8g2 of benchmarks/static_accuracy_cpu.txt); here
each is checked by hand on a tiny config.
"""

from __future__ import annotations

import argparse
from typing import Any

from memscope.analysis.static.activations import (
    _schedule_moments,
    attention_backward_work,
    chunk_activations,
    chunk_inputs,
    dims,
    layer_saved,
    mlp_backward_work,
)
from memscope.inputs.megatron_args import spec_from_megatron_args

# s=32 b=2 h=64 a=4 d=16 ffn=256 V=128, fp32, the local spec with its CUDA fusions off
TINY: dict[str, Any] = dict(
    num_layers=2, hidden_size=64, num_attention_heads=4, padded_vocab_size=128, seq_length=32,
    micro_batch_size=2, num_microbatches=4, hidden_dropout=0.0, attention_dropout=0.0,
    transformer_impl="local", bias_swiglu_fusion=False, bias_gelu_fusion=False,
    masked_softmax_fusion=False, gradient_accumulation_fusion=False,
)  # fmt: skip


def tiny(**kw: Any):
    return spec_from_megatron_args(argparse.Namespace(**{**TINY, **kw}))


def test_core_attn_recompute_with_grouped_keys_keeps_the_fused_qkv_and_the_query_copy():
    recompute = dict(recompute_granularity="selective")
    plain = tiny(**recompute)
    gqa = tiny(group_query_attention=True, num_query_groups=2, **recompute)
    mqa = tiny(group_query_attention=True, num_query_groups=1, **recompute)
    x = dims(plain)
    heads, kv = x.heads, x.heads // 2  # a=4: g=2 halves the key/value heads
    assert layer_saved(plain, x)["attention_qkv"] == 3 * heads  # views of the fused output
    # g > 1: the query reshape copies; the key/value views keep the whole fused output
    assert layer_saved(gqa, dims(gqa))["attention_qkv"] == heads + (heads + 2 * kv)
    # g == 1: the query is a view too, only the fused [s, b, (a + 2) d] output is kept
    assert layer_saved(mqa, dims(mqa))["attention_qkv"] == heads + 2 * (heads // 4)
    # without recompute the core attention keeps query, repeated key and value: 3 heads
    no_recompute = tiny(group_query_attention=True, num_query_groups=1)
    assert layer_saved(no_recompute, dims(no_recompute))["attention_qkv"] == 3 * heads


def test_core_attn_recompute_backward_holds_the_repeated_key_and_mqa_query_copy():
    recompute = dict(recompute_granularity="selective")
    plain = tiny(**recompute)
    gqa = tiny(group_query_attention=True, num_query_groups=2, **recompute)
    mqa = tiny(group_query_attention=True, num_query_groups=1, **recompute)

    def work(spec) -> int:
        x = dims(spec)
        return attention_backward_work(spec, x, layer_saved(spec, x), True)

    heads = dims(plain).heads
    assert work(gqa) - work(plain) == heads  # the repeated key baddbmm keeps
    assert work(mqa) - work(plain) == 2 * heads  # and the query copy of the reshape


def test_mlp_backward_of_a_stage_last_layer_counts_the_received_gradient_once():
    spec = tiny(pipeline_model_parallel_size=2)
    x = dims(spec)
    saved = layer_saved(spec, x)
    new_gradient = mlp_backward_work(spec, x, saved, False)
    held = mlp_backward_work(spec, x, saved, False, incoming_held=True)
    assert new_gradient - held == x.hidden


def test_full_recompute_on_a_first_stage_counts_the_recomputed_output_once():
    spec = tiny(pipeline_model_parallel_size=2, recompute_granularity="full",
                recompute_method="uniform", recompute_num_layers=1)  # fmt: skip
    x = dims(spec)
    full = layer_saved(spec, x)
    layer = sum(full.values())
    _, best, moment, _ = chunk_activations(spec, 2, first=True, last=False)
    # layer 1 recomputed: its tensors, the recomputed output and the gradient it was handed
    # (CheckpointFunction.backward's outputs and args), its output slot released as kept
    attention = attention_backward_work(spec, x, full, True)
    mlp = mlp_backward_work(spec, x, full, True, incoming_held=True)
    # (s = 32: the MLP's moment is the larger; the gradient it receives is the handed one)
    assert (best, moment) == (layer + 2 * x.hidden + mlp, "layer 1 mlp_backward")
    assert mlp > attention
    # counting the stage's sent output, or the handed gradient as a new one, adds one [s, b, h]
    assert attention_backward_work(spec, x, full, False) - attention == x.hidden
    assert mlp_backward_work(spec, x, full, True) - mlp == x.hidden
    assert chunk_inputs(spec, x, True)["chunk_input"] == x.hidden


def test_schedule_holds_input_gradients_idle_inputs_and_the_unsent_interleaved_output():
    # 1F1B, pp 2: the first stage holds nothing; the last holds the previous backward's
    # input gradient from its second backward on
    assert {m[3] for m in _schedule_moments(2, 0, 1, 4, 2)} == {0}
    assert _schedule_moments(2, 1, 1, 4, 2) == ((0, (1,), None, 0), (0, (1,), None, 1))
    # interleaved pp 2 x vpp 2, 4 microbatches: stage 1's chunk 0 backward with chunk 1
    # idle holds the unsent output, the last input gradient and chunk 1's input + gradient
    assert (0, (3, 0), None, 4) in _schedule_moments(2, 1, 2, 4, 2)
    # stage 0's chunk 1 backward, chunk 1 in flight: the unsent output and the gradient
    assert (1, (4, 1), None, 2) in _schedule_moments(2, 0, 2, 4, 2)
    # the last chunk of the last stage sends no output (its forward ends in the loss)
    assert (1, (2, 1), None, 0) in _schedule_moments(2, 1, 2, 4, 2)
