"""MemScope never breaks training and never loses a report, however it is wired or fails.

Each test names the hardening case it guards. The model is a plain torch module traced
through the session (the same code path as the Megatron adapter)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from torch.utils import _python_dispatch as pd

from memscope.capture import step_recorder
from memscope.capture import tracer as tracer_mod
from memscope.capture.backends import storage_dispatch
from memscope.capture.safety import FailureLog
from memscope.events import trace_sink as sink_mod
from memscope.events.trace_sink import JsonlTraceSink
from memscope.integrations.megatron import MemScopeMegatronRuntime
from memscope.integrations.torch import MemScopeTorchRuntime
from memscope.session import SessionState


def _build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _train(ms, model, opt, steps, step_ids=None):
    losses = []
    for i in range(steps):
        with ms.step(step_ids[i] if step_ids else i):
            loss = model(torch.ones(8, 16) * (i + 1)).square().mean()
            loss.backward()
            with ms.optimizer_step():
                opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


def _untraced_losses(steps):
    model, opt = _build()
    return _train(MemScopeTorchRuntime(model, opt, ranks=[99]), model, opt, steps)


def _report(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _sites(report):
    return {row["site"]: row for row in report["errors"]}


def _memscope_lines(caplog, needle):
    return [r for r in caplog.records if r.name == "memscope" and needle in r.getMessage()]


# -- 1. training never dies because of MemScope ---------------------------------------------
def test_unusable_output_directory_leaves_training_running_untraced(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    model, opt = _build()
    caplog.set_level(logging.WARNING, "memscope")
    ms = MemScopeTorchRuntime(model, opt, outdir=str(blocker / "out"), backend="storage")
    ms.start()
    assert ms.session.state is SessionState.FINALIZED and "start" in ms.session.start_error
    assert _train(ms, model, opt, 3) == _untraced_losses(3)
    ms.finalize()
    assert len(_memscope_lines(caplog, "start failed")) == 1


def test_megatron_runtime_given_a_dict_as_model_stays_out_of_the_way(tmp_path, caplog):
    import argparse

    from memscope.integrations.megatron import add_memscope_args

    args = add_memscope_args(argparse.ArgumentParser()).parse_args(
        ["--memscope", "--memscope-outdir", str(tmp_path)]
    )
    caplog.set_level(logging.WARNING, "memscope")
    runtime = MemScopeMegatronRuntime(
        MemScopeMegatronRuntime.from_megatron_args(args).config, args, None
    )
    runtime.attach_model({"not": "a model"})  # type: ignore[arg-type]
    runtime.attach_optimizer(object())
    runtime.start()
    runtime.on_train_step_start(0)
    runtime.on_train_step_end()
    runtime.finalize()
    assert not runtime.active and "attach_model" in runtime.session.start_error
    assert len(_memscope_lines(caplog, "attach_model failed")) == 1


def test_a_failing_op_classifier_never_makes_an_op_raise(tmp_path, monkeypatch):
    def broken(func):
        raise RuntimeError("classifier broke")

    monkeypatch.setattr(storage_dispatch, "_classify", broken)
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        losses = _train(ms, model, opt, 3)
    assert losses == _untraced_losses(3)
    errors = _sites(_report(ms.report_path))
    assert errors["storage_backend"]["count"] == 1
    assert "classifier broke" in errors["storage_backend"]["first_error"]


def test_failures_inside_the_safety_net_itself_never_reach_the_model(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("safety net broke")

    monkeypatch.setattr(tracer_mod.MemoryTracer, "family_enabled", boom)
    monkeypatch.setattr(tracer_mod.MemoryTracer, "hook_failed", boom)
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        assert _train(ms, model, opt, 3) == _untraced_losses(3)
    assert [s["step"] for s in _report(ms.report_path)["steps"]] == [0, 1, 2]


def test_the_failure_log_survives_an_exception_that_cannot_be_printed(caplog):
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no")

    log = FailureLog()
    log.record("site", Unprintable())
    log.record("site", Unprintable())
    assert log.to_list()[0]["count"] == 2
    assert "<unprintable>" in log.to_list()[0]["first_error"]


def test_failing_free_callbacks_are_recorded_once_not_printed_per_storage(
    tmp_path, monkeypatch, capfd
):
    class BrokenLive(dict):
        def __delitem__(self, key):
            raise RuntimeError("ledger broke on free")

    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        assert ms.session.recording is not None
        backend = ms.session.recording.backend
        monkeypatch.setattr(backend.ledger, "_live", BrokenLive(backend.ledger._live))
        losses = _train(ms, model, opt, 3)
    assert losses == _untraced_losses(3)
    errors = _sites(_report(ms.report_path))
    assert errors["storage_backend"]["count"] == 1
    assert "ledger broke on free" not in capfd.readouterr().err  # nothing printed per free


def test_finalize_removes_exactly_its_own_dispatch_mode(tmp_path):
    class UserMode(pd.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    model, opt = _build()
    ms = MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage")
    ms.start()
    ours = pd._get_current_dispatch_mode()
    user = UserMode()
    with user:
        _train(ms, model, opt, 1)
        ms.finalize()  # ours sits below the user's mode
        assert pd._get_current_dispatch_mode() is user
        assert pd._len_torch_dispatch_stack() == 1 and ours is not user
        torch.ones(3).sum()
    assert pd._len_torch_dispatch_stack() == 0 and not pd.is_in_torch_dispatch_mode()


def test_a_failing_host_rss_read_turns_off_only_that_reading(tmp_path, monkeypatch):
    def broken():
        raise OSError("no /proc")

    monkeypatch.setattr(step_recorder, "host_rss_bytes", broken)
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        _train(ms, model, opt, 3)
    report = _report(ms.report_path)
    assert report["status"] == "complete" and [s["step"] for s in report["steps"]] == [0, 1, 2]
    assert all("host_rss_end" not in s for s in report["steps"])
    assert _sites(report)["host_rss"]["count"] == 1


def test_a_bad_step_argument_loses_only_the_step_number(tmp_path):
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        _train(ms, model, opt, 3, step_ids=[0, "not a number", 2])
    report = _report(ms.report_path)
    assert report["status"] == "complete" and [s["step"] for s in report["steps"]] == [0, 1, 2]
    assert _sites(report)["step_argument"]["count"] == 1


# -- 2. a report is never lost, torn or clobbered -------------------------------------------
def test_a_first_report_is_written_at_start(tmp_path):
    model, opt = _build()
    ms = MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage")
    ms.start()
    assert _report(tmp_path / "rank00000" / "runtime_report.json")["status"] == "running"
    ms.finalize()


def test_a_failing_trace_sink_never_stops_reports_and_is_retried(tmp_path, monkeypatch):
    real_write = JsonlTraceSink.write
    calls = {"n": 0}

    def flaky(self, events):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, events)

    monkeypatch.setattr(JsonlTraceSink, "write", flaky)
    model, opt = _build()
    with MemScopeTorchRuntime(
        model, opt, outdir=str(tmp_path), backend="storage", report_interval=1
    ) as ms:
        _train(ms, model, opt, 4)
    report = _report(ms.report_path)
    assert report["status"] == "complete" and len(report["steps"]) == 4
    assert _sites(report)["trace_sink"]["count"] == 2
    with open(tmp_path / "rank00000" / "trace.jsonl", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) - 1 == report["trace"]["events_recorded"]  # the retry wrote them all


def test_a_write_failing_part_way_leaves_only_whole_lines(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    sink = JsonlTraceSink(str(path), {"rank": 0})
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path / "r"), backend="storage") as ms:
        _train(ms, model, opt, 1)
    events = list(ms.session.recording.store.events)
    sink.write(events[:2])
    real = os.write

    def half_then_full(fd, data):
        real(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(sink_mod.os, "write", half_then_full)
    with pytest.raises(OSError, match="too large"):
        sink.write(events[2:])
    monkeypatch.setattr(sink_mod.os, "write", real)
    sink.write(events[2:4])
    sink.close()
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert [e["seq"] for e in lines[1:]] == [e.seq for e in events[:4]]


def test_the_trace_rotates_at_its_size_cap(tmp_path):
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path / "r"), backend="storage") as ms:
        _train(ms, model, opt, 2)
    events = list(ms.session.recording.store.events)
    path = tmp_path / "trace.jsonl"
    sink = JsonlTraceSink(str(path), {"rank": 0}, max_bytes=4096)
    for _ in range(20):
        sink.write(events[:5])
    sink.close()
    assert sink.rotations >= 1 and path.stat().st_size <= 4096
    for name in ("trace.jsonl", "trace.1.jsonl"):
        with open(tmp_path / name, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f]
        assert "header" in lines[0] and all("seq" in e for e in lines[1:])


def test_a_second_run_never_overwrites_a_live_run_in_the_same_directory(tmp_path):
    rank_dir = tmp_path / "rank00000"
    rank_dir.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = {"run_id": "other-run", "pid": other.pid, "host": os.uname().nodename}
        (rank_dir / ".memscope.lock").write_text(json.dumps(lock))
        (rank_dir / "runtime_report.json").write_text('{"theirs": true}')
        model, opt = _build()
        with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
            _train(ms, model, opt, 1)
    finally:
        other.kill()
        other.wait()
    assert (rank_dir / "runtime_report.json").read_text() == '{"theirs": true}'
    assert os.path.dirname(ms.report_path) != str(rank_dir)
    assert os.path.basename(os.path.dirname(ms.report_path)).startswith("rank00000.run-")
    assert any("being written by another run" in w for w in _report(ms.report_path)["warnings"])


def test_a_finished_earlier_run_is_kept_not_overwritten(tmp_path):
    rank_dir = tmp_path / "rank00000"
    rank_dir.mkdir()
    (rank_dir / "runtime_report.json").write_text('{"metadata": {"run_id": "yesterday"}}')
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        _train(ms, model, opt, 1)
    kept = tmp_path / "rank00000.prev-yesterday" / "runtime_report.json"
    assert json.loads(kept.read_text()) == {"metadata": {"run_id": "yesterday"}}
    report = _report(rank_dir / "runtime_report.json")
    assert report["metadata"]["run_id"] != "yesterday"
    assert not (rank_dir / ".memscope.lock").exists()  # released at finalize


def test_an_output_directory_deleted_mid_run_is_recreated(tmp_path):
    import shutil

    model, opt = _build()
    with MemScopeTorchRuntime(
        model, opt, outdir=str(tmp_path / "out"), backend="storage", report_interval=1
    ) as ms:
        _train(ms, model, opt, 2)
        shutil.rmtree(tmp_path / "out")
        _train(ms, model, opt, 2)
    report = _report(ms.report_path)
    assert report["status"] == "complete"
    for rel in report["artifacts"].values():
        assert os.path.exists(os.path.join(os.path.dirname(ms.report_path), rel))
    assert os.path.exists(tmp_path / "out" / "rank00000" / "trace.jsonl")


def test_an_invalid_setting_wired_directly_is_its_default_and_the_report_says_so(tmp_path):
    """The runtime built straight from Megatron-style args (not through the patched loop)
    with settings it can't use: nothing raises, training is traced with the defaults, and
    the report's warnings name each setting put back."""
    import argparse

    from memscope.integrations.megatron import add_memscope_args

    argv = ["--memscope", "--memscope-outdir", str(tmp_path), "--memscope-trace-max-mib", "-1",
            "--memscope-top-k", "0"]  # fmt: skip
    args = add_memscope_args(argparse.ArgumentParser()).parse_args(argv)
    runtime = MemScopeMegatronRuntime.from_megatron_args(args)
    assert (runtime.config.trace_max_mib, runtime.config.top_k) == (1024, 20)
    model, opt = _build()
    ms = MemScopeTorchRuntime(model, opt, config=runtime.config)
    ms.start()
    losses = _train(ms, model, opt, 2)
    ms.finalize()
    assert losses == _untraced_losses(2)
    report = json.loads((tmp_path / "rank00000" / "runtime_report.json").read_text())
    assert report["status"] == "complete"
    put_back = [w for w in report["warnings"] if "using the default" in w]
    assert len(put_back) == 2
    assert any("trace_max_mib" in w for w in put_back) and any("top_k" in w for w in put_back)


