"""analyze-static given the experiment YAML a FlagScale user passes to ``run.py``: it follows
``defaults:`` to the train config, takes the world size from ``experiment.runner``, applies
the experiment's ``train:`` overrides in Hydra's order, and a YAML that is neither kind names
the file to pass."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest
import yaml

from memscope.cli import main
from memscope.inputs.flagscale_experiment import train_config_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs", "flagscale")
EXPERIMENT = os.path.join(CONFIGS, "memscope_tiny_gpt.yaml")
TRAIN = os.path.join(CONFIGS, "train", "tiny_gpt.yaml")


def _run(capsys, *args):
    rc = main(["analyze-static", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _report(outdir):
    with open(os.path.join(outdir, "static_report.json"), encoding="utf-8") as f:
        return json.load(f)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _copy_pair(tmp_path, experiment_text=None):
    """The repo's experiment + train pair in tmp_path, the experiment optionally rewritten."""
    shutil.copytree(CONFIGS, tmp_path / "conf")
    path = tmp_path / "conf" / "memscope_tiny_gpt.yaml"
    if experiment_text is not None:
        path.write_text(experiment_text)
    return str(path)


def test_experiment_yaml_estimates_its_train_config_at_the_runner_world_size(tmp_path, capsys):
    rc, _, err = _run(capsys, "--config", EXPERIMENT, "--outdir", str(tmp_path / "e"))
    assert rc == 0, err
    rc, _, err2 = _run(capsys, "--config", TRAIN, "--outdir", str(tmp_path / "t"),
                       "--world-size", "1")  # fmt: skip
    assert rc == 0, err2
    by_experiment, by_train = _report(tmp_path / "e"), _report(tmp_path / "t")
    assert by_experiment["summary"] == by_train["summary"]
    assert by_experiment["data_parallel"]["assumed"] is False
    assert (
        "experiment.runner nnodes 1 x nproc_per_node 1"
        in (by_experiment["data_parallel"]["source"])
    )


def test_cli_world_size_overrides_the_runner_with_one_warning(tmp_path, capsys):
    text = _read(EXPERIMENT).replace("nnodes: 1", "nnodes: 2")
    config = _copy_pair(tmp_path, text)
    rc, _, err = _run(capsys, "--config", config, "--outdir", str(tmp_path / "a"))
    assert rc == 0, err
    assert _report(tmp_path / "a")["world_size"] == 2
    rc, _, err = _run(capsys, "--config", config, "--outdir", str(tmp_path / "b"),
                      "--world-size", "4")  # fmt: skip
    assert rc == 0, err
    assert _report(tmp_path / "b")["world_size"] == 4
    warning = [line for line in err.splitlines() if "warning: world size" in line]
    assert warning == [
        f"memscope: warning: world size 4 (--world-size) overrides 2 ({config}: "
        "experiment.runner nnodes 2 x nproc_per_node 1)"
    ]
    rc, _, err = _run(capsys, "--config", config, "--outdir", str(tmp_path / "c"),
                      "--world-size", "2")  # fmt: skip
    assert rc == 0 and "warning: world size" not in err


@pytest.mark.parametrize("self_first", [False, True])
def test_train_overrides_in_the_experiment_follow_hydra_order(tmp_path, self_first):
    defaults = '["_self_", {"train": "tiny_gpt"}]' if self_first else '[{"train": "tiny_gpt"}]'
    text = (
        f"defaults: {defaults}\n"
        "experiment: {runner: {nnodes: 1, nproc_per_node: 1}}\n"
        "train: {model: {num_layers: 6}}\n"
        "extra_note: 1\n"
    )
    path = _copy_pair(tmp_path, text)
    data = yaml.safe_load(text)
    train = train_config_of(path, data)
    assert train.path == str(tmp_path / "conf" / "train" / "tiny_gpt.yaml")
    original = yaml.safe_load(_read(TRAIN))["model"]
    assert original["num_layers"] != 6
    assert train.data["model"]["num_layers"] == (original["num_layers"] if self_first else 6)
    assert train.data["model"]["hidden_size"] == original["hidden_size"]
    assert [n.split(":")[0] for n in train.notes] == ["extra_note"]


