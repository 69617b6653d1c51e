"""The RL rollout's step terms (analysis/static/rl_rollout.py) are measured, not assumed:
tools/measure_rl_rollout.py runs megatron-core 0.16.1's own sampling and log-probability
functions on ``[1, R, V]`` logits, and a real ``TransformerLayer`` under
``torch.inference_mode``, on CPU, reading torch.profiler's memory timeline. The estimator's
logits moment must be what they allocate for every sampling setting the RL client can send
and both dtypes, up to a few bytes per request (the sampled token and the row index); its
dense layer moment exactly what the layer allocates above its input (its core attention a
stand-in: the engine's flash kernel runs on GPUs only; the MLP's moment is the layer's here),
its MoE layer moment what the layer allocates less the router's ``[T, experts]`` scores (not
counted: under 10%)."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

from memscope.analysis.static.rl_rollout import (
    engine_requests,
    layer_working_elements,
    logits_working_bytes,
)
from memscope.inputs.megatron_args import spec_from_megatron_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import measure_rl_rollout as tool  # noqa: E402

REQUESTS, VOCAB, TOKENS = 64, 8192, 256
PER_ROW = 16  # bytes per request the estimate leaves out (a sampled token, a row index)
# the RL sampling flags of each setting the tool measures (temperature changes nothing)
SAMPLING_FLAGS = {
    "default": {},
    "temperature": {"rl_default_temperature": 0.7},
    "top_p": {"rl_default_top_p": 0.9},
}


def _spec(**extra):
    args = dict(
        num_layers=2, hidden_size=tool.HIDDEN, num_attention_heads=4,
        ffn_hidden_size=tool.FFN, padded_vocab_size=VOCAB, seq_length=256,
        micro_batch_size=1, global_batch_size=1, bf16=True, world_size=1,
        transformer_impl="local", disable_bias_linear=True, perform_rl_step=True,
        inference_dynamic_batching_buffer_size_gb=0.05, inference_max_seq_length=256,
        grpo_group_size=2, rl_parallel_generation_tasks=REQUESTS // 2,
        bias_swiglu_fusion=False, bias_gelu_fusion=False,
    )  # fmt: skip
    args.update(extra)
    return dataclasses.replace(spec_from_megatron_args(args), device="cuda")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_logits_moment_is_what_sampling_and_log_probabilities_allocate(dtype):
    measured = tool.measure_logits(REQUESTS, VOCAB, dtype)
    precision = {"bf16": True} if dtype == "bfloat16" else {"bf16": False}
    for name, flags in SAMPLING_FLAGS.items():
        spec = _spec(**precision, **flags)
        assert engine_requests(spec) == REQUESTS
        above = max(measured.sampling[name], measured.log_probs)
        expected = REQUESTS * VOCAB * (measured.element_bytes + above)
        # per row, not per logit: the sampled token (int64), the row index (int32)
        assert abs(logits_working_bytes(spec) - expected) <= REQUESTS * PER_ROW, name


@pytest.fixture(scope="module")
def forward() -> dict[str, float]:
    return tool.measure_forward(TOKENS)


@pytest.mark.integration
@pytest.mark.parametrize(
    "name, gated, ffn", [("gated", True, tool.FFN), ("plain", False, tool.PLAIN_FFN)]
)
def test_a_dense_layers_moment_is_what_the_layer_allocates(forward, name, gated, ffn):
    spec = _spec(swiglu=gated, ffn_hidden_size=ffn)
    # the attention output beside the MLP's working set: 2 h + fc1 + what the activation makes
    by_hand = 2 * tool.HIDDEN + (2 * ffn + 3 * ffn if gated else ffn + ffn)
    assert layer_working_elements(spec, TOKENS, moe=False) == by_hand * TOKENS
    assert by_hand == forward[name]


@pytest.mark.integration
def test_a_moe_layers_moment_is_what_it_allocates_but_the_routers_scores(forward):
    spec = _spec(
        swiglu=True, num_experts=tool.EXPERTS, moe_ffn_hidden_size=tool.MOE_FFN,
        moe_router_topk=tool.TOPK, moe_token_dispatcher_type="alltoall",
    )  # fmt: skip
    estimate = layer_working_elements(spec, TOKENS, moe=True)
    measured = forward["moe"] * TOKENS
    assert estimate <= measured <= 1.1 * estimate
