"""tools/bench_static_published.py: the committed output is what the tool prints today (it fails
when an estimator change moves a figure without re-running the benchmark), every case names its
source, and a case needing a feature still being added is listed as awaiting it."""

from __future__ import annotations

import json
import os
import sys

import pytest
from flagscale_trees import ROOT, pristine_tree

sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_static_published as bench

pytestmark = pytest.mark.integration

TXT = os.path.join(ROOT, "benchmarks", "static_published.txt")
JSON = os.path.join(ROOT, "benchmarks", "static_published.json")


@pytest.fixture(scope="module")
def result() -> dict:
    return bench.run(pristine_tree())


def test_committed_benchmark_output_is_what_the_tool_prints_now(result):
    with open(TXT, encoding="utf-8") as f:
        committed = f.read().rstrip("\n")
    assert bench.render(result) == committed, (
        "benchmarks/static_published.txt is stale: run "
        "`python tools/bench_static_published.py --json benchmarks/static_published.json "
        "> benchmarks/static_published.txt`"
    )
    with open(JSON, encoding="utf-8") as f:
        assert json.load(f)["summary"] == json.loads(json.dumps(result["summary"]))
    with open(os.path.join(ROOT, "docs", "static-estimator.md"), encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    assert f"Last run: {bench.doc_figures(result['summary'])}." in docs


def test_every_case_names_its_source_and_nothing_is_dropped(result):
    cases = bench.load_cases()
    assert len(cases) == len(bench.CASES)
    listed = {r["name"] for r in result["rows"]} | {s["name"] for s in result["separate"]}
    assert listed == {name for _, name in bench.CASES}
    for case in cases:
        src = case["source"]
        assert src["repo"] == bench.SOURCE_REPO and len(src["commit"]) == 40
        assert src["config"].endswith(f"/{case['name']}/model_config.yaml")
        assert src["measured"].startswith(src["config"].rsplit("/", 1)[0])
        # an excerpt, not the golden file: two numbers and where they came from
        assert set(case["measured"]) == {
            "golden_file", "steady_bytes", "steady_iteration", "peak_bytes", "peak_iteration",
            "iterations",
        }  # fmt: skip
    for row in result["rows"]:
        m = row["measured"]
        assert row["error"] == pytest.approx(
            (row["estimate"]["peak_bytes"] - m["peak_bytes"]) / m["peak_bytes"]
        )


def test_dropless_moe_rows_carry_the_imbalance_range(result):
    moe = [r for r in result["rows"] if r["parallel"]["ep"] > 1 or r["family"] == "moe"]
    assert moe and all(r["imbalance_bound"] for r in moe)
    for r in moe:
        bound = r["imbalance_bound"]
        assert bound["bound"] >= 1.0
        assert bound["peak_bytes"] >= r["estimate"]["peak_bytes"]
        assert (bound["peak_bytes"] > r["estimate"]["peak_bytes"]) == (bound["bound"] > 1.0)
    dense = [r for r in result["rows"] if r["family"] == "gpt"]
    assert dense and not any(r["imbalance_bound"] for r in dense)


def test_features_being_added_are_awaited_not_estimated(result):
    reasons = {s["name"]: s["reason"] for s in result["separate"]}
    assert reasons["gpt3_moe_mcore_te_ep8_resume_torch_dist_muon"].startswith("awaiting Muon")
    assert (
        "awaiting FP8"
        in reasons["gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"]
    )
    assert bench.awaiting({"pipeline_model_parallel_layout": "Et|tL"}).startswith(
        "awaiting pipeline_model_parallel_layout"
    )
    assert bench.awaiting({"optimizer": "adam", "bf16": True}) is None
