"""The FlagScale experiment YAML a user passes to ``run.py``, followed to its train config.

``python run.py --config-path DIR --config-name NAME`` reads ``DIR/NAME.yaml``, an experiment
YAML: its Hydra ``defaults:`` list names the train config (``- train: 7b`` is
``DIR/train/7b.yaml``, holding ``system``/``model``/``data``) and its ``experiment.runner``
says how many processes are launched (``nnodes`` x ``nproc_per_node``, or a hostfile).
:func:`train_config_of` turns either kind of YAML into the train config the estimator reads;
a YAML that is neither is a ``ValueError`` naming the file(s) to pass instead.
"""

from __future__ import annotations

import copy
import glob
import os
from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.static.validation import show
from memscope.inputs.config_text import read_yaml
from memscope.inputs.hostfile import read_hostfile
from memscope.inputs.values import as_int

TRAIN_SECTIONS = ("system", "model", "data")
# What an experiment YAML holds besides its train config; none of it changes the training
# arguments (``experiment.envs`` and ``experiment.cmds`` set the environment, not flags).
NON_TRAIN_KEYS = frozenset({"defaults", "experiment", "action", "hydra"})


@dataclass(frozen=True)
class TrainConfig:
    """The train config to estimate, and where it came from."""

    path: str  # the train YAML read (the file itself when it was given directly)
    data: dict[str, Any]  # its top-level mapping, with the experiment's overrides applied
    experiment: str | None = None  # the experiment YAML that named it, if any
    notes: list[str] = field(default_factory=list)  # one-line warnings (ignored overrides)


def is_train_yaml(data: Any) -> bool:
    """A FlagScale train config: one of ``system``/``model``/``data`` at the top level."""
    return isinstance(data, dict) and any(s in data for s in TRAIN_SECTIONS)


def train_name(data: Any) -> str | None:
    """The train config an experiment YAML's ``defaults:`` composes (the last one wins, as in
    Hydra); ``None`` when the YAML names none."""
    defaults = data.get("defaults") if isinstance(data, dict) else None
    name = None
    for item in defaults if isinstance(defaults, list) else []:
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("train", "override train") and isinstance(value, str) and value:
                    name = value
    return name


def train_config_of(path: str, data: Any) -> TrainConfig:
    """``data`` (the YAML at ``path``) as a train config: itself when it is one, else the train
    config its ``defaults:`` names, with the experiment's ``train:`` overrides merged in the
    order Hydra composes them (``_self_`` before or after the train entry)."""
    if is_train_yaml(data):
        return TrainConfig(path, data)
    name = train_name(data)
    if name is None:
        raise ValueError(neither_message(path, data))
    train_path = os.path.join(os.path.dirname(path), "train", f"{name}.yaml")
    if not os.path.isfile(train_path):
        raise ValueError(
            f"defaults: '- train: {name}' names {train_path}, which does not exist (the train "
            f"config goes under <config-path>/train/; pass that YAML itself instead)"
        )
    train = read_yaml(train_path)
    if not is_train_yaml(train):
        raise ValueError(
            f"{train_path} (defaults: '- train: {name}'): no system/model/data sections, not a "
            "FlagScale train config"
        )
    merged, notes = _apply_overrides(data, train)
    return TrainConfig(train_path, merged, experiment=path, notes=notes)


def runner_world_size(data: Any, path: str) -> tuple[int, str] | None:
    """(world size, where from) of an experiment YAML's ``experiment.runner``: the slots of its
    ``hostfile`` when that names a readable file (relative to the YAML's folder or the working
    directory), else ``nnodes`` x ``nproc_per_node``; ``None`` when neither is given or the
    YAML has no runner."""
    experiment = data.get("experiment") if isinstance(data, dict) else None
    runner = experiment.get("runner") if isinstance(experiment, dict) else None
    if not isinstance(runner, dict):
        return None
    hostfile = runner.get("hostfile")
    if isinstance(hostfile, str) and hostfile and "${" not in hostfile:
        for candidate in (os.path.join(os.path.dirname(os.path.abspath(path)), hostfile), hostfile):
            if os.path.isfile(candidate):
                return read_hostfile(candidate), f"experiment.runner.hostfile {hostfile}"
    nnodes, nproc = runner.get("nnodes"), runner.get("nproc_per_node")
    if nnodes is None and nproc is None:
        return None
    nodes = as_int(1 if nnodes is None else nnodes, "experiment.runner.nnodes", minimum=1)
    per_node = as_int(1 if nproc is None else nproc, "experiment.runner.nproc_per_node", minimum=1)
    return nodes * per_node, f"experiment.runner nnodes {nodes} x nproc_per_node {per_node}"


