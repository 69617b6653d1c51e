"""memscope analyze-static as a user runs it (in-process through ``memscope.cli.main``):
reports, rank selection, bad input."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from memscope.cli import main
from memscope.units import format_bytes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "configs", "static", "llama3_8b_tp4_pp2.json")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``cli(*args)`` runs ``memscope analyze-static ARGS``: exit code, stdout, stderr."""

    def run(*args: str) -> Result:
        rc = main(["analyze-static", *args])
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)

    return run


def test_json_config_gives_the_original_schema_plus_every_rank(tmp_path, cli):
    res = cli("--config", EXAMPLE, "--outdir", str(tmp_path), "--all-ranks")
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "static_report.json").read_text())
    s = report["summary"]
    for key in ("param_count", "weight_memory_bytes", "grad_memory_bytes",
                "optimizer_memory_bytes", "activation_memory_bytes", "temporary_memory_bytes",
                "persistent_memory_bytes", "peak_memory_bytes", "peak_stage"):  # fmt: skip
        assert key in s
    assert s["peak_memory_bytes"] == (
        s["persistent_memory_bytes"] + s["workspace_memory_bytes"]
        + s["activation_memory_bytes"] + s["temporary_memory_bytes"]
    )  # fmt: skip
    assert s["workspace_memory_bytes"] > 0  # device cuda: the fixed cuBLAS workspaces
    assert report["schema_version"] and report["world_size"] == 64
    assert len(report["ranks"]) == 8  # tp 4 x pp 2 positions, each with its 8 DP peers
    assert sorted(g for r in report["ranks"] for g in r["global_ranks"]) == list(range(64))
    assert s["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in report["ranks"])
    op = report["operators"][0]
    for key in ("name", "category", "phase", "inputs", "outputs", "memory_bytes", "persistent",
                "formula", "notes", "extra"):  # fmt: skip
        assert key in op
    extra = report["allowance"]
    assert extra["cuda_context_bytes"] > 0 and extra["nccl_buffer_bytes"] > 0
    assert extra["device_total_bytes"] == (
        s["peak_memory_bytes"] + extra["cuda_context_bytes"] + extra["nccl_buffer_bytes"]
    )
    assert len(res.stdout.strip().splitlines()) == 9  # 8 positions + the summary line
    headline = res.stdout.strip().splitlines()[-1]
    assert f"on the device {format_bytes(extra['device_total_bytes'])}" in headline
    md = (tmp_path / "static_report.md").read_text()
    assert "## Ranks" in md and "GPU allowance" in md
    assert f"On the device: **{format_bytes(extra['device_total_bytes'])}**" in md


def test_rank_option_details_that_rank(tmp_path, cli):
    res = cli("--config", EXAMPLE, "--outdir", str(tmp_path), "--rank", "33")
    assert res.returncode == 0, res.stderr
    s = json.loads((tmp_path / "static_report.json").read_text())["summary"]
    assert (s["tp_rank"], s["pp_rank"]) == (1, 1) and 33 in s["global_ranks"]


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"model": {"num_heads": 30}}, "must divide model.hidden_size"),
        ({"train": {"tp": 3}}, "parallel.tp (3) must divide"),
        ({"train": {"pp": 3}}, "must divide model.num_layers"),
        ({"train": {"dtype": "fp8x"}}, "dtype 'fp8x' is unknown"),
        ({"model": {"num_kv_heads": 5}}, "model.num_query_groups (5) must divide"),
        ({"train": {"global_batch_size": 100}}, "global_batch_size (100) must be a multiple"),
        ({"model": {"hidden_size": "4k"}}, "model.hidden_size: expected an integer, got '4k'"),
    ],
)
def test_contradictory_config_fails_with_one_line_naming_the_field(tmp_path, cli, change, needle):
    config = json.loads(pathlib.Path(EXAMPLE).read_text())
    for section, values in change.items():
        config[section].update(values)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    res = cli("--config", str(path), "--outdir", str(tmp_path / "out"))
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def test_missing_and_truncated_files_fail_cleanly_and_keep_old_reports(tmp_path, cli):
    assert cli("--config", EXAMPLE, "--outdir", str(tmp_path)).returncode == 0
    before = (tmp_path / "static_report.json").read_bytes()
    truncated = tmp_path / "cut.json"
    truncated.write_text(pathlib.Path(EXAMPLE).read_text()[:120])
    for path, needle in ((tmp_path / "none.json", "no such file"), (truncated, "invalid JSON")):
        res = cli("--config", str(path), "--outdir", str(tmp_path))
        assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    assert (tmp_path / "static_report.json").read_bytes() == before  # nothing lost


def test_warnings_are_one_line_each_and_kept_in_the_report(tmp_path, cli):
    config = json.loads(pathlib.Path(EXAMPLE).read_text())
    config["model"]["num_layer"] = 32  # misspelled
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(config))
    res = cli("--config", str(path), "--outdir", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if ": warning: " in x]
    assert len(lines) == 1 and "did you mean 'num_layers'?" in lines[0]
    report = json.loads((tmp_path / "out" / "static_report.json").read_text())
    assert report["warnings"] == [lines[0].split(f"{path}: ", 1)[1]]


def test_a_runtime_report_given_as_config_is_named_for_what_it_is(tmp_path, cli):
    report = os.path.join(REPO, "examples", "cpu_pp2_demo", "rank00000", "runtime_report.json")
    res = cli("--config", report, "--outdir", str(tmp_path))
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert "this is a MemScope runtime report, not a training config" in line
    assert "vocab" not in line and not (tmp_path / "static_report.json").exists()


def test_memscopes_own_settings_are_not_unused_keys_and_a_misspelt_one_is_warned(tmp_path, cli):
    """The FlagScale example turns tracing on with ``memscope: true`` and ``memscope_*``
    settings in its system section: the tracer's, neither unused by nor unknown to the
    estimator; a misspelt one is named with the setting it resembles."""
    import yaml

    source = os.path.join(REPO, "configs", "flagscale", "train", "tiny_gpt.yaml")
    with open(source, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    system = config["system"]
    assert system["memscope"] is True and "memscope_top_k" in system
    res = cli("--config", source, "--outdir", str(tmp_path / "ok"))
    assert res.returncode == 0, res.stderr
    unused = json.loads((tmp_path / "ok" / "static_report.json").read_text())["coverage"][
        "unused_keys"
    ]
    assert unused and not [k for k in unused if k.startswith("memscope")]
    system["memscope_top_kk"] = 5
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump(config))
    res = cli("--config", str(typo), "--outdir", str(tmp_path / "typo"))
    assert res.returncode == 0, res.stderr
    warned = [x for x in res.stderr.splitlines() if "memscope_top_kk" in x]
    assert len(warned) == 1 and "did you mean 'memscope_top_k'?" in warned[0]
