"""The framework-neutral tracing session: lifecycle states, symmetric teardown, isolation."""

from __future__ import annotations

import json
import sys

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from memscope.capture.parallel import ParallelInfo
from memscope.config import RuntimeConfig
from memscope.session import ReportStatus, SessionState, TracingSession
from memscope.session.recorders import Recorders
from memscope.session.teardown import Teardown


def _session(tmp_path, **settings) -> TracingSession:
    cfg = RuntimeConfig(enabled=True, outdir=str(tmp_path), backend="storage", **settings)
    return TracingSession(cfg, ParallelInfo())


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _hooks_on(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) + sum(
        len(p._backward_hooks or {}) + len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
        for p in model.parameters()
    )


def _one_step(
    session: TracingSession, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int = 0
) -> int:
    """One training step; returns how many hooks were on the model while it ran."""
    session.step_start(step)
    hooks = _hooks_on(model)
    model(torch.randn(4, 8)).sum().backward()
    session.forward_backward_end()
    session.optimizer_step_start()
    opt.step()
    session.optimizer_step_end()
    session.step_end()
    return hooks


def test_lifecycle_moves_through_the_states_and_finalize_is_reentrant(tmp_path):
    session = _session(tmp_path)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert session.state is SessionState.IDLE
    session.attach_model([model])
    session.attach_optimizers([opt])
    session.start()
    assert session.state is SessionState.TRACING and session.active
    _one_step(session, model, opt)
    session.finalize()
    assert session.state is SessionState.FINALIZED and session.status is ReportStatus.COMPLETE
    first = session.report_path
    assert first is not None
    session.finalize()  # second call: nothing happens, nothing raises
    session.start()  # a finalized session never restarts
    assert session.state is SessionState.FINALIZED and session.report_path == first


def test_hooks_are_on_the_model_only_for_steps_that_record(tmp_path):
    """A step outside the recording window runs with no MemScope hook on the model; a later
    one inside it gets every hook back; the events say which steps recorded."""
    session = _session(tmp_path, step_start=1, step_end=4, hook_steps=2)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session.attach_model([model])
    session.start()
    full = _hooks_on(model)
    assert full == 2 * 4 + 2 * 4  # 4 modules (pre + post), 4 parameters (two hooks each)
    on_during = [_one_step(session, model, opt, step) for step in range(6)]
    assert on_during == [0, full, full, 0, 0, 0]  # window 1-3, two hooked steps: 1 and 2
    session.finalize()
    assert _hooks_on(model) == 0
    counts = session.hook_counts
    assert counts["hooks_suspended"] == 2 and counts["hook_handles_removed"] == 2 * full
    with open(session.report_path, encoding="utf-8") as f:
        report = json.load(f)
    fine = {e["step"] for e in report["runtime_trace"] if e["event_type"] != "step_phase"}
    assert fine == {1, 2}


