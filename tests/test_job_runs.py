"""The job view tells runs apart: rank reports of another run, duplicate ranks or grid
positions, or a disagreeing world size are refused (one line, exit 2) unless the user picks a
run (``--run-id``) or merges them flagged (``--allow-mixed-runs``); and the job workflow: rank
pages linked from the job page, rank folders wherever a report file is taken, the job summary
in the terminal. The rank reports are those of a real 2-process PP=2 run
(``examples/cpu_pp2_demo``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from memscope.analysis.job import RankEntry, job_mixups, summarize_job
from memscope.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"


def _report(rank: int, run_id: str) -> dict:
    path = EXAMPLE / f"rank{rank:05d}" / "runtime_report.json"
    report = copy.deepcopy(json.loads(path.read_text()))
    report["metadata"]["run_id"] = run_id
    return report


def _write(job: Path, folder_rank: int, report: dict) -> None:
    folder = job / f"rank{folder_rank:05d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runtime_report.json").write_text(json.dumps(report))


def _job(tmp_path: Path, run_id: str = "job-8") -> Path:
    """A job directory of the real run's two ranks."""
    job = tmp_path / "job"
    for rank in (0, 1):
        _write(job, rank, _report(rank, run_id))
    return job


def _leftover(job: Path) -> None:
    """Rank folders 2 and 3 of an earlier run with 4 ranks (PP=2, DP=2) in the same place."""
    for rank in (2, 3):
        old = _report(rank - 2, "job-7")
        old["rank"], old["world_size"] = rank, 4
        old["metadata"].update(rank=rank, world_size=4, dp_rank=1, dp_size=2)
        _write(job, rank, old)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _payload(page: Path) -> dict:
    return json.loads(page.read_text().split('id="memscope-data">', 1)[1].split("</script>")[0])


def test_reports_of_one_run_give_no_warning():
    summary = summarize_job([RankEntry(0, _report(0, "job-7")), RankEntry(1, _report(1, "job-7"))])
    assert summary["runs"] == [{"run_id": "job-7", "ranks": 2}] and summary["runs_warning"] == ""
    assert summary["mixups"] == {}
    assert not any(row.get("other_run") for row in summary["ranks"])


@pytest.mark.parametrize("command", ["visualize-runtime", "summarize"])
def test_leftover_rank_folders_of_another_run_are_refused_in_one_line(tmp_path, capsys, command):
    job = _job(tmp_path)
    _leftover(job)
    rc, out, err = _cli(capsys, command, "--report", str(job))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    runs = "rank reports of 2 runs: job-8 (rank00000..rank00001), job-7 (rank00002..rank00003)"
    assert runs in err
    assert "world sizes disagree: 2 (rank00000..rank00001), 4 (rank00002..rank00003)" in err
    assert "--run-id ID" in err and "--allow-mixed-runs" in err
    assert not (job / "job_report.html").exists()
    assert not (job / "rank00000" / "runtime_report.html").exists()  # nothing written


def test_run_id_keeps_one_runs_ranks(tmp_path, capsys):
    job = _job(tmp_path)
    _leftover(job)
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job), "--run-id", "job-8")
    assert rc == 0, err
    data = _payload(job / "job_report.html")
    assert (data["world_size"], data["missing"], data["runs_warning"]) == (2, 0, "")
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert not (job / "rank00002" / "runtime_report.html").exists()  # not this run's
    rc, _, err = _cli(capsys, "summarize", "--report", str(job), "--run-id", "nope")
    assert rc == 2 and "no rank report of run nope (runs: job-7, job-8)" in err


def test_allow_mixed_runs_merges_them_flagged(tmp_path, capsys):
    job = _job(tmp_path)
    _leftover(job)
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job), "--allow-mixed-runs")
    assert rc == 0, err
    assert "come from 2 runs" in err  # said on the terminal
    data = _payload(job / "job_report.html")
    assert data["world_size"] == 4 and "world sizes disagree" in data["runs_warning"]
    assert [r["rank"] for r in data["ranks"] if r.get("other_run")] == [2, 3]
    rc, out, _ = _cli(capsys, "summarize", "--report", str(job), "--allow-mixed-runs")
    assert rc == 0 and "**mixed reports**" in out and "other run: job-7" in out


def test_duplicate_grid_positions_and_ranks_are_flagged(tmp_path, capsys):
    job = _job(tmp_path)
    twin = _report(0, "job-8")  # the first stage's report again, as rank 1
    twin["rank"] = twin["metadata"]["rank"] = 1
    _write(job, 1, twin)
    _write(job, 2, _report(0, "job-8") | {"world_size": 2})  # rank 0's report in rank00002/
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "rank 0 claimed by rank00000, rank00002" in err
    assert "grid position pp0 tp0 dp0 cp0 ep0 claimed by rank00000..rank00002" in err
    entries = [RankEntry(0, _report(0, "a"), where="rank00000"),
               RankEntry(3, _report(1, "a"), where="rank00003")]  # fmt: skip
    assert job_mixups(entries) == {"rank": "rank00003 holds rank 1's report"}


