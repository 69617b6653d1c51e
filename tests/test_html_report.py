"""HTML payloads and templates: bounded size, the peak always kept, no markup injection;
the job analysis the job page shows."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from memscope.analysis.job import RankEntry, rank_steps, summarize_job
from memscope.downsample import downsample_indices
from memscope.reporters.html import (
    page_js,
    plotly_js,
    render_job_html,
    render_runtime_html,
    script_safe_json,
)
from memscope.reporters.html_payload import (
    choose_detail_steps,
    job_payload,
    runtime_payload,
)

EVIL = "</script><img src=x onerror=alert(1)>"


def _job_payload(entries: list[RankEntry]) -> dict:
    """The job page's payload, built the way the CLI builds it."""
    return job_payload(summarize_job(entries), rank_steps(entries))


def test_downsampling_bounds_points_and_keeps_the_peak():
    values = [i % 97 for i in range(100_000)]
    values[77_777] = 10**9
    idx = downsample_indices(values, 1000)
    assert len(idx) <= 1003 and idx == sorted(idx)
    assert 77_777 in idx and idx[0] == 0 and idx[-1] == 99_999
    assert downsample_indices([3, 1, 2], 10) == [0, 1, 2]


def test_detail_steps_keep_first_last_and_peak():
    assert choose_detail_steps([3, 1, 2], None) == [1, 2, 3]
    chosen = choose_detail_steps(list(range(5000)), 4427, limit=10)
    assert len(chosen) <= 10 and {0, 4427, 4999} <= set(chosen)
    assert len(set(chosen)) == len(chosen) and chosen == sorted(chosen)


def test_caps_bound_tables_and_steps(demo_rank0):
    report, _ = demo_rank0
    big = copy.deepcopy(report)
    big["top_events"] = [dict(report["top_events"][0], count=i) for i in range(5000)]
    big["module_summary"] = [dict(report["module_summary"][0], module=f"m{i}") for i in range(5000)]
    big["warnings"] = [f"w{i}" for i in range(5000)]
    trace = [e for e in report["runtime_trace"] if e["event_type"] != "step_phase"][:5]
    big["runtime_trace"] = [dict(e, step=s) for s in range(100) for e in trace]
    payload = runtime_payload(big, max_rows=50)
    assert len(payload["top_events"]) == 50 and len(payload["module_summary"]) == 50
    assert len(payload["warnings"]) == 50 and payload["modules_total"] == 5000
    assert len(payload["within_step"]) <= 10 and payload["within_steps_total"] == 100
    assert {"0", "99"} <= set(payload["within_step"])


def test_runtime_payload_from_a_real_report(demo_rank0):
    report, _ = demo_rank0
    payload = runtime_payload(report)
    assert payload["peak"]["memory_bytes"] == report["peak"]["memory_bytes"]
    assert payload["steps"]["step"] == [s["step"] for s in report["steps"]]
    assert set(payload["within_step"]) == {"0", "1"}  # the detail steps
    within = payload["within_step"]["1"]
    assert max(within["max_mem_allocated"]) == max(
        e["max_mem_allocated"] for e in report["runtime_trace"]
        if e["step"] == 1 and e["event_type"] != "step_phase"
    )  # fmt: skip
    assert "config" not in payload["metadata"] and payload["config"]


def test_big_trace_is_downsampled_without_losing_its_peak(demo_rank0):
    report, _ = demo_rank0
    big = copy.deepcopy(report)
    template = next(e for e in report["runtime_trace"] if e["event_type"] == "module_forward")
    big["runtime_trace"] = [
        dict(template, step=5, seq=i, max_mem_allocated=i % 1000, mem_allocated_after=i % 1000)
        for i in range(50_000)
    ]
    big["runtime_trace"][31_337].update(max_mem_allocated=10**12, mem_allocated_after=10**12)
    big["steps"] = [dict(report["steps"][0], step=s, peak_allocated=s % 50) for s in range(20_000)]
    big["steps"][12_345]["peak_allocated"] = 10**12
    payload = runtime_payload(big, max_points=500)
    within = payload["within_step"]["5"]
    assert len(within["order"]) <= 1010 and 31_337 in within["order"]
    assert 12_345 in payload["steps"]["step"] and len(payload["steps"]["step"]) <= 505
    assert payload["steps_total"] == 20_000


def test_job_payload_lists_missing_and_incomplete_ranks(demo_rank0):
    report, _ = demo_rank0
    r0 = dict(report, rank=0, world_size=4)
    r2 = dict(report, rank=2, world_size=4, status="oom", status_reason="CUDA out of memory")
    r2["peak"] = dict(report["peak"], memory_bytes=report["peak"]["memory_bytes"] * 2)
    entries = [RankEntry(0, r0), RankEntry(1, None, "truncated JSON"), RankEntry(2, r2)]
    summary = summarize_job(entries)
    payload = job_payload(summary, rank_steps(entries))
    for key in ("world_size", "ranks", "missing", "incomplete", "imbalance"):
        assert payload[key] == summary[key]  # the reporter shows the analysis as is
    assert payload["kind"] == "job" and set(payload["timelines"]) == {"0", "2"}
    assert payload["timelines"]["0"]["step"] == [s["step"] for s in report["steps"]]
    statuses = {row["rank"]: row["status"] for row in payload["ranks"]}
    assert statuses == {0: "complete", 1: "missing", 2: "oom", 3: "missing"}
    problems = {row["rank"]: row["problem"] for row in payload["ranks"]}
    assert problems[1] == "truncated JSON" and "no rank directory" in problems[3]
    assert payload["missing"] == 2 and payload["incomplete"] == 1
    assert payload["imbalance"]["max_rank"] == 2 and payload["imbalance"]["ratio"] == 2.0


