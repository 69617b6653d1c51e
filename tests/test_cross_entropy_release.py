"""The cross entropy's second fp32 copy of the logits before megatron-core 0.8
(megatron_versions.INPLACE_LOGITS_SHIFT): its size in the estimate, measured on the real
megatron-core on CPU (tools/measure_cross_entropy_upcast.py), and analyze-log dating a
published run's arguments block to follow it."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import sys
from typing import Any

import pytest

from memscope.analysis.static.activations import cross_entropy_saved, dims, loss_moments
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.megatron_versions import (
    ReleaseRange,
    logits_shift_copy,
    release_range,
)
from memscope.analysis.static.params import RankPosition
from memscope.cli.analyze_log_cmd import analyze_logs
from memscope.inputs.log_spec import dating_note
from memscope.inputs.megatron_args import spec_from_megatron_args

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import measure_cross_entropy_upcast as ce  # noqa: E402

LOGS = ROOT / "tests" / "data" / "logs"
FP32 = 4


def _spec(version: str | None, **extra: Any) -> Any:
    args: dict[str, Any] = dict(
        num_layers=4, hidden_size=64, num_attention_heads=4, padded_vocab_size=ce.VOCAB,
        seq_length=ce.SEQ, micro_batch_size=ce.BATCH, global_batch_size=4 * ce.BATCH,
        fp16=True, world_size=1, transformer_impl="local",
        create_attention_mask_in_dataloader=False,  # the measurement is the loss alone
    )  # fmt: skip
    spec = spec_from_megatron_args({**args, **extra})
    model = dataclasses.replace(spec.model, megatron_core_version=version)
    return dataclasses.replace(spec, model=model, device="cuda")


def _dated_releases(run: dict[str, Any]) -> list[str]:
    """The releases a run's notes say its arguments block dates it to."""
    return [
        m[1]
        for n in run["notes"]
        for m in [re.search(r"estimated with megatron-core (\S+)'s terms", str(n))]
        if m
    ]


def _forward_above_logits(spec: Any) -> int:
    """The estimate's loss forward above the 16-bit logits: the softmax it keeps plus the
    working copies of the ``cross_entropy`` moment, less the logits themselves."""
    x = dims(spec)
    saved = cross_entropy_saved(spec, x)
    return saved + loss_moments(spec, x, saved)["cross_entropy"] - x.logits


def test_release_before_0_8_adds_one_fp32_logits_at_the_loss():
    old, new, unknown = _spec("0.7.0"), _spec("0.8.0"), _spec(None)
    assert logits_shift_copy(old.model) and not logits_shift_copy(new.model)
    assert not logits_shift_copy(unknown.model)  # unknown follows 0.16
    fp32_logits = ce.SEQ * ce.BATCH * ce.VOCAB * FP32
    assert _forward_above_logits(new) == _forward_above_logits(unknown) == fp32_logits
    assert _forward_above_logits(old) == 2 * fp32_logits
    # TE's cross entropy never came with that copy
    assert _forward_above_logits(_spec("0.7.0", cross_entropy_loss_fusion=True,
                                       cross_entropy_fusion_impl="te")) == 0  # fmt: skip


def test_pipeline_last_stage_alone_grows_by_the_copy():
    pp2 = dict(pipeline_model_parallel_size=2, world_size=2)
    old, new = _spec("0.7", **pp2), _spec(None, **pp2)
    first = [estimate_rank(s, RankPosition(0, 0)).peak_memory_bytes for s in (old, new)]
    last = [estimate_rank(s, RankPosition(0, 1)).peak_memory_bytes for s in (old, new)]
    assert first[0] == first[1]
    assert last[0] - last[1] == ce.SEQ * ce.BATCH * ce.VOCAB * FP32


@pytest.mark.megatron_versions
def test_installed_megatron_core_forward_peak_is_the_estimate():
    """Real megatron-core (the installed release, 0.8 or later) on CPU: its forward holds one
    fp32 copy of the logits above them, as the estimate for an unknown release says."""
    measured = ce.measure()
    assert measured == pytest.approx(_forward_above_logits(_spec(None)), rel=0.03)


def test_recorded_0_7_measurement_is_the_estimate():
    """megatron-core 0.7.0's own cross_entropy.py (from its wheel, not installed here), called
    on ``logits.float()`` as its ``compute_language_model_loss`` did: two fp32 copies. The
    figure is benchmarks/cross_entropy_upcast.txt's; with MEMSCOPE_MEGATRON_CORE_07_CE naming
    that file it is measured again."""
    text = (ROOT / "benchmarks" / "cross_entropy_upcast.txt").read_text(encoding="utf-8")
    match = re.search(r"megatron-core 0\.7\.0: .* forward peak above the fp16 logits (\d+) B", text)
    assert match, "benchmarks/cross_entropy_upcast.txt has no megatron-core 0.7.0 line"
    recorded = int(match[1])
    path = os.environ.get("MEMSCOPE_MEGATRON_CORE_07_CE")
    if path:
        assert ce.measure(path, upcast_first=True) == recorded
    assert recorded == pytest.approx(_forward_above_logits(_spec("0.7.0")), rel=0.03)


def test_an_arguments_block_without_cross_entropy_loss_fusion_predates_0_8():
    newer = {"fp16", "bias_swiglu_fusion"}  # from 0.5
    releases = release_range(newer)
    assert releases == ReleaseRange((0, 5), (0, 8), "cross_entropy_loss_fusion")
    assert releases.newest == "0.7"
    assert releases.distinct_releases() == ("0.7",)  # no term changes between 0.5 and 0.7
    note = dating_note(releases, "0.7", [])
    assert "predates megatron-core 0.8 (it is megatron-core 0.5 to 0.7)" in note
    assert release_range(newer | {"cross_entropy_loss_fusion", "glu_linear_offset"}) is None
    # a block with an argument newer than one it lacks is not dated (that one was renamed)
    assert release_range({"fp16", "bias_swiglu_fusion", "glu_linear_offset"}) is None


def test_published_runs_follow_the_release_their_arguments_block_dates():
    """The published GPT-2 345M fp16 logs: liguodongiot's five runs (2023, no
    cross_entropy_loss_fusion) and hwang2006's two TP 4 runs, of which only the first prints
    it. Dated ones follow 0.7; every rank of them (17) is then within 1.5% of its measured max
    allocated, in four layouts (DP 4, TP 2 x PP 2, TP 4, PP 4), last stages included."""
    five = analyze_logs([str(LOGS / "gpt2_345m_fp16_five_runs_pp4_tp2pp2.log")])["runs"][1:]
    two = analyze_logs([str(LOGS / "gpt2_345m_tp4_fp16_two_runs.log")])["runs"]
    dated = [any(logits_shift_copy(_spec(v).model) for v in _dated_releases(run))
             for run in five + two]  # fmt: skip
    assert dated == [True, True, True, True, False, True]
    rows = [row for run in five + two[1:] for row in run["ranks"]]
    assert len(rows) == 17
    for row in rows:
        assert abs(row["verdict"]["error_ratio"]) <= 0.015, (row["rank"], row["verdict"])
