"""The committed LLaMA-3-8B static example (examples/static_llama3_8b_tp4_pp2/) and the
command output docs/static-estimator.md opens with are what ``memscope analyze-static``
prints and writes now: a change of the estimator asks for them to be regenerated."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from memscope.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "static_llama3_8b_tp4_pp2"
REGENERATE = (
    "stale: run `memscope analyze-static --config configs/static/llama3_8b_tp4_pp2.json "
    "--outdir examples/static_llama3_8b_tp4_pp2 --all-ranks` and update the excerpt at the "
    "top of docs/static-estimator.md"
)


def test_the_static_example_and_the_docs_excerpt_are_what_the_command_gives_now(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)  # the report names its config as given: the relative path
    out = io.StringIO()
    argv = ["analyze-static", "--config", "configs/static/llama3_8b_tp4_pp2.json",
            "--outdir", str(tmp_path), "--all-ranks"]  # fmt: skip
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    for name in ("static_report.json", "static_report.md"):
        fresh = (tmp_path / name).read_bytes()
        assert fresh == (EXAMPLE / name).read_bytes(), f"{name}: {REGENERATE}"
    lines = out.getvalue().splitlines()
    docs = (ROOT / "docs" / "static-estimator.md").read_text(encoding="utf-8")
    excerpt = docs.split("```console\n", 1)[1].split("```", 1)[0].splitlines()
    assert excerpt[0].endswith("--all-ranks")
    assert excerpt[1:] == [lines[0], "...", lines[-2], lines[-1]], REGENERATE
    assert os.path.basename(EXAMPLE) in docs
