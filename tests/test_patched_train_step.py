"""The real patched ``train_step`` on CPU: every return path closes its MemScope step, and
with MemScope off (or not installed) the function returns exactly what the unpatched one does.

Each rank is a fresh process running ``flagscale_train_step_worker.py`` (FlagScale's bundled
Megatron-LM must shadow the installed megatron-core, so it cannot run in the test process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import load_json
from flagscale_trees import MEGATRON, patched_tree, pristine_tree

from memscope.demo.launcher import free_ports

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "flagscale_train_step_worker.py")

LAST, NOT_LAST = "last pipeline stage", "pipeline stage before the last"
SPIKY, RERUN = "spiky loss skipped", "rerun state machine exit"


def _run(tmp_path, runs: list[tuple[str, str]], world: int, target: str) -> dict[str, list]:
    """Start every (variant, tree) run with ``world`` ranks at once; per variant, rank outputs."""
    procs = []
    for (variant, tree), port in zip(runs, free_ports(len(runs)), strict=True):
        out = tmp_path / variant
        out.mkdir()
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), PP=str(world))
            env.update(MASTER_PORT=str(port), TARGET=target, OMP_NUM_THREADS="1")
            env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the cached tree as fetched
            log = open(out / f"log{rank}.txt", "w", encoding="utf-8")  # noqa: SIM115
            cmd = [sys.executable, WORKER, tree, variant, str(out)]
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=log), log, out))
    for proc, log, out in procs:
        code = proc.wait(timeout=240)
        log.close()
        if code:
            logs = "".join(p.read_text()[-3000:] for p in sorted(out.glob("log*.txt")))
            pytest.fail(f"worker {out.name} exited {code}:\n{logs}")
    return {
        variant: [load_json(str(tmp_path / variant / f"rank{r}.json")) for r in range(world)]
        for variant, _ in runs
    }


def _step_events(report: dict) -> list[tuple[int, str, str]]:
    return [
        (e["step"], e["phase"], e["notes"])
        for e in report["runtime_trace"]
        if e["event_type"] == "step_phase"
    ]


def _assert_steps_closed(outdir: str, rank: int, step_notes: list[str]) -> None:
    """One forward-backward and one closed step per step; optimizer phases only when run."""
    report = load_json(os.path.join(outdir, f"rank{rank:05d}", "runtime_report.json"))
    assert report["status"] == "complete" and not report["errors"]
    meta = report["metadata"]
    assert meta["steps_completed"] == len(step_notes) and meta["last_step"] == len(step_notes) - 1
    assert meta["modules_hooked"] > 0 and meta["hook_handles_removed"] > 0
    events = _step_events(report)
    for step, notes in enumerate(step_notes):
        phases = [(phase, n) for s, phase, n in events if s == step]
        expected = [("forward_backward", "")]
        if notes in (LAST, NOT_LAST):
            expected += [("pre_optimizer", ""), ("optimizer", "")]
        assert phases == [*expected, ("step", notes)], (step, phases)
    assert [s["step"] for s in report["steps"]] == list(range(len(step_notes)))
    with open(os.path.join(outdir, f"rank{rank:05d}", "trace.jsonl"), encoding="utf-8") as f:
        streamed = [json.loads(line) for line in f if '"step_phase"' in line]
    assert len(streamed) == len(events)


@pytest.mark.multiprocess
def test_flagscale_train_step_all_paths_single_rank(tmp_path):
    runs = [
        ("on", patched_tree()),
        ("off", patched_tree()),
        ("missing", patched_tree()),
        ("pristine", pristine_tree()),
    ]
    out = _run(tmp_path, runs, world=1, target="flagscale")
    results = out["pristine"][0]["results"]
    # The four paths really were taken: normal, normal, spiky skip, rerun exit (code 16).
    assert [r[1:5] for r in results] == [
        [0, False, False, 0],
        [0, False, False, 0],
        [True, False, False, 0],
        [True, True, True, 16],
    ]
    assert results[0][0]["lm loss"] > 0 and results[0][5] > 0  # loss and grad norm
    for variant in ("on", "off", "missing"):
        assert out[variant] == out["pristine"], variant  # returns and trained weights
    _assert_steps_closed(str(tmp_path / "on" / "memscope"), 0, [LAST, LAST, SPIKY, RERUN])
    for variant in ("off", "missing", "pristine"):
        assert not (tmp_path / variant / "memscope").exists()


@pytest.mark.multiprocess
def test_flagscale_train_step_two_pipeline_stages(tmp_path):
    runs = [("on", patched_tree()), ("pristine", pristine_tree())]
    out = _run(tmp_path, runs, world=2, target="flagscale")
    assert out["on"] == out["pristine"]
    assert [r["last_stage"] for r in out["on"]] == [False, True]
    assert out["on"][0]["results"][0][0] == {}  # the first stage returns no loss
    outdir = str(tmp_path / "on" / "memscope")
    _assert_steps_closed(outdir, 0, [NOT_LAST, NOT_LAST, SPIKY, RERUN])
    _assert_steps_closed(outdir, 1, [LAST, LAST, SPIKY, RERUN])


@pytest.mark.multiprocess
def test_megatron_lm_train_step_single_rank(tmp_path):
    runs = [("on", patched_tree()), ("pristine", pristine_tree())]
    assert os.path.isdir(os.path.join(patched_tree(), MEGATRON))
    out = _run(tmp_path, runs, world=1, target="megatron-lm")
    assert out["on"] == out["pristine"]
    assert [r[4] for r in out["on"][0]["results"]] == [0, 0, 0, 16]  # no spiky path upstream
    _assert_steps_closed(str(tmp_path / "on" / "memscope"), 0, [LAST, LAST, LAST, RERUN])