def neither_message(path: str, data: Any) -> str:
    """Why ``data`` is neither a train config nor a training experiment, and which file to
    pass instead (found beside ``path`` where there is one)."""
    if isinstance(data, dict) and ("defaults" in data or "experiment" in data):
        what = "an experiment YAML whose defaults: compose no train config (not a training run)"
    else:
        what = (
            "neither a FlagScale train config (no system/model/data sections) nor an "
            "experiment YAML"
        )
    return f"{what}; pass {_suggestion(path)}"


def _suggestion(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    experiments = [
        f for f in sorted(glob.glob(os.path.join(folder, "*.yaml"))) if _composes_train(f)
    ]
    trains = sorted(glob.glob(os.path.join(folder, "train", "*.yaml")))
    found = [os.path.relpath(f) for f in (experiments or trains)[:3]]
    generic = (
        "the experiment YAML given to run.py (--config-path DIR --config-name NAME: "
        "DIR/NAME.yaml, with '- train: <name>' under defaults:) or its train config "
        "DIR/train/<name>.yaml"
    )
    return f"e.g. {', '.join(found)} ({generic})" if found else generic


def _composes_train(path: str) -> bool:
    try:
        return train_name(read_yaml(path)) is not None
    except ValueError:
        return False


def _apply_overrides(experiment: dict[str, Any], train: dict[str, Any]) -> tuple[dict, list[str]]:
    """The train config with the experiment's own ``train:`` node merged in: it wins when
    ``_self_`` comes after the train entry in ``defaults:`` (Hydra's order), else the train
    config wins. Other top-level keys that are not FlagScale's experiment keys are named as
    ignored."""
    notes = [
        f"{key}: top-level key of the experiment YAML ignored (only train: overrides the "
        "train config)"
        for key in experiment
        if key not in NON_TRAIN_KEYS and key != "train"
    ]
    override = experiment.get("train")
    if override is None:
        return train, notes
    if not isinstance(override, dict):
        raise ValueError(
            f"train: expected a mapping of train-config overrides, got {show(override)}"
        )
    if _self_first(experiment.get("defaults")):
        merged = _deep_merge(override, train)  # the train config, composed later, wins
    else:
        merged = _deep_merge(train, override)
    return merged, notes


def _self_first(defaults: Any) -> bool:
    """Whether ``_self_`` precedes the train entry (Hydra: then the train config overrides
    the experiment's own keys; without ``_self_`` the experiment's keys come last)."""
    order = []
    for item in defaults if isinstance(defaults, list) else []:
        if item == "_self_":
            order.append("self")
        elif isinstance(item, dict) and any(k in ("train", "override train") for k in item):
            order.append("train")
    return "self" in order and "train" in order and order.index("self") < order.index("train")


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, mappings merged key by key (what OmegaConf's merge does)."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def experiment_world_size(path: str) -> tuple[int, str] | None:
    """(world size, where from) of a FlagScale experiment YAML's ``experiment.runner`` (see
    :func:`runner_world_size`); a YAML without a runner is refused."""
    data = read_yaml(path)
    experiment = data.get("experiment") if isinstance(data, dict) else None
    if not isinstance(experiment, dict) or not isinstance(experiment.get("runner"), dict):
        raise ValueError(f"{path}: experiment.runner: missing (not a FlagScale experiment YAML)")
    return runner_world_size(data, path)
