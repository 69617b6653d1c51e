"""``memscope export``: a traced run's events as Chrome-trace / Perfetto JSON, checked against
the format's rules (monotonic counter timestamps per track, properly nested slices per
thread) and against the run's own report."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from conftest import load_json

from memscope.cli import main
from memscope.reporters.perfetto import step_windows


def _properly_nested(slices: list[dict]) -> bool:
    """Every slice lies inside the enclosing open one or after it (1 µs rounding slack)."""
    ends: list[float] = []
    for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
        while ends and ends[-1] <= s["ts"] + 1:
            ends.pop()
        end = s["ts"] + s["dur"]
        if ends and end > ends[-1] + 1:
            return False
        ends.append(end)
    return True


def _valid_chrome_trace(events: list[dict]) -> dict[tuple, list[dict]]:
    """Assert the format's rules; returns the slices per (process, thread)."""
    counters: dict[tuple, list[float]] = defaultdict(list)
    slices: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        assert e["ph"] in ("M", "C", "X", "i") and e["pid"] == 0
        if e["ph"] == "C":
            counters[(e["pid"], e["name"])].append(e["ts"])
        elif e["ph"] == "X":
            assert e["dur"] >= 0 and e["name"]
            slices[(e["pid"], e["tid"])].append(e)
    assert set(counters) == {(0, "memory"), (0, "categories")}  # storage backend: categories
    for ts in counters.values():
        assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert all(_properly_nested(s) for s in slices.values())
    return slices


@pytest.mark.integration  # trains: a 4-step single-rank trace (traced_run)
def test_export_of_a_traced_run_is_a_valid_chrome_trace(traced_run, tmp_path, capsys):
    _, report, outdir = traced_run
    out = str(tmp_path / "trace.json")
    assert main(["export", "--trace", outdir, "--out", out]) == 0
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    slices = _valid_chrome_trace(events)
    assert len(slices) == 2  # step phases, module forwards
    steps = [s for s in slices[(0, 1)] if s["name"] == "step"]
    assert len(steps) == report["metadata"]["steps_completed"]
    modules = {s["name"] for s in slices[(0, 2)]}
    forwards = {e["module"] for e in report["runtime_trace"] if e["event_type"] == "module_forward"}
    assert forwards and forwards <= modules
    (peak,) = [e for e in events if e["ph"] == "i" and e["name"] == "peak"]
    assert peak["args"]["bytes"] == report["peak"]["memory_bytes"]


@pytest.mark.integration  # trains: a 4-step single-rank trace (traced_run)
def test_a_large_export_is_split_into_files_of_whole_steps(traced_run, tmp_path, capsys):
    _, report, outdir = traced_run
    whole = tmp_path / "whole.json"
    assert main(["export", "--trace", outdir, "--out", str(whole)]) == 0
    size = whole.stat().st_size
    capsys.readouterr()
    limit_mb = size / 2**20 / 2.5  # about two steps of the four per file
    out = tmp_path / "split.json"
    assert main(["export", "--trace", outdir, "--out", str(out), "--max-file-mb",
                 str(limit_mb)]) == 0  # fmt: skip
    printed = capsys.readouterr().out.splitlines()
    files = sorted(tmp_path.glob("split.steps*.json"))
    assert not out.exists() and len(files) == len(printed) >= 2
    steps_seen: list[int] = []
    for path in files:
        assert path.stat().st_size <= limit_mb * 2**20
        events = load_json(str(path))["traceEvents"]
        _valid_chrome_trace(events)
        steps = sorted({e["args"]["step"] for e in events if e["ph"] == "X"})
        first, last = (int(v) for v in path.name.split(".steps")[1].split(".")[0].split("-"))
        assert steps == list(range(first, last + 1))  # whole steps, as the name says
        steps_seen += steps
        assert sum(e["ph"] == "M" for e in events) == 4  # each file names its process/threads
    assert sorted(steps_seen) == list(range(report["metadata"]["steps_completed"]))
    assert main(["export", "--trace", outdir, "--out", str(out), "--max-file-mb", "0"]) == 2
    assert "--max-file-mb 0" in capsys.readouterr().err


def test_step_windows_group_whole_steps_within_the_limit():
    assert step_windows([(0, 4), (1, 4), (2, 4), (3, 9), (4, 1)], 8) == [(0, 1), (2, 2), (3, 3),
                                                                           (4, 4)]  # fmt: skip
    assert step_windows([(0, 4), (1, 4)], 100) == [(0, 1)]
    assert step_windows([], 8) == []


def test_export_keeps_a_step_window_and_refuses_bad_input(demo_rank0, tmp_path, capsys):
    _, outdir = demo_rank0
    out = str(tmp_path / "window.json")
    assert main(["export", "--trace", outdir, "--out", out, "--steps", "1:2"]) == 0
    events = load_json(out)["traceEvents"]
    assert {e["args"]["step"] for e in events if e["ph"] == "X"} == {1}
    assert main(["export", "--trace", outdir, "--out", out, "--steps", "2:1"]) == 2
    assert "expected A:B" in capsys.readouterr().err
    assert main(["export", "--trace", str(tmp_path / "none"), "--out", out]) == 2
    assert "no such trace" in capsys.readouterr().err
