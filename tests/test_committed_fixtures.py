"""The committed real fixtures (tests/data/README.md) read through the real readers and
commands, without training: the 2-rank `memscope demo` job (replay, summarize, diff, the job
page) and a public CUDA allocator snapshot (the snapshot reader, analyze-snapshot)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re

import pytest
from conftest import DATA, PUBLIC_SNAPSHOT, load_json

from memscope.cli import main
from memscope.io.snapshot_reader import read_snapshot
from memscope.units import format_bytes

RANKS = ("rank00000", "rank00001")
WHERE = ("step", "phase", "module", "microbatch", "memory_bytes")


def _reports(job: str) -> dict[int, dict]:
    return {
        r: load_json(os.path.join(job, name, "runtime_report.json")) for r, name in enumerate(RANKS)
    }


def test_the_fixture_is_a_complete_two_rank_pipeline_job(demo_job):
    reports = _reports(demo_job)
    for rank, report in reports.items():
        assert report["status"] == "complete" and report["world_size"] == 2
        assert report["metadata"]["pp_size"] == 2 and report["metadata"]["pp_rank"] == rank
    summary = load_json(os.path.join(demo_job, "job_summary.json"))
    assert summary["missing_ranks"] == [] and len(summary["ranks"]) == 2
    for gathered in summary["ranks"]:  # what the run gathered is what each rank wrote
        mine = reports[gathered["rank"]]["peak"]
        assert {k: gathered["peak"][k] for k in WHERE} == {k: mine[k] for k in WHERE}


@pytest.mark.parametrize("rank", RANKS)
def test_replaying_a_ranks_trace_gives_the_peak_its_report_holds(demo_job, rank, capsys):
    folder = os.path.join(demo_job, rank)
    assert main(["analyze", "--trace", os.path.join(folder, "trace.jsonl")]) == 0, (
        capsys.readouterr().err
    )
    replayed = load_json(os.path.join(folder, "replayed_report.json"))["peak"]
    live = load_json(os.path.join(folder, "runtime_report.json"))["peak"]
    assert {k: replayed[k] for k in WHERE} == {k: live[k] for k in WHERE}


def test_summarize_of_the_job_names_each_ranks_peak_and_the_heaviest(demo_job, capsys):
    peaks = {r: rep["peak"] for r, rep in _reports(demo_job).items()}
    assert main(["summarize", "--report", demo_job]) == 0
    out = capsys.readouterr().out
    for rank, peak in peaks.items():
        row = next(line for line in out.splitlines() if line.startswith(f"| {rank} |"))
        assert format_bytes(peak["memory_bytes"]) in row and peak["module"] in row
    heaviest = max(peaks, key=lambda r: peaks[r]["memory_bytes"])
    assert f"heaviest rank: **{heaviest}**" in out


def test_diff_of_two_steps_is_their_step_peaks(demo_job, tmp_path, capsys):
    folder = os.path.join(demo_job, "rank00000")
    steps = {
        s["step"]: s["peak_allocated"]
        for s in load_json(os.path.join(folder, "runtime_report.json"))["steps"]
    }
    out = tmp_path / "diff"
    assert main(["diff", folder, "--step-a", "0", "--step-b", "1", "--out", str(out)]) == 0
    peak = load_json(str(out / "diff.json"))["ranks"][0]["diff"]["peak"]
    assert (peak["a_bytes"], peak["b_bytes"]) == (steps[0], steps[1])
    assert peak["delta_bytes"] == steps[1] - steps[0]


def test_the_job_page_links_both_rank_pages_and_plots_their_peaks(demo_job, capsys):
    peaks = {r: rep["peak"]["memory_bytes"] for r, rep in _reports(demo_job).items()}
    assert main(["visualize-runtime", "--report", demo_job]) == 0, capsys.readouterr().err
    with open(os.path.join(demo_job, "job_report.html"), encoding="utf-8") as f:
        html = f.read()
    data = json.loads(html.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    assert {r["rank"]: r["peak_allocated"] for r in data["ranks"]} == peaks
    for row, rank in zip(data["ranks"], RANKS, strict=True):
        assert row["page"] == f"{rank}/runtime_report.html"
        assert os.path.getsize(os.path.join(demo_job, row["page"])) > 100_000


def _allocated_before_each_event(snapshot: dict) -> list[int]:
    """Bytes allocated on device 0 before each recorded event and at the end, walked back
    from the blocks allocated at dump time (an independent replay of the allocator trace)."""
    now = sum(b["size"] for s in snapshot["segments"] if s["device"] == 0
              for b in s["blocks"] if b["state"] == "active_allocated")  # fmt: skip
    states = [now]
    for event in reversed(snapshot["device_traces"][0]):
        if event["action"] == "alloc":
            now -= event["size"]
        elif event["action"] == "free_completed":
            now += event["size"]
        states.append(now)
    return states[::-1]


def test_the_plain_data_reader_reads_a_public_cuda_snapshot_as_pickle_does():
    with open(PUBLIC_SNAPSHOT, "rb") as f:
        data = f.read()
    with open(os.path.join(DATA, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert f"sha256 `{hashlib.sha256(data).hexdigest()}`" in readme  # the file its source has
    trusted = pickle.loads(data)  # the standard unpickler, on that known file only
    snapshot = read_snapshot(PUBLIC_SNAPSHOT)
    assert snapshot == trusted
    assert snapshot["segments"] and snapshot["device_traces"][0]


def test_analyze_snapshot_finds_the_peak_a_replay_of_the_public_snapshot_gives(tmp_path, capsys):
    states = _allocated_before_each_event(read_snapshot(PUBLIC_SNAPSHOT))
    out = tmp_path / "analysis.json"
    assert main(["analyze-snapshot", "--snapshot", PUBLIC_SNAPSHOT, "--out", str(out)]) == 0
    result = load_json(str(out))
    assert result["peak_allocated_bytes"] == max(states)
    assert result["window_start_bytes"] == states[0] and result["inconsistencies"] == 0
    assert result["composition"]["total_bytes"] == max(states)
    printed = capsys.readouterr().out
    assert re.search(rf"peak allocated {re.escape(format_bytes(max(states)))}\b", printed)
