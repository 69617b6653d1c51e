"""The plain-PyTorch adapter: a few lines give an nn.Module + optimizer loop the same reports."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from memscope.integrations.torch import MemScopeTorchRuntime


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _train(runtime: MemScopeTorchRuntime, model, opt, steps: int) -> list[float]:
    torch.manual_seed(0)
    losses = []
    for step in range(steps):
        with runtime.step(step):
            loss = model(torch.randn(16, 32)).square().mean()
            loss.backward()
            with runtime.optimizer_step():
                opt.step()
            opt.zero_grad(set_to_none=False)
        losses.append(loss.item())
    return losses


def _build():
    gc.collect()  # garbage of earlier tests (tracebacks holding tensors) is not this run's
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def record_history(outdir) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Four steps of the plain loop, steps 1-2 recording the storage ledger's history."""
    model, opt = _build()
    settings = dict(
        outdir=str(outdir), backend="storage", enable_memory_snapshot=True,
        snapshot_ranks=[0], snapshot_start_step=1, snapshot_steps=2,
    )  # fmt: skip
    with MemScopeTorchRuntime(model, opt, **settings) as ms:
        _train(ms, model, opt, 4)
    return model, opt


def test_plain_torch_loop_gets_a_report_with_exact_model_and_optimizer_bytes(tmp_path):
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        _train(ms, model, opt, 3)
    assert ms.report_path == str(tmp_path / "rank00000" / "runtime_report.json")
    report = json.loads((tmp_path / "rank00000" / "runtime_report.json").read_text())
    assert report["status"] == "complete" and report["errors"] == []
    assert [s["step"] for s in report["steps"]] == [0, 1, 2]
    end = report["steps"][-1]["categories_end"]
    params = list(model.parameters())
    assert end["parameters"] == _tensor_bytes(params)
    assert end["gradients"] == _tensor_bytes(p.grad for p in params)
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    assert end["optimizer_state"] == _tensor_bytes(state)
    modules = {row["module"] for row in report["module_summary"]}
    assert {"0", "1", "2", "model"} <= modules  # every module of the Sequential has events
    assert report["comparisons"]["status"] == "missing"
    assert "not a megatron-core model" in report["comparisons"]["reason"]
    assert report["metadata"]["dtype"] == "float32"


def test_tracing_leaves_the_losses_of_a_plain_loop_unchanged(tmp_path):
    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        traced = _train(ms, model, opt, 3)
    model, opt = _build()
    off = MemScopeTorchRuntime(model, opt, outdir=str(tmp_path / "off"), ranks=[7])
    plain = _train(off, model, opt, 3)  # rank 0 is not in ranks: every call is a no-op
    assert traced == plain


def test_an_exception_in_the_loop_marks_the_report_crashed_and_propagates(tmp_path):
    model, opt = _build()
    with (
        pytest.raises(RuntimeError, match="boom"),
        MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms,
        ms.step(0),
    ):
        model(torch.randn(2, 32)).sum().backward()
        raise RuntimeError("boom")
    report = json.loads((tmp_path / "rank00000" / "runtime_report.json").read_text())
    assert report["status"] == "crashed" and "boom" in report["status_reason"]
    # the trace ends with the failure, in the context the last hook set (a gradient)
    lines = (tmp_path / "rank00000" / "trace.jsonl").read_text().splitlines()
    failures = [e for e in map(json.loads, lines) if e.get("event_type") in ("crash", "oom")]
    assert [(e["event_type"], e["step"], e["phase"]) for e in failures] == [
        ("crash", 0, "backward")
    ]
    assert failures[0]["notes"] == "RuntimeError: boom" and failures[0]["module"].endswith("weight")


def test_a_forward_that_raises_leaves_the_failure_in_the_failing_module(tmp_path):
    model, opt = _build()

    def explode(module, args):  # test-only fault
        raise torch.OutOfMemoryError("simulated")

    with (
        pytest.raises(torch.OutOfMemoryError),
        MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms,
        ms.step(0),
    ):
        model[2].register_forward_pre_hook(explode)  # runs after MemScope's own pre-hook
        model(torch.randn(2, 32))
    lines = (tmp_path / "rank00000" / "trace.jsonl").read_text().splitlines()
    (oom,) = [e for e in map(json.loads, lines) if e.get("event_type") == "oom"]
    assert (oom["phase"], oom["module"], oom["microbatch"]) == ("forward", "2", 0)
    report = json.loads((tmp_path / "rank00000" / "runtime_report.json").read_text())
    assert report["status"] == "oom"
    # the failure is a record, not a reading: no module or phase row of its own
    assert all(row["phase"] != "oom" for row in report["phase_summary"])


def test_optimizer_step_outside_a_step_is_a_user_error(tmp_path):
    model, opt = _build()
    with (
        MemScopeTorchRuntime(model, opt, outdir=str(tmp_path)) as ms,
        pytest.raises(ValueError, match="inside"),
        ms.optimizer_step(),
    ):
        opt.step()


