"""memscope.integrations.megatron.training_hooks: what the patched training loop calls."""

from __future__ import annotations

import argparse
import logging

import torch
from conftest import load_json

from memscope.integrations.megatron.training_hooks import TrainingHooks, with_memscope_args


def _args(*argv: str) -> argparse.Namespace:
    return with_memscope_args(None)(argparse.ArgumentParser()).parse_args(list(argv))


def _step(hooks: TrainingHooks, model: torch.nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    hooks.step_start(i)
    loss = model(torch.ones(4, 8)).sum()
    loss.backward()
    hooks.forward_backward_end([{"lm loss": loss.detach()}])
    hooks.optimizer_step_start()
    opt.step()
    hooks.optimizer_step_end()
    hooks.step_end(notes=f"step {i}")


def test_without_memscope_every_hook_is_a_no_op(tmp_path):
    hooks = TrainingHooks()
    model = torch.nn.Linear(8, 2)
    hooks.start(_args("--memscope-outdir", str(tmp_path)), [model], None)
    assert not hooks.enabled
    _step(hooks, model, torch.optim.SGD(model.parameters(), lr=0.1), 0)
    hooks.finalize()
    assert list(tmp_path.iterdir()) == []


def test_with_memscope_a_step_is_traced_and_finalize_is_idempotent(tmp_path):
    hooks = TrainingHooks()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters())
    hooks.start(_args("--memscope", "--memscope-outdir", str(tmp_path)), [model], opt)
    assert hooks.enabled
    for i in range(2):
        _step(hooks, model, opt, i)
    hooks.finalize()
    hooks.finalize()
    assert not hooks.enabled
    report = load_json(str(tmp_path / "rank00000" / "runtime_report.json"))
    assert report["status"] == "complete" and report["metadata"]["steps_completed"] == 2
    notes = [e["notes"] for e in report["runtime_trace"] if e["phase"] == "step"]
    assert notes == ["step 0", "step 1"]
    assert report["metadata"]["hook_handles_removed"] > 0


def test_a_second_start_finalizes_the_first_run(tmp_path):
    hooks = TrainingHooks()
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks.start(_args("--memscope", "--memscope-outdir", str(tmp_path / "a")), model, opt)
    _step(hooks, model, opt, 0)
    hooks.start(_args("--memscope", "--memscope-outdir", str(tmp_path / "b")), model, opt)
    first = load_json(str(tmp_path / "a" / "rank00000" / "runtime_report.json"))
    assert first["status"] == "complete"
    hooks.finalize()
    assert (tmp_path / "b" / "rank00000" / "runtime_report.json").exists()


def test_a_failing_start_leaves_training_untouched(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    hooks = TrainingHooks()
    model = torch.nn.Linear(8, 2)
    with caplog.at_level(logging.WARNING, logger="memscope"):
        hooks.start(_args("--memscope", "--memscope-outdir", str(blocker)), model)
    assert not hooks.enabled
    lines = [r.getMessage() for r in caplog.records if r.name == "memscope"]
    assert len(lines) == 1 and "start failed" in lines[0] and "training continues" in lines[0]
    _step(hooks, model, torch.optim.SGD(model.parameters(), lr=0.1), 0)  # still a no-op


def test_with_memscope_args_composes_with_the_frameworks_provider():
    def framework(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--modelopt-thing", type=int, default=3)
        return parser

    parsed = with_memscope_args(framework)(argparse.ArgumentParser()).parse_args(
        ["--memscope", "--memscope-hook-modules", "false", "--modelopt-thing", "5"]
    )
    assert parsed.memscope is True and parsed.memscope_hook_modules is False
    assert parsed.modelopt_thing == 5
