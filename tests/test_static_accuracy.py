"""The committed CPU accuracy matrix (benchmarks/static_accuracy_cpu.*) is what the code gives.

``tools/bench_static_accuracy.py`` trains the tiny real megatron-core GPT (1-2 gloo processes)
in every configuration, measures each rank's true peak with the exact storage backend and
estimates it. Here: every committed row re-estimated from its committed measurement gives the
committed estimate (the estimator has not moved since the benchmark was written), the summary
line and the docs quote the rows, and a representative subset is re-measured and must agree
with the committed rows -- runs with full, minimal and no Megatron args among them.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from bench_static_accuracy import MATRIX, QUICK, estimate, measure, worst_line  # noqa: E402

COMMITTED_JSON = os.path.join(ROOT, "benchmarks", "static_accuracy_cpu.json")
COMMITTED_TXT = os.path.join(ROOT, "benchmarks", "static_accuracy_cpu.txt")
TOLERANCE = 0.01  # the bound on |static - measured| / measured, per rank


def _committed() -> list[dict]:
    with open(COMMITTED_JSON, encoding="utf-8") as f:
        return json.load(f)["rows"]


def test_every_committed_row_re_estimates_to_its_committed_figure_within_1_percent():
    committed = _committed()
    rows = [dict(r) for r in committed]
    estimate(rows)
    assert {r["config"] for r in rows} == {name for name, _, _ in MATRIX}
    for row, old in zip(rows, committed, strict=True):
        where = (row["config"], row["rank"])
        assert row["ours"] == old["ours"], where
        assert abs(row["error"]) <= TOLERANCE, (where, row["error"])
        assert row["exact_params"] and row["exact_optimizer"], where


def test_the_committed_summary_and_the_docs_quote_the_committed_rows():
    line = worst_line(_committed())
    with open(COMMITTED_TXT, encoding="utf-8") as f:
        assert f.read().rstrip().splitlines()[-1] == line
    with open(os.path.join(ROOT, "docs", "static-estimator.md"), encoding="utf-8") as f:
        docs = f.read()
    quoted = re.search(r"Worst error\s+of the last run: (.+?configurations)", docs, re.S)
    assert quoted is not None
    assert " ".join(quoted.group(1).split()) in line


@pytest.mark.integration
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", QUICK)
def test_a_re_measured_row_agrees_with_the_committed_one(name):
    world, overrides = next((w, o) for n, w, o in MATRIX if n == name)
    rows = measure(name, world, overrides)
    estimate(rows)
    committed = {(r["config"], r["rank"]): r for r in _committed()}
    assert len(rows) == world
    for row in rows:
        old = committed[(name, row["rank"])]
        assert row["ours"] == old["ours"] and row["in_report"] == row["ours"], row
        assert abs(row["measured"] - old["measured"]) <= TOLERANCE * old["measured"], row
        assert abs(row["error"]) <= TOLERANCE, (name, row["rank"], row["error"])
        assert row["exact_params"] and row["exact_optimizer"], row