def test_snapshot_side_files_hold_the_context_markers_and_the_owners_of_the_run(tmp_path):
    """What a GPU run writes beside its allocator snapshot (the snapshot itself needs CUDA):
    the timestamped context changes and the ownership ranges of the model and optimizer;
    ``analyze-snapshot`` joins them with a snapshot of the same addresses and clock."""
    import pickle

    from memscope.cli import main
    from memscope.io.snapshot_reader import read_markers, read_owners

    model, opt = _build()
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend="storage") as ms:
        ms.session.recorders.start_markers()  # what the snapshot controller does at its start
        _train(ms, model, opt, 2)
        path = str(tmp_path / "memory_snapshot_steps0-1.pickle")
        ms.session.recorders.write_side_files(path)
    markers = read_markers(str(tmp_path / "memory_snapshot_steps0-1.markers.jsonl"))
    assert [m.time_us for m in markers] == sorted(m.time_us for m in markers)
    assert {("forward", "0"), ("forward", "2"), ("backward", "2")} <= {
        (m.phase, m.module) for m in markers
    }
    owners = read_owners(str(tmp_path / "memory_snapshot_steps0-1.owners.json"))
    params = list(model.parameters())
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    totals = owners.totals()
    assert totals["parameters"] == _tensor_bytes(params)
    assert totals["gradients"] == _tensor_bytes(p.grad for p in params)
    assert totals["optimizer_state"] == _tensor_bytes(state)
    # a snapshot of the same addresses and clock: the weight is live throughout, a block is
    # allocated while the second Linear's forward ran
    weight = model[0].weight
    forward = next(m for m in markers if (m.phase, m.module) == ("forward", "2"))
    block = {"address": weight.data_ptr(), "size": weight.numel() * 4, "state": "active_allocated"}
    alloc = {"action": "alloc", "addr": 1 << 40, "size": 4096, "time_us": forward.time_us + 1}
    snapshot = {"segments": [{"device": 0, "blocks": [block]}], "device_traces": [[alloc]]}
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    assert main(["analyze-snapshot", "--snapshot", path]) == 0
    result = json.loads((tmp_path / "memory_snapshot_steps0-1.peak.json").read_text())
    items = {(i["category"], i["module"]): i["bytes"] for i in result["composition"]["items"]}
    assert items == {("activations", "2"): 4096, ("parameters", "0.weight"): weight.numel() * 4}


def test_storage_backend_snapshot_replays_to_the_ledgers_own_peak(tmp_path):
    """On CPU the storage backend's allocation history is dumped as an allocator snapshot
    (with its side files); replaying it gives the same peak the exact ledger measured over
    those steps, and its live set by module."""
    from memscope.cli import main

    model, _ = record_history(tmp_path)
    rank = tmp_path / "rank00000"
    snapshot = rank / "memory_snapshot_steps1-2.pickle"
    assert snapshot.exists()
    assert (rank / "memory_snapshot_steps1-2.markers.jsonl").exists()
    assert (rank / "memory_snapshot_steps1-2.owners.json").exists()
    report = json.loads((rank / "runtime_report.json").read_text())
    measured = max(s["peak_allocated"] for s in report["steps"] if s["step"] in (1, 2))
    assert main(["analyze-snapshot", "--snapshot", str(snapshot)]) == 0
    result = json.loads((rank / "memory_snapshot_steps1-2.peak.json").read_text())
    assert result["peak_allocated_bytes"] == measured
    assert result["composition"]["source"] == "allocator_history"
    assert result["inconsistencies"] == 0
    items = result["composition"]["items"]
    assert sum(i["bytes"] for i in items) == measured
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(i["bytes"] for i in items if i["category"] == "parameters") == params
    assert any(i["category"] == "activations" and i["module"] in ("0", "1", "2") for i in items)


def test_the_report_carries_the_replay_of_its_recorded_history(tmp_path):
    """The snapshot is replayed when it is written: each recorded step's true peak, and a
    composition by category equal to the exact ledger's at the same peak."""
    record_history(tmp_path)
    report = json.loads((tmp_path / "rank00000" / "runtime_report.json").read_text())
    timeline = report["allocator_timeline"]
    assert timeline["source"] == "storage_ledger" and timeline["inconsistencies"] == 0
    steps = {s["step"]: s for s in report["steps"]}
    assert set(timeline["step_peaks"]) == {"1", "2"}
    for step in (1, 2):
        assert steps[step]["peak_allocated_timeline"] == steps[step]["peak_allocated"]
    assert "peak_allocated_timeline" not in steps[3]
    assert timeline["peak_bytes"] == report["peak"]["memory_bytes"]

    def by_category(items):
        out: dict[str, int] = {}
        for i in items:
            out[i["category"]] = out.get(i["category"], 0) + i["bytes"]
        return out

    exact = report["peak"]["composition"]
    assert exact["source"] == "storage_ledger"
    assert by_category(timeline["composition"]["items"]) == by_category(exact["items"])
    assert timeline["composition"]["unattributed_bytes"] == 0
    assert timeline["composition"]["source"] == "allocator_history"
    assert timeline["recording_cost"]["recorded_steps"] == 2
    assert timeline["recording_cost"]["other_steps"] == 2
