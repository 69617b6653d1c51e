"""Memory terms by hand on a tiny config, and the whole estimate against a real traced run."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest
from conftest import load_json
from harness import instrumented_worker

from memscope.analysis.static.activations import (
    activation_estimate,
    chunk_activations,
    dims,
    in_flight_microbatches,
    layer_saved,
    mlp_backward_work,
)
from memscope.analysis.static.config import ParallelSpec, PrecisionSpec
from memscope.analysis.static.estimator import (
    SOURCE,
    estimate_all_ranks,
    estimate_rank,
    position_of_rank,
)
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.analysis.static.terms import persistent_terms
from memscope.capture.parallel import ParallelInfo
from memscope.demo.launcher import free_port, spawn
from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.demo.traced_training import megatron_like_args
from memscope.inputs.megatron_args import spec_from_megatron_args
from memscope.inputs.runtime_estimate import estimate_for_runtime

pytestmark = pytest.mark.integration

# s=32 b=2 h=64 a=g=4 d=16 ffn=256 V=128, fp32, no dropout: the harness' default model
TINY: dict[str, Any] = dict(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    padded_vocab_size=128,
    seq_length=32,
    micro_batch_size=2,
    num_microbatches=4,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    # the harness runs megatron-core's local spec with its CUDA fusions off (FUSIONS_OFF)
    transformer_impl="local",
    bias_swiglu_fusion=False,
    bias_gelu_fusion=False,
    masked_softmax_fusion=False,
    gradient_accumulation_fusion=False,
    # its batches carry one [1, 1, s, s] mask each, not GPTDataset's [b, 1, s, s]
    create_attention_mask_in_dataloader=False,
)


def tiny(**kw: Any):
    return spec_from_megatron_args(argparse.Namespace(**{**TINY, **kw}))


def test_layer_saved_tensors_by_hand():
    """megatron-core's unfused local-spec layer, tensor by tensor (fp32, no dropout)."""
    s, b, h, a, d, f, e = 32, 2, 64, 4, 16, 256, 4
    sbh = s * b * h * e
    items = layer_saved(tiny(), dims(tiny()))
    assert items == {
        "norm_outputs": 2 * sbh,  # inputs of linear_qkv and linear_fc1
        "norm_statistics": 2 * 2 * s * b * 4,  # LayerNorm mean + rstd, two norms
        "attention_residual": sbh,
        "layer_output": sbh,
        "attention_qkv": 3 * s * b * a * d * e,
        "attention_context": s * b * a * d * e,
        "mlp": 2 * s * b * f * e,  # fc1 output (+bias), GeLU output
        "attention_scores": b * a * s * s * e,  # softmax output
    }
    selective = layer_saved(tiny(recompute_granularity="selective"), dims(tiny()))
    assert "attention_scores" not in selective
    flash = layer_saved(tiny(transformer_impl="transformer_engine"), dims(tiny()))
    assert flash["attention_softmax_lse"] == b * a * s * 4 and "attention_scores" not in flash
    # the local spec's DotProductAttention has no flash path: the flag is warned, not modelled
    with pytest.warns(UserWarning, match="no flash path"):
        local = tiny(use_flash_attn=True)
    assert not local.flash_attention and "attention_scores" in layer_saved(local, dims(local))