def test_an_unknown_setting_of_the_torch_adapter_is_warned_and_ignored(tmp_path):
    model, opt = _build()
    with pytest.warns(UserWarning, match="unknown setting 'top_kk' ignored.*'top_k'"):
        ms = MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), top_kk=3)
    ms.start()
    _train(ms, model, opt, 1)
    ms.finalize()
    report = json.loads((tmp_path / "rank00000" / "runtime_report.json").read_text())
    assert any("top_kk" in w for w in report["warnings"]) and report["status"] == "complete"


def test_a_step_callback_that_turned_itself_off_makes_the_report_incomplete(tmp_path, monkeypatch):
    """The step-start callback fails once (here in the tracer's step start) and turns itself
    off: the later steps are not traced, so the report is incomplete and says why."""
    real = tracer_mod.MemoryTracer.step_start
    calls = {"n": 0}

    def second_fails(self, step, notes=""):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("context lost")
        return real(self, step, notes)

    monkeypatch.setattr(tracer_mod.MemoryTracer, "step_start", second_fails)
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        losses = _train(ms, model, opt, 4)
    assert losses == _untraced_losses(4)
    report = _report(ms.report_path)
    assert report["status"] == "incomplete" and not report["complete"]
    assert "on_train_step_start (RuntimeError: context lost" in report["status_reason"]
    assert len(report["steps"]) < 4


