"""The job view tells runs apart: rank reports of another run are flagged, never merged."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from memscope.analysis.job import RankEntry, summarize_job
from memscope.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"


def _report(rank: int, run_id: str) -> dict:
    path = EXAMPLE / f"rank{rank:05d}" / "runtime_report.json"
    report = copy.deepcopy(json.loads(path.read_text()))
    report["metadata"]["run_id"] = run_id
    return report


def test_reports_of_one_run_give_no_warning():
    summary = summarize_job([RankEntry(0, _report(0, "job-7")), RankEntry(1, _report(1, "job-7"))])
    assert summary["runs"] == [{"run_id": "job-7", "ranks": 2}] and summary["runs_warning"] == ""
    assert not any(row.get("other_run") for row in summary["ranks"])


def test_a_leftover_rank_from_another_run_is_flagged(tmp_path, capsys):
    summary = summarize_job(
        [
            RankEntry(0, _report(0, "job-8")),
            RankEntry(1, _report(1, "job-8")),
            RankEntry(2, _report(1, "job-7")),
        ]
    )
    assert [r["run_id"] for r in summary["runs"]] == ["job-8", "job-7"]
    assert "2 runs" in summary["runs_warning"] and "job-7 (1 ranks)" in summary["runs_warning"]
    flagged = [row["rank"] for row in summary["ranks"] if row.get("other_run")]
    assert flagged == [2]
    for rank, run in ((0, "job-8"), (1, "job-8"), (2, "job-7")):
        folder = tmp_path / f"rank{rank:05d}"
        folder.mkdir()
        report = _report(min(rank, 1), run)
        report["rank"], report["world_size"] = rank, 3
        (folder / "runtime_report.json").write_text(json.dumps(report))
    assert main(["visualize-runtime", "--report", str(tmp_path)]) == 0
    assert "come from 2 runs" in capsys.readouterr().err
    assert "come from 2 runs" in (tmp_path / "job_report.html").read_text()