def test_swiglu_gqa_tp_and_sequence_parallel_by_hand():
    s, b, h, e, t = 32, 2, 64, 2, 2
    spec = tiny(
        num_query_groups=2, swiglu=True, bf16=True, tensor_model_parallel_size=2,
        sequence_parallel=True,
    )  # fmt: skip
    items = layer_saved(spec, dims(spec))
    assert items["norm_outputs"] == 2 * s * b * h * e // t  # sequence-parallel shards
    assert items["attention_qkv"] == 3 * s * b * (4 // t) * 16 * e  # GQA k/v repeated
    assert items["mlp"] == 5 * s * b * (256 // t) * e  # 2f fc1 output, silu, linear, product
    assert items["attention_scores"] == b * (4 // t) * s * s * e


def test_dropout_masks_are_bool_on_cuda_and_float_on_cpu():
    spec = tiny(hidden_dropout=0.1, attention_dropout=0.1)
    s, b, h, a = 32, 2, 64, 4
    cuda = layer_saved(spec, dims(spec))
    cpu = layer_saved(
        dataclasses.replace(spec, device="cpu"), dims(dataclasses.replace(spec, device="cpu"))
    )
    assert cuda["residual_dropout_masks"] == 2 * s * b * h
    assert cpu["residual_dropout_masks"] == 2 * s * b * h * 4
    assert cuda["attention_dropout"] == b * a * s * s * (4 + 1)
    assert cpu["attention_dropout"] == b * a * s * s * (4 + 4)


def test_in_flight_microbatches_follow_the_schedules():
    assert in_flight_microbatches(tiny(), 0) == 1  # no pipelining
    pp4 = tiny(num_layers=4, pipeline_model_parallel_size=4, num_microbatches=8)
    assert [in_flight_microbatches(pp4, r) for r in range(4)] == [4, 3, 2, 1]
    few = tiny(num_layers=4, pipeline_model_parallel_size=4, num_microbatches=2)
    assert [in_flight_microbatches(few, r) for r in range(4)] == [2, 2, 2, 1]
    vpp = tiny(
        num_layers=8,
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2,
        num_microbatches=4,
    )
    # warm-up 2 (pp - r - 1) + (vpp - 1) pp chunk-forwards, plus one
    assert [in_flight_microbatches(vpp, r) for r in range(2)] == [5, 3]


def test_recompute_shrinks_what_a_chunk_stores():
    x = dims(tiny())
    layer = sum(layer_saved(tiny(), x).values())
    plain, _, _, _ = chunk_activations(tiny(), 4, first=False, last=False)
    full, _, _, _ = chunk_activations(tiny(recompute_granularity="full"), 4, False, False)
    extras = x.hidden + x.s * x.s  # chunk input, causal mask
    assert plain == 4 * layer - x.hidden + extras  # the stage's last output is sent and freed
    assert full == 3 * x.hidden + extras  # one checkpointed input per later layer
    block = tiny(recompute_granularity="full", recompute_method="block", recompute_num_layers=2)
    stored, _, _, _ = chunk_activations(block, 4, False, False)
    assert stored == 2 * x.hidden + 2 * layer - x.hidden + extras


def test_schedule_and_sequence_parallel_backward_terms_by_hand():
    pp2 = dict(num_layers=2, pipeline_model_parallel_size=2)
    x = dims(tiny(**pp2))
    one = activation_estimate(tiny(**pp2, num_microbatches=1), 1, [1])
    four = activation_estimate(tiny(**pp2, num_microbatches=4), 1, [1])
    # later stages: the previous microbatch's input gradient is still held by the schedule
    assert four.backward_working_bytes - one.backward_working_bytes == x.hidden
    first = activation_estimate(tiny(**pp2, num_microbatches=4), 0, [1])
    assert first.in_flight == 2 and first.peak_moment.startswith("layer 0")
    # interleaved, 4 microbatches, stage 1 (tests/test_static_schedule_held.py): the unsent
    # output, the last input gradient, the idle chunk's input and its gradient;
    # overlap_p2p_comm adds the next forward's receive, posted before the backward
    vpp = dict(num_layers=4, pipeline_model_parallel_size=2,
               virtual_pipeline_model_parallel_size=2, num_microbatches=4)  # fmt: skip
    plain = activation_estimate(tiny(**vpp, overlap_p2p_comm=False), 1, [1, 1])
    posted = activation_estimate(tiny(**vpp, overlap_p2p_comm=True), 1, [1, 1])
    assert plain.detail["pipeline_schedule_held"] == 4 * x.hidden
    assert posted.backward_working_bytes - plain.backward_working_bytes == x.hidden
    # sequence parallel: fc2's output gradient is gathered to the full sequence
    sp = tiny(swiglu=True, tensor_model_parallel_size=2, sequence_parallel=True)
    no_sp = tiny(swiglu=True, tensor_model_parallel_size=2)
    xs, xn = dims(sp), dims(no_sp)
    gathered = xs.s * xs.b * xs.h * xs.e
    mlp_sp = mlp_backward_work(sp, xs, layer_saved(sp, xs), True)
    mlp_no = mlp_backward_work(no_sp, xn, layer_saved(no_sp, xn), True)
    assert mlp_sp - mlp_no == gathered  # (incoming and released layer-output shards cancel)


def test_last_stage_keeps_the_fp32_cross_entropy_softmax():
    spec = tiny(pipeline_model_parallel_size=2, bf16=True)
    first = activation_estimate(spec, 0, [1])
    last = activation_estimate(spec, 1, [1])
    assert first.logits_bytes == 0 and last.logits_bytes == 32 * 2 * 128 * 4
    assert last.detail["cross_entropy_softmax"] == 32 * 2 * 128 * 4
    assert first.in_flight == 2 and last.in_flight == 1
    assert last.peak_moment.endswith("backward")


def test_persistent_terms_by_hand():
    spec = tiny()
    params = rank_params(spec, RankPosition())
    n = sum(t.numel for t in params)
    fp16 = dataclasses.replace(spec, precision=PrecisionSpec(params_dtype="float16"))
    t = persistent_terms(fp16, params)
    assert (t.weight_bytes, t.grad_bytes, t.optimizer_bytes) == (2 * n, 2 * n, 12 * n)
    sgd = dataclasses.replace(spec, precision=PrecisionSpec(optimizer="sgd"))
    assert persistent_terms(sgd, params).optimizer_bytes == 4 * n  # momentum buffer
    torch_adam = dataclasses.replace(spec, precision=PrecisionSpec(torch_optimizer=True))
    assert persistent_terms(torch_adam, params).optimizer_bytes == 8 * n + 4 * len(params)


def test_all_ranks_and_rank_positions():
    spec = dataclasses.replace(
        tiny(num_layers=4, pipeline_model_parallel_size=2, tensor_model_parallel_size=2),
        parallel=ParallelSpec(tp=2, pp=2, dp=2),
    )
    estimates = estimate_all_ranks(spec)
    assert [(e.position.pp_rank, e.position.tp_rank) for e in estimates] == [
        (0, 0), (0, 1), (1, 0), (1, 1)
    ]  # fmt: skip
    assert position_of_rank(spec, 5) == RankPosition(tp_rank=1, pp_rank=1)
    with pytest.raises(ValueError, match="outside the world size 8"):
        position_of_rank(spec, 8)
    with pytest.raises(ValueError, match="outside tp=2 x pp=2"):
        estimate_rank(spec, RankPosition(pp_rank=2))


@pytest.mark.multiprocess
def test_estimate_matches_a_real_traced_run(tmp_path):
    """Persistent terms equal what the run holds (torch Adam incl. its ``step`` tensors);
    the modelled peak is within 3% of the measured true peak."""
    cfg = TinyGPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_microbatches=2)
    argv = ["--memscope", "--memscope-outdir", str(tmp_path)]
    # a fresh process: in this one, tensors left by earlier tests would be live memory too
    (result,) = spawn(1, instrumented_worker, free_port(), cfg, 3, argv)
    args = megatron_like_args(cfg, [])
    info = ParallelInfo(dp_size=1, tp_rank=0, pp_rank=0)
    estimate = estimate_for_runtime(args, info, device="cpu")
    assert estimate["source"] == SOURCE
    parts = estimate["components"]
    assert parts["parameters"] == result.param_bytes
    assert parts["optimizer_state"] == result.optimizer_state_bytes
    peak = load_json(str(result.report_path))["peak"]
    assert peak["categories"]["gradients"] == parts["gradients"]
    assert abs(estimate["peak_memory_bytes"] - peak["memory_bytes"]) < 0.03 * peak["memory_bytes"]