def test_a_world_size_that_disagrees_is_flagged(tmp_path, capsys):
    job = _job(tmp_path)
    wider = _report(1, "job-8")
    wider["world_size"] = 8
    _write(job, 1, wider)
    rc, _, err = _cli(capsys, "summarize", "--report", str(job))
    assert rc == 2 and "world sizes disagree: 2 (rank00000), 8 (rank00001)" in err
    assert "rank reports of" not in err  # one run


def test_job_page_links_every_rank_page_and_job_only_skips_them(tmp_path, capsys):
    job = _job(tmp_path)
    rc, out, err = _cli(capsys, "visualize-runtime", "--report", str(job))
    assert rc == 0, err
    assert out == f"{job / 'job_report.html'}\n" and "wrote 2 rank page(s)" in err
    links = [row["page"] for row in _payload(job / "job_report.html")["ranks"]]
    assert links == ["rank00000/runtime_report.html", "rank00001/runtime_report.html"]
    for link in links:
        assert _payload(job / link)["kind"] == "rank"  # each link resolves to a rank page
    elsewhere = tmp_path / "pages" / "job.html"
    elsewhere.parent.mkdir()
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job), "--out", str(elsewhere))
    assert rc == 0, err
    for row in _payload(elsewhere)["ranks"]:
        own = job / f"rank{row['rank']:05d}" / "runtime_report.html"
        assert (elsewhere.parent / row["page"]).resolve() == own.resolve()
    (job / "rank00000" / "runtime_report.html").unlink()
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job), "--job-only")
    assert rc == 0 and "rank page" not in err
    assert not (job / "rank00000" / "runtime_report.html").exists()
    assert not any("page" in row for row in _payload(job / "job_report.html")["ranks"])


def test_a_rank_folder_is_taken_wherever_a_report_is(tmp_path, capsys):
    job = _job(tmp_path)
    folder = str(job / "rank00001")
    rc, out, _ = _cli(capsys, "visualize-runtime", "--report", folder)
    assert rc == 0 and out == f"{job / 'rank00001' / 'runtime_report.html'}\n"
    rc, out, _ = _cli(capsys, "summarize", "--report", folder + "/")
    assert rc == 0 and out.startswith("# MemScope runtime report — rank 1 of 2")
    from memscope.cli.plan_cmd import _calibration  # what plan --calibrate reads

    assert _calibration(folder)["ranks"] == 1 and _calibration(str(job))["ranks"] == 2
    rc, _, err = _cli(capsys, "diff", str(job / "rank00000"), folder, "--out", str(tmp_path / "d"))
    assert rc == 0, err
    assert (tmp_path / "d" / "diff.json").exists()


def test_summarize_a_job_directory_prints_every_rank_and_the_heaviest(tmp_path, capsys):
    job = _job(tmp_path)
    rc, out, err = _cli(capsys, "summarize", "--report", str(job))
    assert rc == 0, err
    assert out.startswith("# MemScope job summary — 2 ranks")
    assert "- 0 missing, 0 not complete" in out and "- run: `job-8`" in out
    reports = [_report(r, "job-8") for r in (0, 1)]
    heaviest = max((0, 1), key=lambda r: reports[r]["peak"]["memory_bytes"])
    assert f"- heaviest rank: **{heaviest}**" in out
    rows = [line for line in out.splitlines() if line.startswith(("| 0 ", "| 1 "))]
    assert len(rows) == 2 and all("complete" in row and "step " in row for row in rows)


def test_a_rank_page_that_cannot_be_written_is_said_and_left_unlinked(tmp_path, capsys):
    job = _job(tmp_path)
    (job / "rank00001" / "runtime_report.html").mkdir()  # not a file: refused as an output
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job))
    assert rc == 0, err
    assert "wrote 1 rank page(s)" in err and "no rank page: " in err and "rank00001" in err
    rows = _payload(job / "job_report.html")["ranks"]
    assert [row.get("page") for row in rows] == ["rank00000/runtime_report.html", None]