def test_hooks_follow_a_window_closed_by_step_end(tmp_path):
    session = _session(tmp_path, step_end=2, hook_steps=0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session.attach_model([model])
    session.start()
    full = _hooks_on(model)
    assert [_one_step(session, model, opt, step) for step in range(4)] == [full, full, 0, 0]
    session.finalize()
    assert session.hook_counts["hooks_suspended"] == 1


def test_hooks_that_cannot_go_back_on_are_reported_and_steps_go_on(tmp_path, monkeypatch):
    from memscope.capture.hooks import HookSet

    session = _session(tmp_path, step_start=1)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session.attach_model([model])
    session.start()
    _one_step(session, model, opt, 0)  # outside the window: hooks off

    def broken(self, chunks):
        raise RuntimeError("hook registry full")

    monkeypatch.setattr(HookSet, "attach_modules", broken)
    assert [_one_step(session, model, opt, step) for step in (1, 2)] == [0, 0]
    session.finalize()
    with open(session.report_path, encoding="utf-8") as f:
        report = json.load(f)
    assert [s["step"] for s in report["steps"]] == [0, 1, 2]
    assert any("hook registry full" in str(e) for e in report["errors"])


def test_teardown_removes_everything_start_installed_in_reverse_order(tmp_path, monkeypatch):
    session = _session(tmp_path)
    model = _model()
    session.attach_model([model])
    before_hook, before_mode = sys.excepthook, _get_current_dispatch_mode()
    ran: list[str] = []
    original = Teardown.unwind

    def recording_unwind(self, on_error):
        order = original(self, on_error)
        ran.extend(order)
        return order

    monkeypatch.setattr(Teardown, "unwind", recording_unwind)
    session.start()
    assert _hooks_on(model) > 0 and sys.excepthook is not before_hook
    assert _get_current_dispatch_mode() is not None  # the storage ledger's dispatch mode
    session.finalize()
    assert ran == [
        "crash_guard",
        "remove_hooks",
        "saved_tensor_hooks",
        "backend",
        "final_report",
        "trace_sink",
        "rank_dir_lock",
    ]
    assert _hooks_on(model) == 0
    assert sys.excepthook is before_hook and _get_current_dispatch_mode() is before_mode
    assert session.hook_counts["hook_handles_removed"] > 0
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_a_failed_start_unwinds_what_was_installed_and_leaves_training_alone(tmp_path, monkeypatch):
    session = _session(tmp_path)
    model = _model()
    session.attach_model([model])

    def broken(self, *args):
        raise OSError("disk full")

    monkeypatch.setattr(Recorders, "start", broken)
    session.start()
    assert session.state is SessionState.FINALIZED and "disk full" in session.start_error
    assert [row["site"] for row in session.failures.to_list()] == ["start"]
    assert _hooks_on(model) == 0 and _get_current_dispatch_mode() is None
    assert session.report_path is not None  # what was recorded, and why it ended
    with open(session.report_path, encoding="utf-8") as f:
        report = json.load(f)
    assert report["status"] == "incomplete" and "disk full" in report["status_reason"]
    assert [e["site"] for e in report["errors"]] == ["start"]
    session.step_start(0)  # every later call is a no-op
    session.finalize()


def test_a_failing_callback_is_logged_once_and_switched_off(tmp_path):
    session = _session(tmp_path)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session.attach_model([model])
    session.start()
    assert session.tracer is not None

    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    session.tracer.phase_end = boom  # type: ignore[method-assign]
    for _ in range(3):
        _one_step(session, model, opt)
    session.finalize()
    rows = {row["site"]: row for row in session.failures.to_list()}
    assert set(rows) == {
        "on_forward_backward_end",
        "on_optimizer_step_start",
        "on_optimizer_step_end",
    }
    assert all(row["count"] == 1 for row in rows.values())
    # switched off, those callbacks left gaps: the report is not complete, and says which
    assert session.status is ReportStatus.INCOMPLETE
    assert all(site in session.status_reason for site in rows)


def test_a_rank_that_is_not_traced_is_disabled_and_inert(tmp_path):
    cfg = RuntimeConfig(enabled=True, outdir=str(tmp_path), ranks=[3])
    session = TracingSession(cfg, ParallelInfo(rank=0))
    assert session.state is SessionState.DISABLED
    session.start()
    session.step_start(0)
    session.finalize()
    assert session.state is SessionState.DISABLED and not list(tmp_path.iterdir())


def test_teardown_runs_every_action_even_when_one_fails():
    teardown, ran, errors = Teardown(), [], []
    teardown.push("a", lambda: ran.append("a"))
    teardown.push("b", lambda: 1 / 0)
    teardown.push("c", lambda: ran.append("c"))
    assert teardown.unwind(lambda site, exc: errors.append(site)) == ["c", "b", "a"]
    assert ran == ["c", "a"] and errors == ["b"] and len(teardown) == 0


def test_a_failure_whose_exception_cannot_be_printed_is_still_reported(tmp_path):
    class Unprintable(RuntimeError):
        def __str__(self) -> str:
            raise ValueError("no text")

    session = _session(tmp_path)
    session.attach_model([_model()])
    session.start()
    exc = Unprintable()
    session.record_exception(exc)  # never raises into the training's own handler
    session.record_exception(exc)  # the same exception again: nothing changes
    assert session.status is ReportStatus.CRASHED and session.status_reason == "Unprintable"
    session.finalize()
    assert session.report_path is not None
    with open(session.report_path, encoding="utf-8") as f:
        report = json.load(f)
    assert report["status"] == "crashed" and report["status_reason"] == "Unprintable"
    failures = [e for e in report["runtime_trace"] if e["event_type"] == "crash"]
    assert len(failures) == 1