def test_script_safe_json_round_trips_and_cannot_close_the_script():
    data = {"m": EVIL, "s": "a\u2028b&c"}
    text = script_safe_json(data)
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == data


def test_hostile_module_names_stay_text(demo_rank0):
    report, _ = demo_rank0
    evil = copy.deepcopy(report)
    evil["top_events"][0]["module"] = EVIL
    evil["peak"]["module"] = EVIL
    evil["status"], evil["status_reason"] = "crashed", EVIL
    html = render_runtime_html(runtime_payload(evil))
    assert EVIL not in html
    data = re.search(
        r'<script type="application/json" id="memscope-data">(.*?)</script>', html, re.S
    )
    assert data is not None and json.loads(data.group(1))["peak"]["module"] == EVIL
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in html  # the server-side banner
    job = render_job_html(_job_payload([RankEntry(0, evil)]))
    assert EVIL not in job


def test_pages_are_self_contained(demo_rank0):
    report, _ = demo_rank0
    html = render_runtime_html(runtime_payload(report))
    assert plotly_js() in html  # inlined, not loaded
    own_markup = html.replace(plotly_js(), "")  # the bundle's code mentions URLs it never loads
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', own_markup)
    assert "<script src" not in own_markup and "<link" not in own_markup
    assert "Plotly.newPlot" in html and html.count('id="memscope-data"') == 1


def test_each_page_inlines_its_script_files_once(demo_rank0):
    """The script files are inlined (no <script src>), each once, after the data and plotly.js."""
    report, _ = demo_rank0
    pages = {
        "runtime": render_runtime_html(runtime_payload(report)),
        "job": render_job_html(_job_payload([RankEntry(0, report)])),
    }
    for name, html in pages.items():
        assert html.count(plotly_js()) == 1 and html.count('id="memscope-data"') == 1
        for js in ("format.js", "tables.js", "charts.js", f"{name}_view.js", f"{name}_page.js"):
            code = str(page_js(js))
            assert html.count(code) == 1, (name, js)
            assert html.index(code) > html.index(plotly_js()) > html.index('id="memscope-data"')
        other = "job" if name == "runtime" else "runtime"
        assert str(page_js(f"{other}_page.js")) not in html


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"


def test_committed_example_job_builds_a_page_with_both_stages():
    from memscope.io.report_reader import load_report

    entries = [
        RankEntry(r, load_report(str(EXAMPLE / f"rank{r:05d}" / "runtime_report.json"), "runtime"))
        for r in (0, 1)
    ]
    payload = _job_payload(entries)
    assert [row["pp_rank"] for row in payload["ranks"]] == [0, 1]
    assert payload["imbalance"]["max_rank"] == 0  # the first stage holds more activations
    assert payload["missing"] == 0 and payload["incomplete"] == 0
    # each rank's static estimate sits next to its measured peak (the demo's real numbers)
    for row in payload["ranks"]:
        assert row["static_peak"] - row["peak_allocated"] == row["static_diff"]
        assert abs(row["static_ratio"]) < 0.03
    html = render_job_html(payload)
    assert EVIL not in html and '"static estimate"' in html


def test_job_summary_is_plain_and_needs_no_reporter():
    """The analysis alone: world size from ranks and reports, rows in rank order, imbalance."""
    a = {
        "world_size": 3,
        "status": "complete",
        "peak": {"memory_bytes": 300, "step": 2},
        "metadata": {"pp_rank": 0, "tp_rank": 0},
        "comparisons": {"peak_diff_ratio": 0.01},
    }
    b = dict(a, status="incomplete", peak={"memory_bytes": 100}, metadata={"pp_rank": 1})
    summary = summarize_job([RankEntry(2, b), RankEntry(0, a)])
    assert summary["world_size"] == 3 and [r["rank"] for r in summary["ranks"]] == [0, 1, 2]
    assert summary["ranks"][1] == {
        "rank": 1,
        "status": "missing",
        "problem": "no rank directory / report",
    }
    assert summary["ranks"][0]["static_ratio"] == 0.01 and summary["ranks"][0]["peak_step"] == 2
    assert summary["missing"] == 1 and summary["incomplete"] == 1
    assert summary["imbalance"] == {
        "max_rank": 0,
        "max_bytes": 300,
        "max_pp_rank": 0,
        "max_tp_rank": 0,
        "min_rank": 2,
        "min_bytes": 100,
        "ratio": 3.0,
    }
    assert summarize_job([]) == {
        "world_size": 0,
        "ranks": [],
        "missing": 0,
        "incomplete": 0,
        "imbalance": {},
        "oom": {
            "ranks": [],
            "tightest_rank": None,
            "tightest_headroom": None,
            "ranks_with_headroom": 0,
        },
        "stages": [],
        "imbalance_by_term": {},
        "outliers": [],
        "grid": {"stages": [], "columns": [], "cells": []},
        "runs": [],
        "mixups": {},
        "runs_warning": "",
        "strays": [],
    }
    json.dumps(summary)  # plain data
