"""analyze-static's world size: --world-size, --nnodes x --nproc-per-node, a FlagScale
experiment YAML's runner, a hostfile; contradictions refused; an assumed DP stated."""

from __future__ import annotations

import json
import os
import sys

import pytest

from memscope.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(tmp_path, name="cfg.json", **train):
    """A tp 2 x pp 2 model with no dp or world size (the grid's product is 4)."""
    cfg = {
        "model": {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 256,
                  "seq_len": 32},
        "train": {"batch_size": 1, "tp": 2, "pp": 2, **train},
    }  # fmt: skip
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _run(capsys, *args):
    rc = main(["analyze-static", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _report(tmp_path):
    return json.loads((tmp_path / "out" / "static_report.json").read_text())


def _md(tmp_path):
    return (tmp_path / "out" / "static_report.md").read_text()


def test_world_size_option_sets_dp(tmp_path, capsys):
    rc, out, err = _run(capsys, "--config", _config(tmp_path), "--outdir", str(tmp_path / "out"),
                        "--world-size", "16")  # fmt: skip
    assert rc == 0, err
    report = _report(tmp_path)
    assert report["world_size"] == 16 and report["metadata"]["spec"]["parallel"]["dp"] == 4
    assert report["data_parallel"] == {
        "dp": 4, "world_size": 16, "assumed": False, "source": "--world-size"
    }  # fmt: skip
    assert "assumed" not in out
    assert "DP=4 from --world-size" in _md(tmp_path)


def test_nnodes_times_nproc_per_node(tmp_path, capsys):
    args = ["--config", _config(tmp_path), "--outdir", str(tmp_path / "out")]
    rc, _, err = _run(capsys, *args, "--nnodes", "2", "--nproc-per-node", "8")
    assert rc == 0, err
    assert _report(tmp_path)["world_size"] == 16
    rc, _, err = _run(capsys, *args, "--nnodes", "2", "--nproc-per-node", "8", "--world-size", "16")
    assert rc == 0, err


def test_contradicting_world_sizes_are_one_line_exit_2(tmp_path, capsys):
    args = ["--config", _config(tmp_path), "--outdir", str(tmp_path / "out")]
    rc, _, err = _run(capsys, *args, "--nnodes", "2", "--nproc-per-node", "8", "--world-size", "8")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "contradicts" in err
    rc, _, err = _run(capsys, *args, "--nnodes", "2")
    assert rc == 2 and "--nproc-per-node" in err
    # the config's own world_size disagreeing with the launcher's
    rc, _, err = _run(capsys, "--config", _config(tmp_path, "w8.json", world_size=8), "--outdir",
                      str(tmp_path / "out"), "--world-size", "16")  # fmt: skip
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "contradicts" in err
    # a world size the grid cannot hold (not a multiple of tp x pp x cp)
    rc, _, err = _run(capsys, *args, "--world-size", "6")
    assert rc == 2 and "multiple of tp x pp x cp" in err


def test_hostfile_slots(tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two nodes\nnode0 slots=8\nnode1 slots=8 type=A100\n\n")
    rc, _, err = _run(capsys, "--config", _config(tmp_path), "--outdir", str(tmp_path / "out"),
                      "--hostfile", str(hostfile))  # fmt: skip
    assert rc == 0, err
    report = _report(tmp_path)
    assert report["world_size"] == 16 and report["data_parallel"]["source"].startswith("hostfile")
    hostfile.write_text("node0\n")
    rc, _, err = _run(capsys, "--config", _config(tmp_path), "--outdir", str(tmp_path / "out"),
                      "--hostfile", str(hostfile))  # fmt: skip
    assert rc == 2 and "slots=N" in err


def _flagscale_example() -> str:
    sys.path.insert(0, os.path.join(REPO, "tools"))
    from flagscale_wheel import flagscale_tree

    try:
        return os.path.join(flagscale_tree(download=False), "examples", "llama3", "conf")
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.mark.integration
def test_flagscale_experiment_runner_nnodes_times_nproc(tmp_path, capsys):
    conf = _flagscale_example()  # train.yaml: runner nnodes 4 x nproc_per_node 8
    rc, _out, err = _run(capsys, "--config", os.path.join(conf, "train", "70b.yaml"), "--outdir",
                        str(tmp_path / "out"), "--experiment", os.path.join(conf, "train.yaml"),
                        "--vocab-size", "128256")  # fmt: skip
    assert rc == 0, err
    report = _report(tmp_path)
    assert report["world_size"] == 32
    assert "nnodes 4 x nproc_per_node 8" in report["data_parallel"]["source"]
    # --world-size contradicting the experiment's runner
    rc, _, err = _run(capsys, "--config", os.path.join(conf, "train", "70b.yaml"), "--outdir",
                      str(tmp_path / "out"), "--experiment", os.path.join(conf, "train.yaml"),
                      "--vocab-size", "128256", "--world-size", "64")  # fmt: skip
    assert rc == 2 and "contradicts" in err


def test_experiment_hostfile_wins_over_nnodes(tmp_path, capsys):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "hostfile").write_text("a slots=4\nb slots=4\nc slots=4\nd slots=4\n")
    (conf / "train.yaml").write_text(
        "experiment:\n  runner:\n    backend: torchrun\n    nnodes: 4\n    nproc_per_node: 4\n"
        "    hostfile: hostfile\n"
    )
    rc, _, err = _run(capsys, "--config", _config(tmp_path), "--outdir", str(tmp_path / "out"),
                      "--experiment", str(conf / "train.yaml"))  # fmt: skip
    assert rc == 0, err
    assert _report(tmp_path)["world_size"] == 16
    assert "hostfile" in _report(tmp_path)["data_parallel"]["source"]
    (conf / "bad.yaml").write_text("experiment: {}\n")
    rc, _, err = _run(capsys, "--config", _config(tmp_path), "--outdir", str(tmp_path / "out"),
                      "--experiment", str(conf / "bad.yaml"))  # fmt: skip
    assert rc == 2 and "experiment.runner" in err


def test_nothing_says_the_world_size_states_the_assumed_dp(tmp_path, capsys):
    rc, out, err = _run(capsys, "--config", _config(tmp_path), "--outdir", str(tmp_path / "out"))
    assert rc == 0, err
    assert "assumed DP=1 (world size 4" in out
    report = _report(tmp_path)
    assert report["data_parallel"]["assumed"] is True and report["data_parallel"]["dp"] == 1
    assert "Data parallel assumed" in _md(tmp_path) and "DP=1" in _md(tmp_path)


def test_config_dp_is_not_assumed(tmp_path, capsys):
    rc, out, err = _run(capsys, "--config", _config(tmp_path, "dp2.json", dp=2), "--outdir",
                        str(tmp_path / "out"))  # fmt: skip
    assert rc == 0, err
    assert "assumed" not in out
    assert _report(tmp_path)["data_parallel"]["source"] == "config"
