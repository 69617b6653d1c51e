"""ModelOpt knowledge distillation in the static estimator (memscope/analysis/static/
distillation.py): the frozen teacher's weights, its part of a pipeline stage's input, the KD
loss's saved tensors and forward moment, and where the teacher's config comes from.

ModelOpt is not a MemScope dependency, so the terms are checked here against a hand derivation
from the ModelOpt / Megatron-LM lines the module cites; tools/measure_kd_cpu.py measures
a tiny real student/teacher step and the KD loss where ModelOpt is importable."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from memscope.analysis.static.activations import dims
from memscope.analysis.static.coverage import config_coverage
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition, rank_param_count
from memscope.inputs.megatron_args import spec_from_megatron_args

ARGS = dict(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=512,
            vocab_size=8192, micro_batch_size=2, global_batch_size=8, bf16=True,
            tensor_model_parallel_size=2, world_size=2, swiglu=True, disable_bias_linear=True,
            untie_embeddings_and_output_weights=True, transformer_impl="transformer_engine",
            attention_backend="flash", use_distributed_optimizer=True)  # fmt: skip
TEACHER = dict(kd_teacher_num_layers=8, kd_teacher_hidden_size=512,
               kd_teacher_ffn_hidden_size=2048, kd_teacher_num_attention_heads=8)  # fmt: skip
KD = dict(export_kd_teacher_load="/nowhere/teacher", **TEACHER)
INTERLEAVED = {**KD, "pipeline_model_parallel_size": 2, "world_size": 4, "num_layers": 8,
               "virtual_pipeline_model_parallel_size": 2}  # fmt: skip


def _spec(**extra):
    return dataclasses.replace(spec_from_megatron_args({**ARGS, **extra}), gpu="h100")


def _rank(spec, pp_rank=0):
    return estimate_rank(spec, RankPosition(0, pp_rank))


def test_teacher_weights_are_counted_in_their_dtype_without_grads_or_optimizer_state():
    student, kd = _spec(), _spec(**KD)
    teacher = kd.distillation.teacher
    assert (teacher.model.num_layers, teacher.model.hidden_size) == (8, 512)
    assert teacher.model.vocab_size == student.model.vocab_size  # the student's tokenizer
    assert teacher.parallel == student.parallel  # built with the student's model_kwargs
    base, with_teacher = _rank(student), _rank(kd)
    count = rank_param_count(teacher, RankPosition(0, 0))
    assert with_teacher.weight_terms == {"teacher_weights": 2 * count}
    assert count > 2 * rank_param_count(student, RankPosition(0, 0))  # the bigger model
    assert with_teacher.persistent.weight_bytes == base.persistent.weight_bytes + 2 * count
    assert with_teacher.persistent.grad_bytes == base.persistent.grad_bytes
    assert with_teacher.persistent.optimizer_bytes == base.persistent.optimizer_bytes


def test_logits_kd_loss_saves_two_fp32_logits_and_peaks_at_the_kl_product():
    student, kd = _spec(), _spec(**KD)
    x = dims(kd)
    fp32_logits = x.logits // x.e * 4
    base, est = _rank(student).activations, _rank(kd).activations
    assert est.detail["kd_loss_saved"] == 2 * fp32_logits
    # skip_lm_loss (ModelOpt's default): the student's cross entropy is not computed
    assert est.detail["cross_entropy_softmax"] == 0 and est.detail["cross_entropy_small"] == 0
    assert est.peak_moment == "kd_loss"
    # both 16-bit logits and six fp32 temporaries (TP > 1) above the saved tensors
    assert est.backward_working_bytes == 2 * x.logits + 6 * fp32_logits
    assert est.total_bytes > base.total_bytes


def test_kd_beside_the_lm_loss_keeps_the_cross_entropy():
    kd = _spec(**KD, kd_skip_lm_loss=False)
    detail = _rank(kd).activations.detail
    assert detail["cross_entropy_softmax"] > 0 and detail["kd_loss_saved"] > 0


def test_top_k_kd_works_on_the_top_k_slice(tmp_path):
    cfg = tmp_path / "kd.yaml"
    cfg.write_text(yaml.safe_dump({"logit_kl_topk": 64, "intermediate_layer_pairs": []}))
    full, topk = _spec(**KD), _spec(**KD, export_kd_cfg=str(cfg))
    assert topk.distillation.logit_topk == 64
    x = dims(topk)
    assert _rank(topk).activations.detail["kd_loss_saved"] == 2 * x.s * x.b * 64 * 4
    assert _rank(topk).peak_memory_bytes < _rank(full).peak_memory_bytes


def test_later_pipeline_stages_keep_the_teachers_part_of_their_input():
    kd = _spec(**KD, pipeline_model_parallel_size=2, world_size=4)
    x = dims(kd)
    first, last = _rank(kd, 0).activations, _rank(kd, 1).activations
    assert "teacher_stage_input" not in first.detail
    assert last.detail["teacher_stage_input"] == x.hidden * 512 // 256


def test_teacher_config_from_the_checkpoints_model_config_yaml(tmp_path):
    nemo = {"num_layers": 6, "hidden_size": 384, "ffn_hidden_size": 1536,
            "num_attention_heads": 12, "encoder_seq_length": 512, "activation": "swiglu",
            "bias": False, "share_embeddings_and_output_weights": False}  # fmt: skip
    (tmp_path / "model_config.yaml").write_text(yaml.safe_dump(nemo))
    kd = _spec(export_kd_teacher_load=str(tmp_path)).distillation
    t = kd.teacher.model
    assert (t.num_layers, t.hidden_size, t.ffn, t.num_attention_heads) == (6, 384, 1536, 12)
    assert t.gated_linear_unit and not t.add_bias_linear and not t.tie_embeddings
    assert kd.teacher_source == f"{tmp_path}/model_config.yaml"
    # kd_teacher_* keys win over the checkpoint's file
    over = _spec(export_kd_teacher_load=str(tmp_path), kd_teacher_num_layers=2).distillation
    assert over.teacher.model.num_layers == 2 and "kd_teacher_* keys" in over.teacher_source


def test_an_unknown_teacher_is_refused_with_one_line_naming_what_to_give():
    with pytest.raises(ValueError) as info:
        _spec(export_kd_teacher_load="/nowhere/teacher", kd_teacher_num_layers=8)
    text = str(info.value)
    assert "\n" not in text and "hidden_size, ffn_hidden_size, num_attention_heads" in text
    assert "kd_teacher_num_layers, kd_teacher_hidden_size" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (dict(TEACHER), "needs export_kd_teacher_load"),
        (INTERLEAVED, "interleaved pipeline"),
        ({**KD, "export_kd_cfg": "/nowhere/kd.yaml"}, "export_kd_cfg: /nowhere/kd.yaml is not"),
    ],
)
def test_distillation_settings_megatron_refuses_are_refused(extra, message):
    with pytest.raises(ValueError, match=message):
        _spec(**extra)


def test_coverage_names_distillation_as_modelled_and_not_run_here():
    kd = _spec(**KD)
    cov = config_coverage({**ARGS, **KD}, kd)
    line = [m for m in cov.modelled if m.startswith("knowledge distillation")]
    assert len(line) == 1 and "8 layers, hidden 512" in line[0]
    assert "tools/measure_kd_cpu.py" in line[0] and "not run here" in line[0]
    assert not {"export_kd_teacher_load", "kd_teacher_num_layers"} & set(cov.unused_keys)


def test_the_teacher_is_split_like_the_student_when_its_parallel_sizes_change():
    kd = _spec(**KD)
    wider = dataclasses.replace(kd, parallel=dataclasses.replace(kd.parallel, tp=1, dp=2))
    teacher = dataclasses.replace(kd.distillation.teacher, parallel=wider.parallel)
    count = rank_param_count(teacher, RankPosition(0, 0))
    assert _rank(wider).weight_terms["teacher_weights"] == 2 * count
    assert 2 * count > _rank(kd).weight_terms["teacher_weights"]  # TP 1 holds it whole
    odd = dataclasses.replace(kd, parallel=dataclasses.replace(kd.parallel, tp=1, pp=3, dp=1))
    with pytest.raises(ValueError, match=r"kd teacher .*parallel\.pp"):
        _rank(odd)


def test_analyze_static_reports_the_teacher_from_a_flagscale_yaml(tmp_path):
    from memscope.cli import main

    system = {k: v for k, v in ARGS.items() if k not in ("num_layers", "hidden_size")}
    config = {"system": {**system, **KD}, "model": {"num_layers": 4, "hidden_size": 256}}
    path = tmp_path / "kd.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["analyze-static", "--config", str(path), "--outdir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "static_report.json").read_text())
    teacher = next(op for op in report["operators"] if op["name"] == "parameters.teacher_weights")
    expected = _rank(_spec(**KD)).weight_terms["teacher_weights"]
    assert teacher["memory_bytes"] == expected
    assert report["ranks"][0]["weight_terms"] == {"teacher_weights": expected}
    weights = next(op for op in report["operators"] if op["name"] == "parameters")
    assert weights["memory_bytes"] == report["ranks"][0]["weight_memory_bytes"] - expected
