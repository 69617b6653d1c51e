"""The committed GPU benchmark cannot go stale: a fresh run of tools/bench_static_gpu_golden.py
(the estimator at this commit against Megatron-LM's functional-test golden values, ~10 s)
must reproduce benchmarks/static_gpu_golden.{txt,json} and the package's generated summary
module; the planner's band and every accuracy figure in the docs must be that summary's."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from flagscale_trees import ROOT, pristine_tree

sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_static_gpu_golden as bench

from memscope.analysis.static.accuracy import gpu_benchmark_summary
from memscope.analysis.static.planner import ESTIMATE_UNCERTAINTY

pytestmark = pytest.mark.integration
REGENERATE = "stale: run `python tools/bench_static_gpu_golden.py --write` and commit the result"


@pytest.fixture(scope="module")
def fresh() -> dict:
    return bench.run(pristine_tree())


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_committed_table_is_what_the_benchmark_prints_now(fresh):
    paths = bench.committed_paths()
    assert _read(paths["txt"]) == bench.render(fresh) + "\n", REGENERATE


def test_committed_rows_are_what_the_benchmark_computes_now(fresh):
    paths = bench.committed_paths()
    assert json.loads(_read(paths["json"])) == json.loads(bench.json_text(fresh)), REGENERATE
    # every case follows the release that wrote its golden values (recorded with the file's
    # blob id, checked against its bytes), so the installed megatron-core (CI runs two)
    # cannot change the committed figures
    for r in fresh["rows"]:
        at = r["measured_at"]
        assert at is not None and r["megatron_core"] == at["megatron_core_version"], r["name"]
        assert at["path"].startswith("tests/functional_tests/test_cases/")
    with open(os.path.join(ROOT, "docs", "static-estimator.md"), encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    assert f"({bench.release_counts(fresh['rows'])})" in docs
    with open(bench.MEASURED_AT, encoding="utf-8") as f:
        recorded = json.load(f)["files"].values()
    shipped = sorted({tuple(map(int, v["megatron_core_version"].split(".")[:2])) for v in recorded})
    low, high = (f"{a}.{b}" for a, b in (shipped[0], shipped[-1]))
    assert f"golden values that CI wrote on megatron-core {low} to {high} and kept" in docs
    releases = {r["megatron_core"] for r in fresh["rows"]}  # with main's pre-release
    assert {"0.12.0rc0", "0.13.0rc0", "0.14.0rc0", "0.14.0rc6", "0.15.0rc1"} <= releases
    assert fresh["megatron"] not in releases


def test_package_summary_is_the_fresh_runs_last_line(fresh):
    paths = bench.committed_paths()
    assert _read(paths["summary"]) == bench.summary_module(fresh["summary"]), REGENERATE
    s = gpu_benchmark_summary()
    last = bench.render(fresh).splitlines()[-1]
    assert last == f"worst: {100 * s.worst_error:+.1f}%  median: {100 * s.median_abs_error:.1f}%"
    assert s.cases == fresh["summary"]["cases"] > 100


def test_planner_band_is_the_benchmarks_worst_error_where_nothing_is_warned(fresh):
    s = gpu_benchmark_summary()
    assert s.band == ESTIMATE_UNCERTAINTY
    claimed = [r for r in fresh["rows"] if not r["warned"]]
    assert s.band_cases == len(claimed) <= s.cases
    assert s.band == max(abs(r["error"]) for r in claimed) <= s.worst_abs_error


def test_every_accuracy_figure_in_the_docs_is_the_summarys():
    s = gpu_benchmark_summary()
    worst, median = f"{100 * s.worst_error:+.1f}", f"{100 * s.median_abs_error:.1f}"
    estimator = _read(os.path.join(ROOT, "docs", "static-estimator.md"))
    found = re.findall(
        r"Last run: (\d+) GPT/MoE cases, median \|error\| ([0-9.]+)%, worst ([-+][0-9.]+)% "
        r"\(`([^`]+)`[^)]*\); (\d+) cases? beyond 5%, (\d+) beyond 10%",
        " ".join(estimator.split()),
    )
    assert found == [
        (str(s.cases), median, worst, s.worst_case, str(s.over_5_percent), str(s.over_10_percent))
    ]
    planner = " ".join(_read(os.path.join(ROOT, "docs", "planner.md")).split())
    band = re.findall(
        r"`benchmarks/static_gpu_golden.txt`: ([0-9.]+)% over (\d+) cases, median ([0-9.]+)%",
        planner,
    )
    assert band == [(f"{100 * s.band:.1f}", str(s.band_cases), median)]
