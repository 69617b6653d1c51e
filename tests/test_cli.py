"""The memscope CLI as a user runs it (subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import load_json


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "memscope.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_subcommands_and_each_has_help():
    out = _cli("--help")
    assert out.returncode == 0 and "demo" in out.stdout and "summarize" in out.stdout
    for sub in ("demo", "summarize"):
        res = _cli(sub, "--help")
        assert res.returncode == 0 and "usage: memscope " + sub in res.stdout


@pytest.mark.parametrize("command", ["summarize", "visualize-runtime"])
@pytest.mark.parametrize(
    ("content", "needle"),
    [(None, "no such file"), ('{"schema_version": "1.0", "pe', "truncated JSON"),
     ('{"schema_version": "3.1"}', "newer than")],
)  # fmt: skip
def test_bad_report_gives_one_line_and_exit_2(tmp_path, command, content, needle):
    path = tmp_path / "runtime_report.json"
    if content is not None:
        path.write_text(content)
    res = _cli(command, "--report", str(path))
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.stderr
    if content is not None:
        assert path.read_text() == content  # nothing already written is touched
    assert not (tmp_path / "runtime_report.html").exists()


def test_summarize_prints_the_markdown(traced_run):
    _, _, outdir = traced_run
    res = _cli("summarize", "--report", os.path.join(outdir, "rank00000", "runtime_report.json"))
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout.startswith("# MemScope runtime report — rank 0 of 1")
    assert "## Peak" in res.stdout


@pytest.mark.multiprocess
def test_demo_trains_two_processes_and_leaves_reports(tmp_path):
    res = _cli("demo", "--outdir", str(tmp_path), "--steps", "2", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        report = load_json(str(tmp_path / f"rank{rank:05d}" / "runtime_report.json"))
        assert report["status"] == "complete" and report["metadata"]["pp_size"] == 2
        assert f"rank {rank}: peak" in res.stdout
        assert (tmp_path / f"rank{rank:05d}" / "runtime_report.html").stat().st_size > 100_000
    assert (tmp_path / "job_report.html").exists()
    assert f"reports: {tmp_path}" in res.stdout
