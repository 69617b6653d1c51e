"""``memscope export --snapshot``: an allocator snapshot labelled for pytorch.org/memory_viz.

The snapshot comes from a real traced loop (the storage backend's allocation history, written
in the allocator snapshot's format). The labelled copy is checked against the documented
snapshot schema, the pickle protocol the viewer reads, and the peak the viewer itself would
draw: ``viewer_peak`` follows the pairing rules of ``annotate_snapshot`` and
``process_alloc_data`` in PyTorch's ``torch/utils/viz/`` (a ``free_requested`` directly
followed by its ``free_completed`` is one free; ``alloc`` opens a band, a free of the same
address closes it, a lone ``free_requested`` closes nothing; blocks allocated at snapshot
time without an open band are live from the start at their ``requested_size``).
"""

from __future__ import annotations

import pickle
import pickletools

import pytest
import torch
from test_torch_integration import record_history

from memscope.analysis.allocator_timeline import replay
from memscope.cli import main
from memscope.events.schema import CATEGORIES, FREE_CATEGORY
from memscope.io.snapshot_reader import read_snapshot

TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
SEGMENT_KEYS = {"device", "address", "total_size", "stream", "blocks"}


def viewer_peak(snapshot: dict, device: int = 0) -> int:
    """The Active Memory Timeline's maximum, by the viewer's own pairing rules."""
    merged: list[dict] = []
    for e in snapshot["device_traces"][device]:
        prev = merged[-1] if merged else None
        if (
            e["action"] == "free_completed"
            and prev is not None
            and prev["action"] == "free_requested"
            and prev["addr"] == e["addr"]
        ):
            merged[-1] = {**prev, "action": "free"}
            continue
        merged.append(e)
    open_bands: dict[int, int] = {}
    deltas: list[int] = []
    initial = 0
    for e in merged:
        if e["action"] == "alloc":
            open_bands[e["addr"]] = e["size"]
            deltas.append(e["size"])
        elif e["action"] in ("free", "free_completed"):
            if e["addr"] in open_bands:
                deltas.append(-open_bands.pop(e["addr"]))
            else:  # allocated before the recording: live from the start
                initial += e["size"]
                deltas.append(-e["size"])
    for segment in snapshot["segments"]:
        if segment["device"] != device:
            continue
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" and block["address"] not in open_bands:
                initial += block["requested_size"]
    level = best = initial
    for d in deltas:
        level += d
        best = max(best, level)
    return best


@pytest.fixture(scope="module")
def recorded_snapshot(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("viz")
    model, opt = record_history(tmp)
    params = {p.data_ptr() for p in model.parameters()}
    state = {v.data_ptr() for st in opt.state.values() for v in st.values() if torch.is_tensor(v)}
    return tmp / "rank00000", params, state


def test_export_labels_every_allocation_and_keeps_the_viewers_peak(recorded_snapshot, capsys):
    rank, params, state = recorded_snapshot
    source = rank / "memory_snapshot_steps1-2.pickle"
    out = rank / "labelled.pickle"
    assert main(["export", "--snapshot", str(source), "--out", str(out)]) == 0
    assert "opens in pytorch.org/memory_viz" in capsys.readouterr().out
    data = out.read_bytes()
    assert data[:2] == b"\x80\x04"  # protocol 4: the newest the viewer's unpickler reads
    protocols = {arg for op, arg, _ in pickletools.genops(data) if op.name == "PROTO"}
    assert protocols == {4}
    labelled = read_snapshot(str(out))  # plain data only: no class is needed to load it
    trace = labelled["device_traces"][0]
    assert trace and all(e.keys() >= TRACE_KEYS for e in trace)
    known = set(CATEGORIES) | {FREE_CATEGORY}
    assert {e["category"] for e in trace} <= known
    assert FREE_CATEGORY in {e["category"] for e in trace}  # the viewer needs it (module doc)
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert allocs and all(e["frames"][0]["filename"] == "memscope" for e in allocs)
    assert all("_start" not in e["frames"][0]["name"] for e in allocs)
    assert any(" · forward · " in e["frames"][0]["name"] for e in allocs)
    blocks = {}
    for segment in labelled["segments"]:
        assert segment.keys() >= SEGMENT_KEYS
        for block in segment["blocks"]:
            assert block.keys() >= BLOCK_KEYS
            blocks[block["address"]] = block["category"]
    assert {blocks[a] for a in params} == {"parameters"}
    assert {blocks[a] for a in state} == {"optimizer_state"}
    original = read_snapshot(str(source))
    assert viewer_peak(labelled) == viewer_peak(original) == replay(original).allocated_bytes
    # a snapshot is one recorded window: above the size limit it is written and flagged
    tiny = str(len(data) / 2**20 / 2)
    assert main(["export", "--snapshot", str(source), "--out", str(out), "--max-file-mb",
                 tiny]) == 0  # fmt: skip
    assert "above --max-file-mb" in capsys.readouterr().err and out.exists()


def test_the_viewers_peak_is_the_measured_peak_of_the_recorded_steps(recorded_snapshot):
    import json

    rank, _, _ = recorded_snapshot
    report = json.loads((rank / "runtime_report.json").read_text())
    measured = max(s["peak_allocated"] for s in report["steps"] if s["step"] in (1, 2))
    snapshot = read_snapshot(str(rank / "memory_snapshot_steps1-2.pickle"))
    assert viewer_peak(snapshot) == measured


def test_export_of_a_snapshot_refuses_bad_input_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"no": "segments"}, protocol=4))
    assert main(["export", "--snapshot", str(bad), "--out", str(tmp_path / "o.pickle")]) == 2
    assert "not an allocator snapshot" in capsys.readouterr().err
    missing = str(tmp_path / "missing.pickle")
    assert main(["export", "--snapshot", missing, "--out", str(tmp_path / "o.pickle")]) == 2
    assert "no such snapshot file" in capsys.readouterr().err
    assert not (tmp_path / "o.pickle").exists()
    good = tmp_path / "good.pickle"
    good.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4))
    args = ["export", "--snapshot", str(good), "--out", str(tmp_path / "o.pickle")]
    assert main([*args, "--steps", "0:1"]) == 2
    assert "--steps applies to --trace" in capsys.readouterr().err
