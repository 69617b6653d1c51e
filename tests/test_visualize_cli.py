"""memscope visualize-runtime as a user runs it (in-process through ``memscope.cli.main``)."""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import pytest

from memscope.cli import main


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``memscope visualize-runtime ARGS``."""
    rc = main(["visualize-runtime", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _job_dir(tmp_path, report_path, ranks=(0, 1)):
    """A job directory of one launch: the single-rank report as data-parallel ranks."""
    job = tmp_path / "job"
    with open(report_path) as f:
        report = json.load(f)
    for rank in ranks:
        (job / f"rank{rank:05d}").mkdir(parents=True)
        report["rank"] = report["metadata"]["rank"] = report["metadata"]["dp_rank"] = rank
        report["world_size"] = report["metadata"]["world_size"] = max(ranks) + 1
        (job / f"rank{rank:05d}" / "runtime_report.json").write_text(json.dumps(report))
    return job


def test_rank_report_gives_html_next_to_it_and_prints_only_the_path(tmp_path, capsys, demo_rank0):
    _, outdir = demo_rank0
    src = tmp_path / "runtime_report.json"
    shutil.copy(f"{outdir}/rank00000/runtime_report.json", src)
    rc, out, err = _cli(capsys, "--report", str(src))
    assert rc == 0, err
    assert out == f"{tmp_path / 'runtime_report.html'}\n"
    assert (tmp_path / "runtime_report.html").stat().st_size > 100_000
    page = tmp_path / "custom.html"
    assert _cli(capsys, "--report", str(src), "--out", str(page))[0] == 0 and page.exists()


def test_job_dir_page_survives_a_broken_rank(tmp_path, capsys, demo_rank0):
    _, outdir = demo_rank0
    job = _job_dir(tmp_path, f"{outdir}/rank00000/runtime_report.json")
    (job / "rank00002").mkdir()
    (job / "rank00002" / "runtime_report.json").write_text('{"schema_version": "1.0", "pe')
    rc, _, err = _cli(capsys, "--report", str(job))
    assert rc == 0, err
    html = (job / "job_report.html").read_text()
    data = html.split('id="memscope-data">', 1)[1].split("</script>", 1)[0]
    ranks = {r["rank"]: r for r in json.loads(data)["ranks"]}
    assert ranks[2]["status"] == "missing" and "truncated JSON" in ranks[2]["problem"]


def test_job_dir_without_any_readable_rank_fails_clearly(tmp_path, capsys):
    (tmp_path / "rank00000").mkdir()
    rc, _, err = _cli(capsys, "--report", str(tmp_path))
    assert rc == 2 and "no readable runtime_report.json" in err


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["visualize-runtime", "--help"])
    assert exc.value.code == 0 and "--report" in capsys.readouterr().out


def test_bad_rank_reports_fail_with_one_line(tmp_path, capsys, demo_rank0):
    report, _ = demo_rank0
    truncated = tmp_path / "truncated.json"
    truncated.write_text(json.dumps(report)[:500])
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(dict(report, schema_version="99.0")))
    cases = {
        str(tmp_path / "absent.json"): "no such file",
        str(truncated): "truncated JSON",
        str(newer): "newer than this memscope supports",
    }
    for path, message in cases.items():
        rc, out, err = _cli(capsys, "--report", path)
        assert rc == 2, (path, err)
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], err
        assert lines[0].startswith("memscope visualize-runtime: error:")
        assert "Traceback" not in err
    assert not list(tmp_path.glob("*.html"))


def test_job_dir_with_a_malformed_and_an_incomplete_rank(tmp_path, capsys, demo_rank0):
    report, _ = demo_rank0
    job = tmp_path / "job"
    ranks = {
        0: dict(report, rank=0, world_size=4),
        1: dict(report, rank=1, world_size=4, status="oom", status_reason="CUDA OOM"),
        3: dict(report, rank=3, world_size=4, steps="not a list of steps"),
    }
    for rank, data in ranks.items():  # one launch: each rank its own grid position
        data["metadata"] = dict(report["metadata"], dp_rank=rank)
    for rank, data in ranks.items():
        (job / f"rank{rank:05d}").mkdir(parents=True)
        (job / f"rank{rank:05d}" / "runtime_report.json").write_text(json.dumps(data))
    page = tmp_path / "page.html"
    rc, out, err = _cli(capsys, "--report", str(job), "--out", str(page))
    assert rc == 0, err
    assert out == f"{page}\n" and "Traceback" not in err
    data = page.read_text().split('id="memscope-data">', 1)[1].split("</script>", 1)[0]
    rows = {r["rank"]: r for r in json.loads(data)["ranks"]}
    assert [rows[r]["status"] for r in range(4)] == ["complete", "oom", "missing", "missing"]
    assert "no rank directory" in rows[2]["problem"] and "malformed" in rows[3]["problem"]
    assert not (job / "job_report.html").exists()


EXAMPLE_JOB = pathlib.Path(__file__).parent.parent / "examples" / "cpu_pp2_demo"


def _page_links(html: str) -> list[str]:
    return re.findall(r'<a id="job-link" href="([^"]+)"', html)


def test_rank_pages_of_a_job_show_their_grid_position_and_link_the_job_page(tmp_path, capsys):
    """The real PP=2 example job: each rank page's title and heading give its position in
    the grid, and its link resolves to the job page written beside the rank folders."""
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE_JOB, job)
    for page in job.glob("**/*.html"):
        page.unlink()
    assert main(["visualize-runtime", "--report", str(job)]) == 0
    capsys.readouterr()
    for rank, stage in ((0, 0), (1, 1)):
        folder = job / f"rank{rank:05d}"
        html = (folder / "runtime_report.html").read_text()
        position = f"TP 0/1 · PP {stage}/2 · DP 0/1 · CP 0/1 · EP 0/1"
        assert f"<title>MemScope — rank {rank} of 2 ({position})</title>" in html
        assert f'id="grid-position">({position})</span>' in html
        (link,) = _page_links(html)
        assert (folder / link).resolve() == (job / "job_report.html").resolve()


def test_a_rank_page_links_the_job_page_only_when_there_is_one(tmp_path, capsys):
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE_JOB / "rank00001", job / "rank00001")
    report = job / "rank00001" / "runtime_report.json"
    page = job / "rank00001" / "runtime_report.html"
    assert main(["visualize-runtime", "--report", str(report)]) == 0
    assert _page_links(page.read_text()) == []
    (job / "job_report.html").write_text("<html></html>")
    assert main(["visualize-runtime", "--report", str(report)]) == 0
    assert _page_links(page.read_text()) == ["../job_report.html"]
    capsys.readouterr()
