"""The always-on mode (the ``cuda`` backend, every hook on, no stacks) never synchronises the
device, never converts a tensor to a Python value inside MemScope, and leaves the host's peak
counters alone. Runs a real model and optimizer with the backend's CUDA calls redirected
(``tests/harness/redirected_cuda.py``)."""

from __future__ import annotations

import json

import torch
from harness.redirected_cuda import redirect_cuda
from test_torch_integration import _build

from memscope.integrations.torch import MemScopeTorchRuntime


def test_always_on_mode_never_syncs_or_reads_tensors_and_keeps_the_host_counters(
    tmp_path, monkeypatch
):
    fake = redirect_cuda(monkeypatch)
    model, opt = _build()
    torch.manual_seed(0)
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="cuda") as ms:
        for step in range(3):
            with ms.step(step):
                fake.allocated += 1000  # the counters move, as a GPU's would
                loss = model(torch.randn(16, 32)).square().mean()
                loss.backward()
                with ms.optimizer_step():
                    opt.step()
                opt.zero_grad(set_to_none=False)
                fake.allocated -= 1000
            assert loss.item() > 0  # the training loop's own conversion is not MemScope's
    report = json.loads((tmp_path / "rank00000" / "runtime_report.json").read_text())
    assert report["metadata"]["backend"] == "cuda" and report["errors"] == []
    assert {"0", "1", "2"} <= {row["module"] for row in report["module_summary"]}
    assert report["peak"]["memory_bytes"] == fake.peak
    assert fake.calls == []


def test_the_redirection_sees_a_sync_when_one_is_asked_for(tmp_path, monkeypatch):
    """The check above can fail: opting into syncs and peak resets is recorded."""
    fake = redirect_cuda(monkeypatch)
    model, opt = _build()
    settings = dict(backend="cuda", sync_on_step_boundaries=True, reset_peak_stats=True)
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), **settings) as ms, ms.step(0):
        model(torch.randn(4, 32)).sum().backward()
    assert "torch.cuda.synchronize" in fake.calls
    assert "torch.cuda.reset_peak_memory_stats" in fake.calls