def test_ignored_experiment_keys_are_one_warning_line(tmp_path, capsys):
    text = _read(EXPERIMENT) + "\nmystery: 3\n"
    config = _copy_pair(tmp_path, text)
    rc, _, err = _run(capsys, "--config", config, "--outdir", str(tmp_path / "o"))
    assert rc == 0, err
    ignored = "mystery: top-level key of the experiment YAML ignored"
    assert sum(ignored in line for line in err.splitlines()) == 1


def test_a_train_config_error_names_the_train_file(tmp_path, capsys):
    config = _copy_pair(tmp_path)
    train = tmp_path / "conf" / "train" / "tiny_gpt.yaml"
    train.write_text(train.read_text().replace("num_layers:", "num_layers_gone:"))
    rc, _, err = _run(capsys, "--config", config, "--outdir", str(tmp_path / "o"))
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert f"train config {train}: num_layers: missing" in line
    assert line.count(config) == 1


def test_missing_train_file_names_where_it_was_looked_for(tmp_path, capsys):
    config = _copy_pair(tmp_path)
    os.remove(tmp_path / "conf" / "train" / "tiny_gpt.yaml")
    rc, _, err = _run(capsys, "--config", config, "--outdir", str(tmp_path / "o"))
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert os.path.join(str(tmp_path / "conf"), "train", "tiny_gpt.yaml") in line
    assert "does not exist" in line and "Traceback" not in err


def test_neither_kind_of_yaml_names_the_file_to_pass(tmp_path, capsys):
    _copy_pair(tmp_path)
    stray = tmp_path / "conf" / "memscope_system.yaml"
    shutil.copy(os.path.join(REPO, "integrations", "flagscale", "memscope_system.yaml"), stray)
    rc, _, err = _run(capsys, "--config", str(stray), "--outdir", str(tmp_path / "o"))
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert "neither a FlagScale train config" in line
    assert os.path.relpath(tmp_path / "conf" / "memscope_tiny_gpt.yaml") in line
    assert line.count(str(stray)) == 1


def test_serving_experiment_is_refused_as_not_training(tmp_path, capsys):
    serve = tmp_path / "serve.yaml"
    serve.write_text("defaults: [_self_]\nexperiment: {task: {type: serve}}\naction: run\n")
    rc, _, err = _run(capsys, "--config", str(serve), "--outdir", str(tmp_path / "o"))
    assert rc == 2
    assert "compose no train config" in err and "train/<name>.yaml" in err


@pytest.mark.integration
def test_every_gpt_training_experiment_of_flagscale_0_8_0_matches_its_train_config(tmp_path):
    """Each real example experiment that composes a train config gives the same spec as its
    train YAML at the runner's world size (or the same one-line refusal, non-GPT examples)."""
    from flagscale_trees import pristine_tree

    from memscope.inputs.config_files import load_config
    from memscope.inputs.config_text import read_yaml
    from memscope.inputs.flagscale_experiment import runner_world_size

    checked = estimated = 0
    for path in sorted(glob.glob(os.path.join(pristine_tree(), "examples", "*", "conf", "*.yaml"))):
        data = read_yaml(path)
        if not isinstance(data, dict) or "defaults" not in data:
            continue
        try:
            train = train_config_of(path, data)
        except ValueError as exc:
            assert "compose no train config" in str(exc), (path, exc)
            continue
        checked += 1
        try:
            world = runner_world_size(data, path)
        except ValueError:  # nnodes: ${env:WORLD_SIZE}: known at launch only
            world = None
        size = None if world is None else world[0]
        outcomes = []
        for config in (path, train.path):
            try:
                outcomes.append(load_config(config, 32000, size)[0])
            except ValueError as exc:
                outcomes.append(str(exc).split(": ", 1)[-1].split(f"{train.path}: ")[-1])
        if isinstance(outcomes[0], str):
            assert isinstance(outcomes[1], str) and outcomes[1] in outcomes[0], (path, outcomes)
        else:
            assert outcomes[0] == outcomes[1], path
            estimated += 1
    assert checked >= 20 and estimated >= 5, (checked, estimated)
