"""The memscope CLI as a user runs it: in-process through ``memscope.cli.main``, plus one
subprocess for the ``python -m memscope.cli`` entry point itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import load_json

from memscope.cli import main


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*args, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_help_lists_subcommands_and_each_has_help(capsys):
    out = _help(capsys)
    for sub in ("demo", "summarize", "visualize-runtime", "analyze-static", "analyze"):
        assert sub in out
    for sub in ("demo", "summarize"):
        assert "usage: memscope " + sub in _help(capsys, sub)


def test_help_shows_defaults(capsys):
    demo = _help(capsys, "demo")
    assert "(default: memscope_demo)" in demo and "(default: 4)" in demo
    assert "(default: None)" not in demo and "(default: False)" not in demo
    static = _help(capsys, "analyze-static")
    assert "(default: outputs)" in static and "(default: cuda)" in static
    assert "(default: None)" not in static and "(default: False)" not in static


def test_no_command_prints_usage_and_exit_2(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "usage: memscope" in captured.err


@pytest.mark.parametrize("command", ["summarize", "visualize-runtime"])
@pytest.mark.parametrize(
    ("content", "needle"),
    [(None, "no such file"), ('{"schema_version": "1.0", "pe', "truncated JSON"),
     ('{"schema_version": "3.1"}', "newer than")],
)  # fmt: skip
def test_bad_report_gives_one_line_and_exit_2(tmp_path, capsys, command, content, needle):
    path = tmp_path / "runtime_report.json"
    if content is not None:
        path.write_text(content)
    assert main([command, "--report", str(path)]) == 2
    res = capsys.readouterr()
    assert res.out == ""
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.err
    if content is not None:
        assert path.read_text() == content  # nothing already written is touched
    assert not (tmp_path / "runtime_report.html").exists()


def test_module_entry_point_passes_the_exit_code_and_one_line(tmp_path):
    """``python -m memscope.cli``: the process boundary itself (exit status, stderr)."""
    res = subprocess.run(
        [sys.executable, "-m", "memscope.cli", "summarize", "--report", str(tmp_path / "x.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memscope summarize: error:")
    assert "no such file" in lines[0]


@pytest.mark.integration  # trains megatron-core in this process (the traced_run fixture)
def test_summarize_prints_the_markdown(traced_run, capsys):
    _, _, outdir = traced_run
    rc = main(["summarize", "--report", os.path.join(outdir, "rank00000", "runtime_report.json")])
    res = capsys.readouterr()
    assert rc == 0 and res.err == ""
    assert res.out.startswith("# MemScope runtime report — rank 0 of 1")
    assert "## Peak" in res.out


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"


def _shape(value: Any, skip: tuple[str, ...] = ()) -> Any:
    """A JSON document's keys, nested (a list: the union of its items' shapes), without its
    values and without the keys in ``skip``: what a report written by older code lacks or has
    extra."""
    if isinstance(value, dict):
        return {k: _shape(v, skip) for k, v in value.items() if k not in skip}
    if isinstance(value, list):
        merged: dict[str, Any] = {}
        for item in value:
            if isinstance(item, dict):
                merged.update(_shape(item, skip))
        return [merged] if merged else []
    return None


#: where the README's ``memscope demo`` excerpt ran (the command prints absolute paths)
README_DEMO_DIR = "/home/you/memscope_demo"


def _readme_demo_lines() -> list[str]:
    """The lines the README shows ``memscope demo`` printing to stdout (rank, job page,
    reports), in order."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("$ memscope demo\n", 1)[1].split("$ memscope summarize", 1)[0]
    return [line for line in block.splitlines() if not line.startswith("memscope: ")]


@pytest.mark.multiprocess
def test_demo_trains_two_processes_and_leaves_reports(tmp_path, capsys):
    rc = main(["demo", "--outdir", str(tmp_path)])  # the README's command, default steps
    res = capsys.readouterr()
    assert rc == 0, res.err[-3000:]
    shown = [line.replace(README_DEMO_DIR, str(tmp_path)) for line in _readme_demo_lines()]
    assert len(shown) == 4 and res.out.splitlines() == shown  # the README's excerpt is current
    first = "rank00000/runtime_report.json"
    release = [load_json(str(d / first))["metadata"]["megatron_core_version"]
               for d in (EXAMPLE, tmp_path)]  # fmt: skip
    # which settings the spec reads follows the release (CI's second run: a newer one)
    skip = () if release[0] == release[1] else ("spec_inputs", "spec_sources")
    for name in (first, "rank00001/runtime_report.json", "job_summary.json"):
        example, fresh = load_json(str(EXAMPLE / name)), load_json(str(tmp_path / name))
        assert _shape(example, skip) == _shape(fresh, skip), name  # the example is current
        if "peak" in fresh:
            assert example["peak"]["memory_bytes"] == fresh["peak"]["memory_bytes"], name
            assert example["sections"] == fresh["sections"], name
    for rank in (0, 1):
        report = load_json(str(tmp_path / f"rank{rank:05d}" / "runtime_report.json"))
        assert report["status"] == "complete" and report["metadata"]["pp_size"] == 2
        assert f"rank {rank}: peak" in res.out
        assert (tmp_path / f"rank{rank:05d}" / "runtime_report.html").stat().st_size > 100_000
    page = (tmp_path / "job_report.html").read_text()
    data = json.loads(page.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    for row in data["ranks"]:  # the job page links each rank's page, relative to itself
        assert (
            tmp_path / row["page"]
        ) == tmp_path / f"rank{row['rank']:05d}" / "runtime_report.html"
    runs = {load_json(str(tmp_path / f"rank{r:05d}" / "runtime_report.json"))["metadata"]["run_id"]
            for r in (0, 1)}  # fmt: skip
    assert len(runs) == 1  # one launch, one run id
    assert f"reports: {tmp_path}" in res.out
