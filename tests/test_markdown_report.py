"""The runtime Markdown on a real report (rank 0 of the committed PP=2 CPU example, storage
backend): what a first-time reader tripped over is gone."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from memscope.reporters.markdown import render_runtime_markdown

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"


def _report() -> dict:
    return json.loads((EXAMPLE / "rank00000" / "runtime_report.json").read_text())


def _table(md: str, first_header: str) -> list[str]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_no_vpp_is_left_out_rather_than_printed_as_none():
    report = _report()
    assert report["metadata"]["vpp_size"] is None
    md = render_runtime_markdown(report)
    assert "VPP=None" not in md and "VPP=" not in md
    report["metadata"]["vpp_size"] = 2
    assert "EP=1 VPP=2" in render_runtime_markdown(report)


def test_a_backend_without_a_caching_allocator_gets_no_reserved_columns():
    report = _report()
    assert report["metadata"]["backend"] == "storage"
    md = render_runtime_markdown(report)
    assert "reserved" not in _table(md, "step")[0]  # the steps table
    assert "reserved Δ" not in md


def test_a_component_difference_is_weighed_against_the_runtime_peak():
    report = _report()
    comp = report["comparisons"]
    other = next(c for c in comp["components"] if c["component"] == "other")
    assert (other["static_bytes"], other["runtime_bytes"], other["diff_ratio"]) == (0, 4, -1.0)
    rows = _table(render_runtime_markdown(report), "component")
    assert rows[0].endswith("| of the runtime peak |")
    (line,) = [r for r in rows if r.startswith("| other |")]
    assert line.endswith("| 0.0% |") and "100" not in line


def test_the_recording_cost_is_in_time_units():
    report = _report()
    cost = report["allocator_timeline"]["recording_cost"]
    md = render_runtime_markdown(report)
    (line,) = [x for x in md.splitlines() if x.startswith("- recording cost")]
    assert f"{cost['recorded_median_s'] * 1000:.1f} ms with history" in line
    assert f"×{cost['ratio']:.2f}" in line
    changed = copy.deepcopy(report)
    changed["allocator_timeline"]["recording_cost"]["recorded_median_s"] = 2.5
    assert "median step 2.50 s with history" in render_runtime_markdown(changed)