def test_a_large_job_gets_the_pages_of_the_ranks_its_job_page_plots(tmp_path, capsys, monkeypatch):
    import memscope.cli.pages as pages_module
    import memscope.cli.visualize_cmd as visualize_module

    monkeypatch.setattr(pages_module, "ALL_RANK_PAGES_UP_TO", 4)
    monkeypatch.setattr(visualize_module, "ALL_RANK_PAGES_UP_TO", 4)
    job, world = tmp_path / "job", 18  # PP=2 x DP=9: stage 0 (even ranks) peaks higher
    for rank in range(world):
        report = _report(rank % 2, "job-9")
        report["rank"], report["world_size"] = rank, world
        report["metadata"].update(rank=rank, world_size=world, dp_rank=rank // 2, dp_size=9)
        _write(job, rank, report)
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job))
    assert rc == 0, err
    paged = {r for r in range(world) if (job / f"rank{r:05d}" / "runtime_report.html").exists()}
    # the job page's 16 timelines: each stage's heaviest, then the highest peaks (stage 0's)
    assert len(paged) == 16 and {0, 1} <= paged and set(range(0, world, 2)) <= paged
    assert set(range(world)) - paged <= set(range(1, world, 2))
    assert "the other 2 rank(s) have no page" in err and "--all-rank-pages" in err
    links = {row["rank"] for row in _payload(job / "job_report.html")["ranks"] if "page" in row}
    assert links == paged
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job), "--all-rank-pages")
    assert rc == 0 and "wrote 18 rank page(s)" in err and "have no page" not in err


def test_a_stray_folder_beyond_the_reported_world_size_is_named_not_counted(tmp_path, capsys):
    """A leftover empty ``rank00007/`` beside the two ranks of a 2-rank run: the job is the 2
    ranks the reports say, nothing missing, and the stray folder is named apart."""
    job = tmp_path / "job"
    for rank in (0, 1):
        _write(job, rank, _report(rank, "run-a"))
    (job / "rank00007").mkdir()
    assert main(["summarize", "--report", str(job)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# MemScope job summary — 2 ranks")
    assert "- 0 missing" in out and "not counted: rank00007" in out
    assert main(["visualize-runtime", "--report", str(job), "--job-only"]) == 0
    page = (job / "job_report.html").read_text()
    data = json.loads(page.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    assert (data["world_size"], data["missing"]) == (2, 0)
    assert [s["where"] for s in data["strays"]] == ["rank00007"]
    assert [row["rank"] for row in data["ranks"]] == [0, 1]
    capsys.readouterr()


def test_a_folder_without_a_report_inside_the_world_size_is_still_a_missing_rank():
    entries = [RankEntry(0, _report(0, "run-a")), RankEntry(1, None, "no report", "rank00001")]
    summary = summarize_job(entries)
    assert (summary["world_size"], summary["missing"], summary["strays"]) == (2, 1, [])


def test_a_rank_a_job_summary_names_as_missing_is_never_a_stray():
    """A job summary's missing rank beyond the world size its summaries claim is a rank the
    collector expected, not a leftover folder."""
    entries = [RankEntry(0, _report(0, "run-a")), RankEntry(2, None, "no summary within 5 s")]
    summary = summarize_job(entries)
    assert (summary["world_size"], summary["strays"]) == (3, [])
    assert [row["rank"] for row in summary["ranks"]] == [0, 1, 2]


def test_plan_calibrate_refuses_a_folder_that_mixes_runs(tmp_path, capsys):
    """The job view's check applies to --calibrate: rank folders of two runs are refused in
    one line (exit 2), one run's folder calibrates."""
    config = str(Path(__file__).resolve().parent.parent / "configs/static/tiny_gpt.json")
    mixed = tmp_path / "mixed"
    _write(mixed, 0, _report(0, "run-a"))
    _write(mixed, 1, _report(1, "run-b"))
    argv = ["plan", "--config", config, "--gpu-memory", "8GiB", "--world-size", "2",
            "--outdir", str(tmp_path / "out")]  # fmt: skip
    assert main([*argv, "--calibrate", str(mixed)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rank reports of 2 runs" in err
    one = tmp_path / "one"
    _write(one, 0, _report(0, "run-a"))
    _write(one, 1, _report(1, "run-a"))
    assert main([*argv, "--calibrate", str(one)]) == 0
    capsys.readouterr()


def test_the_flagscale_trial_reader_gives_no_number_for_a_folder_that_mixes_runs(tmp_path):
    from memscope.integrations.flagscale.autotuner import MIB, trial_max_memory

    reports = {0: _report(0, "run-a"), 1: _report(1, "run-a")}
    for rank, report in reports.items():
        _write(tmp_path / "one", rank, report)
    expected = max(r["peak"]["reserved_bytes"] for r in reports.values()) / MIB
    assert trial_max_memory(str(tmp_path / "one")) == expected
    _write(tmp_path / "one", 1, _report(1, "run-b"))
    assert trial_max_memory(str(tmp_path / "one")) is None
