#!/usr/bin/env python3
"""Print the training command line FlagScale's runner builds from an experiment YAML.

    python tools/flagscale_args.py --config configs/flagscale/memscope_tiny_gpt.yaml \
        --tree FLAGSCALE_ROOT [--set train.system.memscope_outdir=/tmp/ms ...]

Composes the experiment YAML with its ``defaults: [train: NAME]`` file (``train/NAME.yaml``
beside it, as Hydra does), resolves ``${a.b}`` interpolations, merges ``train.system``,
``train.model`` and ``train.data`` and flattens them with FlagScale's own
``flatten_dict_to_args`` (read from the tree's ``flagscale/runner/utils.py`` and compiled on
its own, so neither Hydra, OmegaConf nor the runner's other imports are needed). Prints one
argument per line. Used by ``tools/gpu_e2e.sh``; needs PyYAML.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from typing import Any

import yaml


def flatten_function(tree: str) -> Any:
    """FlagScale's ``flatten_dict_to_args`` compiled from the tree's source."""
    path = os.path.join(tree, "flagscale", "runner", "utils.py")
    with open(path, encoding="utf-8") as f:
        module = ast.parse(f.read())
    name = "flatten_dict_to_args"
    node = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def compose(config_path: str, overrides: list[str]) -> dict[str, Any]:
    """The experiment YAML with its train file under ``train``, overrides and ``${}`` applied."""
    with open(config_path, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    for entry in config.pop("defaults", []):
        if isinstance(entry, dict):
            ((group, name),) = entry.items()
            group_file = os.path.join(os.path.dirname(config_path), group, f"{name}.yaml")
            with open(group_file, encoding="utf-8") as f:
                config[group] = yaml.safe_load(f)
    for item in overrides:
        dotted, _, raw = item.partition("=")
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(raw)

    def lookup(match: re.Match[str]) -> str:
        value: Any = config
        for part in match.group(1).split("."):
            value = value[part]
        return str(value)

    def resolve(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, str):
            return re.sub(r"\$\{([\w.]+)\}", lookup, value)
        return value

    resolved: dict[str, Any] = resolve(config)
    return resolved


def training_args(config: dict[str, Any], tree: str) -> list[str]:
    """``train.system`` + ``train.model`` + ``train.data`` flattened as the runner does."""
    merged: dict[str, Any] = {}
    for section in ("system", "model", "data"):
        merged.update(config["train"].get(section) or {})
    ignore = ["log_dir", "details_dir", "scripts_dir", "pids_dir"]
    args: list[str] = flatten_function(tree)(merged, ignore)
    return args


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="FlagScale experiment YAML")
    parser.add_argument("--tree", required=True, help="FlagScale root (holds flagscale/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    opts = parser.parse_args(argv)
    print("\n".join(training_args(compose(opts.config, opts.set), opts.tree)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
