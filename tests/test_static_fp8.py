"""FP8/FP4 training with Transformer Engine in the static estimator (memscope/analysis/
static/fp8.py): quantized weight copies and transposes, quantized primary weights, scaling
state and quantized saved GEMM inputs, each on a small config (direction and size).

Transformer Engine does not install without CUDA, so the terms are checked against a hand
derivation from the TE lines the module cites, not against a run."""

from __future__ import annotations

import dataclasses

import pytest

from memscope.analysis.static.activations import dims, layer_saved
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.analysis.static.validation import ConfigWarning
from memscope.inputs.megatron_args import spec_from_megatron_args

ARGS = dict(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=512,
            vocab_size=1024, micro_batch_size=2, global_batch_size=8, bf16=True,
            tensor_model_parallel_size=2, world_size=2, swiglu=True, disable_bias_linear=True,
            untie_embeddings_and_output_weights=True, transformer_impl="transformer_engine",
            attention_backend="flash")  # fmt: skip
GEMMS = ("linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")


def _spec(gpu="h100", **extra):
    spec = spec_from_megatron_args({**ARGS, **extra})
    return dataclasses.replace(spec, gpu=gpu)


def _rank(spec):
    return estimate_rank(spec, RankPosition(0, 0))


def _gemm_numel(spec, skip_layers=()):
    return sum(
        t.numel
        for t in rank_params(spec, RankPosition(0, 0))
        if t.name.endswith(GEMMS) and not any(f"layers.{i}." in t.name for i in skip_layers)
    )


def test_weight_copies_hold_data_and_transpose_on_hopper_one_buffer_on_blackwell():
    bf16 = _rank(_spec())
    hopper = _rank(_spec(fp8="hybrid", fp8_recipe="tensorwise"))
    blackwell = _rank(_spec(gpu="b200", fp8="hybrid", fp8_recipe="tensorwise"))
    n = _gemm_numel(_spec())
    assert n == 4 * 256 * (3 * 256 + 256 + 2 * 1024 + 1024) // 2  # 4 layers, TP 2
    assert hopper.weight_terms["quantized_weight_copies"] == 2 * n  # _data + _transpose
    assert blackwell.weight_terms["quantized_weight_copies"] == n  # non-TN GEMM: one buffer
    # the copies are persistent: the steady allocation grows by them and the scaling state
    grown = hopper.steady_bytes - bf16.steady_bytes
    assert grown == 2 * n + hopper.weight_terms["scaling_state"]
    assert hopper.persistent.grad_bytes == bf16.persistent.grad_bytes
    assert hopper.persistent.optimizer_bytes == bf16.persistent.optimizer_bytes


def test_mxfp8_and_nvfp4_copies_carry_both_usages_and_block_scales():
    n = _gemm_numel(_spec())
    mx = _rank(_spec(gpu="b200", fp8="e4m3", fp8_recipe="mxfp8"))
    assert mx.weight_terms["quantized_weight_copies"] == round(n * 2 * (1 + 1 / 32))
    fp4 = _rank(_spec(gpu="b200", fp4="e2m1"))
    assert fp4.weight_terms["quantized_weight_copies"] == round(n * 2 * (0.5 + 1 / 16))
    assert mx.weight_terms["scaling_state"] == 0  # MXFP8 keeps no recipe state


def test_fp8_primary_weights_replace_the_bf16_weights_and_need_no_workspace():
    n = _gemm_numel(_spec())
    plain = _rank(_spec(use_distributed_optimizer=True))
    hopper = _rank(_spec(fp8="hybrid", fp8_param_gather=True, use_distributed_optimizer=True))
    assert hopper.weight_terms["quantized_weight_copies"] == 0
    assert hopper.weight_terms["quantized_primary_weights_delta"] == 0  # 1 + 1 byte vs bf16 2
    b200 = _rank(
        _spec(gpu="b200", fp8="hybrid", fp8_param_gather=True, use_distributed_optimizer=True)
    )
    assert b200.weight_terms["quantized_primary_weights_delta"] == -n  # 1 byte vs 2
    # fp32 main parameters and the fp32 gradient buffer are unchanged
    assert b200.persistent.optimizer_bytes == plain.persistent.optimizer_bytes
    assert b200.persistent.grad_bytes == plain.persistent.grad_bytes


