"""What the CLI says: one-line errors that name the path once and never a temporary file,
``--help`` defaults on every option of every command, where analyze-static wrote, and
``--rank`` with ``--all-ranks``."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from memscope.cli import build_parser, main
from memscope.cli.common import CliError, write_output

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_REPORT = os.path.join(REPO, "examples", "cpu_pp2_demo", "rank00000", "runtime_report.json")
STATIC_CONFIG = os.path.join(REPO, "configs", "static", "llama3_8b_tp4_pp2.json")


def _bad_report(tmp_path, kind):
    """A report path that is missing, truncated or of a newer schema."""
    path = tmp_path / "runtime_report.json"
    if kind == "truncated":
        with open(EXAMPLE_REPORT, encoding="utf-8") as f:
            path.write_text(f.read()[:500])
    elif kind == "newer_schema":
        with open(EXAMPLE_REPORT, encoding="utf-8") as f:
            report = json.load(f)
        report["schema_version"] = "99.0"
        path.write_text(json.dumps(report))
    return str(path)


COMMANDS = {
    "summarize": lambda p, tmp: ["summarize", "--report", p],
    "visualize-runtime": lambda p, tmp: [
        "visualize-runtime", "--report", p, "--out", str(tmp / "page.html")
    ],
    "diff": lambda p, tmp: ["diff", p, EXAMPLE_REPORT, "--out", str(tmp / "d")],
    "plan --calibrate": lambda p, tmp: [
        "plan", "--config", STATIC_CONFIG, "--gpu-memory", "80GiB", "--calibrate", p,
        "--outdir", str(tmp / "p"),
    ],
}  # fmt: skip


@pytest.mark.parametrize("kind", ["missing", "truncated", "newer_schema"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_report_error_names_the_path_once_and_no_temporary_file(
    tmp_path, capsys, command, kind
):
    path = _bad_report(tmp_path, kind)
    assert main(COMMANDS[command](path, tmp_path)) == 2
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.count(path) == 1, line
    assert ".tmp" not in line and "Traceback" not in err


@pytest.mark.parametrize("kind", ["missing", "truncated"])
def test_bad_static_config_error_names_the_path_once(tmp_path, capsys, kind):
    path = tmp_path / "config.json"
    if kind == "truncated":
        with open(STATIC_CONFIG, encoding="utf-8") as f:
            path.write_text(f.read()[:40])
    args = ["--config", str(path), "--outdir", str(tmp_path / "o")]
    for command in (["analyze-static"], ["plan", "--gpu-memory", "80GiB"]):
        assert main([*command, *args]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.count(str(path)) == 1, line


def test_write_error_names_the_output_not_the_temporary_file(tmp_path):
    """An OS error carries the name of the file it failed on (the temporary file beside the
    output); the one-line error names the output and the reason only."""
    (tmp_path / "blocker").write_text("a file where a folder should be")
    out = str(tmp_path / "blocker" / "static_report.json")
    with pytest.raises(CliError) as exc:
        write_output(out, "text")
    message = str(exc.value)
    assert message.count(out) == 1 and ".tmp" not in message and "Errno" not in message


def _subcommands():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(sub.choices.items())


@pytest.mark.parametrize(("name", "parser"), _subcommands())
def test_help_shows_the_default_of_every_option(name, parser):
    text = " ".join(parser.format_help().split())  # unwrapped
    for action in parser._actions:
        default = action.default
        if not action.option_strings or default in (None, False, argparse.SUPPRESS):
            continue
        shown = f"default: {default}" in text or f"default {default}" in text
        assert shown, f"{name} {action.option_strings[0]}: default {default!r} not in --help"
    assert "(default: None)" not in text and "(default: False)" not in text


def test_analyze_static_says_where_it_wrote_without_outdir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze-static", "--config", STATIC_CONFIG]) == 0
    err = capsys.readouterr().err
    wrote = [line for line in err.splitlines() if line.startswith("memscope: wrote ")]
    assert wrote == [
        f"memscope: wrote {tmp_path / 'outputs' / 'static_report.json'} and "
        f"{tmp_path / 'outputs' / 'static_report.md'} (the default --outdir outputs/ in the "
        "working directory)"
    ]
    assert (tmp_path / "outputs" / "static_report.md").is_file()
    assert main(["analyze-static", "--config", STATIC_CONFIG, "--outdir", "elsewhere"]) == 0
    err = capsys.readouterr().err
    assert f"wrote {tmp_path / 'elsewhere' / 'static_report.json'}" in err
    assert "default --outdir" not in err


def test_rank_with_all_ranks_details_that_rank_and_marks_its_line(tmp_path, capsys):
    args = ["analyze-static", "--config", STATIC_CONFIG, "--outdir", str(tmp_path)]
    assert main([*args, "--all-ranks"]) == 0
    worst = capsys.readouterr().out.splitlines()
    assert main([*args, "--all-ranks", "--rank", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    positions = [line for line in lines if line.startswith("tp=")]
    assert len(positions) == len([line for line in worst if line.startswith("tp=")]) > 1
    (marked,) = [line for line in positions if line.endswith("<- rank 7")]
    assert lines[-1].startswith("peak ") and " on rank 7 " in lines[-1]
    with open(tmp_path / "static_report.json", encoding="utf-8") as f:
        report = json.load(f)
    assert report["rank"] == 7
    assert f"{report['summary']['tp_rank']} pp={report['summary']['pp_rank']} " in marked
    # without --rank the detailed (worst) rank's line is the marked one
    (worst_marked,) = [line for line in worst if "<- rank" in line]
    assert worst[-1].split(" on rank ")[1].split()[0] == worst_marked.rsplit(" ", 1)[1]


@pytest.mark.parametrize("command", [["analyze-static"], ["plan", "--gpu-memory", "80GiB"]])
def test_a_transformer_engine_release_that_is_no_version_is_one_line_and_exit_2(
    tmp_path, capsys, command
):
    args = [*command, "--config", STATIC_CONFIG, "--outdir", str(tmp_path / "o"),
            "--transformer-engine-version", "latest"]  # fmt: skip
    assert main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "transformer_engine_version 'latest' is not a release number" in line
    assert not (tmp_path / "o").exists()  # nothing written


def test_the_named_transformer_engine_release_is_the_reports_assumption(tmp_path, capsys):
    out = tmp_path / "o"
    args = ["analyze-static", "--config", STATIC_CONFIG, "--outdir", str(out),
            "--transformer-engine-version", "2.2.0"]  # fmt: skip
    assert main(args) == 0
    with open(out / "static_report.json", encoding="utf-8") as f:
        report = json.load(f)
    assumed = report["coverage"]["assumptions"]
    assert "Transformer Engine 2.2.0 (its workspaces and cached placeholder gradients)" in assumed
    assert "te_dummy_wgrads" not in json.dumps(report)  # 2.2 keeps none