def test_a_hook_family_that_turned_itself_off_makes_the_report_incomplete(tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise ValueError("bad module")

    monkeypatch.setattr(tracer_mod.MemoryTracer, "module_enter", broken)
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        assert _train(ms, model, opt, 2) == _untraced_losses(2)
    report = _report(ms.report_path)
    assert report["status"] == "incomplete"
    assert "module_hooks (ValueError: bad module" in report["status_reason"]


def test_a_start_failure_leaves_a_note_the_job_view_reads(tmp_path, monkeypatch, capsys):
    """Tracing fails to start on rank 0 (here: agreeing the run id); training goes on
    untraced, and the rank folder holds start_failure.json saying why, which the job view
    shows instead of a bare "no report"."""
    import shutil
    from pathlib import Path

    from memscope.cli import main
    from memscope.session import run_identity

    def broken(*args, **kwargs):
        raise RuntimeError("store unreachable")

    monkeypatch.setattr(run_identity, "agreed_run_identity", broken)
    model, opt = _build()
    ms = MemScopeTorchRuntime(model, opt, outdir=str(tmp_path / "job"), backend="storage")
    ms.start()
    assert _train(ms, model, opt, 2) == _untraced_losses(2)
    ms.finalize()
    note = _report(tmp_path / "job" / "rank00000" / "start_failure.json")
    assert note["report_type"] == "start_failure" and "store unreachable" in note["reason"]
    assert not (tmp_path / "job" / "rank00000" / "runtime_report.json").exists()
    example = Path(__file__).parent.parent / "examples" / "cpu_pp2_demo" / "rank00001"
    shutil.copytree(example, tmp_path / "job" / "rank00001")
    assert main(["summarize", "--report", str(tmp_path / "job")]) == 0
    out = capsys.readouterr().out
    assert "tracing did not start: start: RuntimeError: store unreachable" in out
