"""The first GPU pass (H100, 2026-11-28), replayed on the CPU from what it wrote.

``benchmarks/gpu/h100_2026-11-28/summary.txt`` must be what ``tools/gpu_results.py`` prints
now (its estimates are recomputed, so an estimator change asks for it to be regenerated); the
end-to-end run's own log, report and allocator snapshot must agree with each other and with
the estimate (checks 5 and 6 of ``../shared/gpu-checklist.md``).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import sys

import pytest
from conftest import load_json

from memscope.cli import main

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(REPO, "benchmarks", "gpu", "h100_2026-11-28")
E2E = os.path.join(REPO, "examples", "flagscale_gpu_e2e")
SNAPSHOT_DIR = os.path.join(REPO, "tests", "data", "gpu_e2e_snapshot")
SNAPSHOT = "memory_snapshot_steps1-2.pickle"
sys.path.insert(0, os.path.join(REPO, "tools"))


def _report() -> dict:
    return load_json(os.path.join(E2E, "rank00000", "runtime_report.json"))


def test_gpu_summary_is_what_the_tool_prints_now():
    import gpu_results

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert gpu_results.main([RUN]) == 0
    with open(os.path.join(RUN, "summary.txt"), encoding="utf-8") as f:
        committed = f.read()
    assert out.getvalue() == committed, (
        "regenerate: RUN=benchmarks/gpu/h100_2026-11-28; "
        "python tools/gpu_results.py $RUN > $RUN/summary.txt"
    )


def test_runtime_peak_is_the_allocator_high_water_mark_in_every_gpu_case():
    rows = load_json(os.path.join(RUN, "gpu_megatron_accuracy.json"))["accuracy"]
    measured = [r for r in rows if "error" not in r]
    assert len(measured) == 9
    for row in measured:
        assert row["runtime_peak"] == row["measured_peak"], row["case"]
        assert row["runtime_peak"] == max(row["runtime_step_peaks"]), row["case"]


def test_log_and_runtime_report_of_the_gpu_run_agree(tmp_path):
    """Check 6: analyze-log on the run's own Megatron log measures what the report measured
    and estimates what the static estimate and the in-run comparison estimate."""
    assert main(["analyze-log", os.path.join(E2E, "train_log.txt"), "--outdir", str(tmp_path)]) == 0
    rank = load_json(str(tmp_path / "log_report.json"))["runs"][0]["ranks"][0]
    report = _report()
    assert rank["iteration"] == 1
    assert rank["measured"]["max_allocated"] == report["steps"][0]["peak_allocated"]
    assert (
        rank["estimate"]["steady_peak_bytes"] == report["comparisons"]["static_peak_memory_bytes"]
    )
    config = os.path.join(REPO, "configs", "flagscale", "memscope_tiny_gpt.yaml")
    assert main(["analyze-static", "--config", config, "--outdir", str(tmp_path)]) == 0
    static = load_json(str(tmp_path / "static_report.json"))["summary"]
    assert static["peak_memory_bytes"] == rank["estimate"]["steady_peak_bytes"]
    # the NullTokenizer's end-of-document row: 4096 + 1 padded to 4224, as the log says
    with open(os.path.join(E2E, "train_log.txt"), encoding="utf-8") as f:
        assert "padded vocab (size: 4097) with 127 dummy tokens (new size: 4224)" in f.read()
    assert static["param_count"] == report["comparisons"]["components"][0]["static_bytes"] // 2


def test_gpu_snapshot_fixture_opens_in_torch_memory_viz():
    from torch.cuda import _memory_viz

    path = os.path.join(SNAPSHOT_DIR, SNAPSHOT)
    with open(path, "rb") as f:
        assert f.read(2) in (b"\x80\x02", b"\x80\x03", b"\x80\x04")  # pickle protocol <= 4
        f.seek(0)
        data = pickle.load(f)
    assert len(data["device_traces"][0]) == 8841
    assert len(_memory_viz.trace_plot(data)) > 10**5
    assert _memory_viz.segsum(data).startswith("Summary of segments")


def test_gpu_snapshot_peak_is_the_report_timeline_peak_and_the_estimate_terms(tmp_path):
    """The allocator history replayed here finds the peak the run's report found, and what was
    live there matches the static estimate term by term."""
    for name in os.listdir(SNAPSHOT_DIR):
        shutil.copy(os.path.join(SNAPSHOT_DIR, name), tmp_path)
    path = str(tmp_path / SNAPSHOT)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["analyze-snapshot", "--snapshot", path]) == 0
    peak = load_json(path[: -len(".pickle")] + ".peak.json")
    timeline = _report()["allocator_timeline"]
    assert peak["peak_allocated_bytes"] == timeline["peak_bytes"]
    assert peak["inconsistencies"] == 0 and peak["composition"]["unattributed_bytes"] == 0
    assert _report()["peak"]["step"] == timeline["peak_context"]["step"] == 1
    by_category: dict[str, int] = {}
    for item in peak["composition"]["items"]:
        by_category[item["category"]] = by_category.get(item["category"], 0) + item["bytes"]
    static = {c["component"]: c["static_bytes"] for c in _report()["comparisons"]["components"]}
    assert by_category["parameters"] == static["parameters"]
    assert by_category["gradients"] == static["gradients"]
    assert by_category["main_params"] + by_category["optimizer_state"] == static["optimizer_state"]
    assert by_category["buffers"] == static["buffers"]
    # activations within 0.1%; what was there before the window is the cuBLAS workspaces
    assert abs(by_category["activations"] - static["activations"]) < 1e-3 * static["activations"]
    assert abs(by_category["other"] - static["other"]) < 4096
