"""``memscope analyze-snapshot`` in-process: a snapshot pickle with MemScope's side files,
and bad input answered with one line and exit code 2."""

from __future__ import annotations

import json
import pickle

from conftest import load_json
from test_allocator_timeline import G, P, _step

from memscope.cli import main


def _write(tmp_path, snapshot, owners=True, markers=True) -> str:
    path = str(tmp_path / "memory_snapshot_steps2-3.pickle")
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    stem = path[: -len(".pickle")]
    if owners:
        ranges = [{"start": P, "end": P + 1024, "owner": "embedding.weight",
                   "category": "parameters"},
                  {"start": G, "end": G + 1024, "owner": "ddp.buffers[0].grad_data",
                   "category": "gradients", "container": True}]  # fmt: skip
        with open(stem + ".owners.json", "w") as f:
            json.dump({"ranges": ranges}, f)
    if markers:
        with open(stem + ".markers.jsonl", "w") as f:
            f.write(json.dumps({"time_us": 90, "phase": "forward", "module": "decoder.layers.0",
                                "microbatch": 0, "virtual_chunk": 0}) + "\n")  # fmt: skip
            f.write(json.dumps({"time_us": 125, "phase": "backward", "module": "output_layer",
                                "microbatch": 0, "virtual_chunk": 0}) + "\n")  # fmt: skip
    return path


def test_peak_composition_of_a_snapshot_with_its_side_files(tmp_path, capsys):
    path = _write(tmp_path, _step())
    assert main(["analyze-snapshot", "--snapshot", path]) == 0
    out = capsys.readouterr().out
    assert "peak allocated 18.00 KiB" in out and "output_layer · backward" in out
    result = load_json(path[: -len(".pickle")] + ".peak.json")
    assert result["peak_allocated_bytes"] == 18432
    assert result["owners_file"] and result["markers_file"]
    items = {(i["category"], i["module"]): i["bytes"] for i in result["composition"]["items"]}
    assert items == {
        ("activations", "decoder.layers.0"): 8192,
        ("activations", "output_layer"): 8192,
        ("parameters", "embedding.weight"): 1024,
        ("gradients", "ddp.buffers[0].grad_data"): 1024,
    }
    assert result["composition"]["unattributed_bytes"] == 0


def test_bad_snapshots_are_one_line_and_exit_2(tmp_path, capsys):
    missing = str(tmp_path / "nope.pickle")
    assert main(["analyze-snapshot", "--snapshot", missing]) == 2
    assert "no such snapshot file" in capsys.readouterr().err
    truncated = tmp_path / "t.pickle"
    truncated.write_bytes(pickle.dumps(_step(), protocol=4)[:100])
    assert main(["analyze-snapshot", "--snapshot", str(truncated)]) == 2
    err = capsys.readouterr().err
    assert "not a readable allocator snapshot" in err and err.count("\n") == 1
    code = tmp_path / "code.pickle"  # a pickle that would build an object: refused, not run
    code.write_bytes(pickle.dumps({"segments": [], "x": pickle.PickleError("x")}))
    assert main(["analyze-snapshot", "--snapshot", str(code)]) == 2
    assert "refusing _pickle.PickleError" in capsys.readouterr().err
    path = _write(tmp_path, _step(), markers=False)
    bad_owner = path[: -len(".pickle")] + ".owners.json"
    with open(bad_owner, "w") as f:
        f.write('{"ranges": [{"start": 1}]}')
    assert main(["analyze-snapshot", "--snapshot", path]) == 2
    assert "not an ownership file" in capsys.readouterr().err
