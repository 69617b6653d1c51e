"""An OOM, an early exit or SIGTERM still leaves a readable, marked report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import load_json, read_jsonl

from memscope.cli import main

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "crash_script.py"), str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=300,
    )
    path = tmp_path / "rank00000" / "runtime_report.json"
    assert path.exists(), proc.stderr[-3000:]
    assert (tmp_path / "rank00000" / "runtime_report.md").exists()
    return proc, load_json(str(path))


@pytest.mark.multiprocess
def test_uncaught_oom_writes_an_oom_report(tmp_path):
    proc, report = _run(tmp_path, "oom")
    assert proc.returncode == 1
    assert "OutOfMemoryError" in proc.stderr  # the original traceback is still printed
    assert report["status"] == "oom" and report["complete"] is False
    assert "simulated: tried to allocate 80.00 GiB" in report["status_reason"]
    assert report["metadata"]["steps_completed"] == 1
    # The failing step's forward was being recorded when it died: the trace says where.
    assert any(e["step"] == 1 for e in report["runtime_trace"])
    (oom,) = [e for e in read_jsonl(str(tmp_path / "rank00000" / "trace.jsonl"))
              if e.get("event_type") == "oom"]  # fmt: skip
    assert (oom["step"], oom["phase"], oom["module"], oom["microbatch"]) == (
        1, "forward", "decoder.layers.1", 0)  # fmt: skip
    assert "simulated: tried to allocate 80.00 GiB" in oom["notes"]
    # ... and the Perfetto export marks it, in the rank's time line
    out = tmp_path / "trace.json"
    assert main(["export", "--trace", str(tmp_path), "--out", str(out)]) == 0
    events = load_json(str(out))["traceEvents"]
    (instant,) = [e for e in events if e["ph"] == "i" and e["name"] == "OOM"]
    assert instant["args"]["module"] == "decoder.layers.1" and instant["args"]["step"] == 1
    assert instant["ts"] >= max(e["ts"] for e in events if e["ph"] == "C")


@pytest.mark.multiprocess
def test_exit_without_finalize_writes_an_incomplete_report(tmp_path):
    proc, report = _run(tmp_path, "exit")
    assert proc.returncode == 3
    assert report["status"] == "incomplete"
    assert "before finalize" in report["status_reason"]
    assert report["metadata"]["steps_completed"] == 1


@pytest.mark.multiprocess
def test_sigterm_writes_an_incomplete_report_and_still_terminates(tmp_path):
    proc, report = _run(tmp_path, "sigterm")
    assert proc.returncode == -signal.SIGTERM
    assert report["status"] == "incomplete" and "SIGTERM" in report["status_reason"]