def test_delayed_scaling_state_is_five_quantizers_per_gemm_with_the_amax_history():
    gemms = 4 * 4  # four layers of qkv, proj, fc1, fc2
    delayed = _rank(_spec(fp8="hybrid", fp8_amax_history_len=1024))
    assert delayed.weight_terms["scaling_state"] == gemms * 5 * (1024 + 1) * 4
    current = _rank(_spec(fp8="hybrid", fp8_recipe="tensorwise"))
    assert current.weight_terms["scaling_state"] == gemms * 5 * 2 * 4


def test_first_last_layers_bf16_have_no_quantized_copies():
    spec = _spec(fp8="hybrid", first_last_layers_bf16=True)
    est = _rank(spec)
    assert est.weight_terms["quantized_weight_copies"] == 2 * _gemm_numel(spec, (0, 3))


def test_saved_gemm_inputs_are_quantized():
    bf16, fp8 = _spec(), _spec(fp8="hybrid")
    plain, quant = layer_saved(bf16, dims(bf16)), layer_saved(fp8, dims(fp8))
    x = dims(bf16)
    assert quant["norm_outputs"] == plain["norm_outputs"] // 2  # bf16 -> one fp8 byte
    assert quant["quantized_proj_input"] == plain["attention_context"] // 2  # beside bf16
    assert plain["mlp"] - quant["mlp"] == x.ffn // 2  # linear_fc2's input
    assert _rank(fp8).activations.chunk_saved_bytes < _rank(bf16).activations.chunk_saved_bytes


def test_local_layers_warn_and_change_nothing():
    with pytest.warns(ConfigWarning, match="fp8 with transformer_impl local"):
        spec = spec_from_megatron_args({**ARGS, "transformer_impl": "local", "fp8": "hybrid"})
    assert spec.quant is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"fp8": "hybrid", "fp4": "e2m1"}, "fp8 and fp4 are both set"),
        ({"fp8": "hybrid", "fp8_recipe": "nvfp4"}, "fp8_recipe: 'nvfp4' is not one of"),
        ({"fp8": "hybrid", "fp8_amax_history_len": 0}, "fp8_amax_history_len must be >= 1"),
    ],
)
def test_bad_fp8_settings_are_refused_with_one_line(extra, message):
    with pytest.raises(ValueError, match=message) as info:
        spec_from_megatron_args({**ARGS, **extra})
    assert "\n" not in str(info.value)


def test_grouped_experts_have_quantizers_per_local_expert():
    moe = dict(num_experts=8, expert_model_parallel_size=2, moe_grouped_gemm=True,
               moe_ffn_hidden_size=128, tensor_model_parallel_size=1, world_size=2)  # fmt: skip
    est = _rank(_spec(fp8="hybrid", fp8_recipe="tensorwise", **moe))
    # per layer: qkv, proj and two grouped tensors of 8 / 2 local experts each
    gemms = 4 * (2 + 2 * 4)
    assert est.weight_terms["scaling_state"] == gemms * 5 * 2 * 4
    experts = sum(
        t.numel for t in est.params if t.name.endswith(("experts.weight1", "experts.weight2"))
    )
    assert experts > 0 and est.weight_terms["quantized_weight_copies"] == 2 * (
        experts + sum(t.numel for t in est.params if t.name.endswith(GEMMS))
    )


def test_a_distillation_teacher_caches_row_wise_copies_only():
    teacher = dict(export_kd_teacher_load="/nowhere", kd_teacher_num_layers=4,
                   kd_teacher_hidden_size=256, kd_teacher_ffn_hidden_size=1024,
                   kd_teacher_num_attention_heads=8)  # same shape as the student  # fmt: skip
    est = _rank(_spec(fp8="hybrid", fp8_recipe="tensorwise", **teacher))
    student = est.weight_terms["quantized_weight_copies"] + est.weight_terms["scaling_state"]
    # no_grad: no column-wise copy (linear.py: columnwise_usage needs a gradient)
    rowwise = est.weight_terms["quantized_weight_copies"] // 2
    assert (
        est.weight_terms["teacher_quantized_weights"] == rowwise + est.weight_terms["scaling_state"]
    )
    assert est.weight_terms["teacher_quantized_weights"] < student
