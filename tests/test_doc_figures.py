"""Figures the docs quote from the committed benchmark outputs are those outputs' (which
their own tests check against the code): the FP8 ``tp_comm_overlap`` golden case in
docs/static-estimator.md and hwang2006's first TP 4 run in docs/analyze-log.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _text(*parts: str) -> str:
    return " ".join(ROOT.joinpath(*parts).read_text(encoding="utf-8").split())


def test_the_fp8_tp_overlap_golden_figure_is_the_benchmarks():
    table = ROOT.joinpath("benchmarks", "static_gpu_golden.txt").read_text(encoding="utf-8")
    (error,) = re.findall(r"^gpt/\S+_tp2_pp2_current_scaling_\S*tp_overlap\s.*?([-+]\d+\.\d%)",
                          table, re.M)  # fmt: skip
    assert f"`..._tp2_pp2_current_scaling_...`) is {error}:" in _text("docs", "static-estimator.md")


def test_the_first_tp4_run_figure_is_the_fixture_tables():
    table = ROOT.joinpath("benchmarks", "analyze_log_fixtures.txt").read_text(encoding="utf-8")
    run = r"^\| gpt2_345m_tp4_fp16_two_runs\.log \| 1 \| \d+ "
    row = run + r"\|[^|]*\|[^|]*\|[^|]*\| ([-+]\d+\.\d%) \|"
    (error,) = set(re.findall(row, table, re.M))  # every rank of that run alike
    assert f"is unchanged ({error})" in _text("docs", "analyze-log.md")
