"""configs/flagscale: FlagScale's own flattening and Megatron's parser accept every memscope key.

``flatten_dict_to_args`` and ``_get_args_megatron`` are FlagScale's real functions, compiled
from the wheel's source on their own: importing ``flagscale.runner.utils`` would pull in
aiohttp, tqdm and the rest of the runner, none of which these two functions use (the test
checks that the only globals they read are each other and OmegaConf).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import copy
import dis
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml
from flagscale_trees import ROOT, compose, patched_tree, pristine_tree, training_args

from memscope.integrations.megatron import add_memscope_args, parse_bool

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(ROOT, "configs", "flagscale")
EXPERIMENT = os.path.join(CONFIGS, "memscope_tiny_gpt.yaml")
TRAIN = os.path.join(CONFIGS, "train", "tiny_gpt.yaml")


def _flagscale_function(relpath: str, name: str, namespace: dict[str, Any]) -> Any:
    """Compile one top-level function of the FlagScale tree's source into ``namespace``."""
    with open(os.path.join(pristine_tree(), relpath), encoding="utf-8") as f:
        module = ast.parse(f.read())
    node = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name)
    code = compile(ast.Module(body=[node], type_ignores=[]), relpath, "exec")
    exec(code, namespace)
    fn = namespace[name]
    used = {i.argval for i in dis.get_instructions(fn) if i.opname == "LOAD_GLOBAL"}
    assert used <= set(namespace) | set(dir(builtins)), used - set(namespace)
    return fn


def _flatten() -> Any:
    return _flagscale_function("flagscale/runner/utils.py", "flatten_dict_to_args", {})


def _composed() -> dict[str, Any]:
    """Hydra's composition of the pair, ``${}`` resolved (tools/flagscale_args.py)."""
    with open(EXPERIMENT, encoding="utf-8") as f:
        assert yaml.safe_load(f)["defaults"] == [{"train": "tiny_gpt"}, "_self_"]
    return compose(EXPERIMENT, [])


def _memscope_keys(system: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in system.items() if k.startswith("memscope")}


def _our_options() -> set[str]:
    parser = add_memscope_args(argparse.ArgumentParser())
    return {a.dest for a in parser._actions if a.help != argparse.SUPPRESS and a.dest != "help"}


def _expected(value: Any) -> Any:
    return parse_bool(value) if isinstance(value, (bool, str)) and value in (
        True, False, "true", "false"
    ) else value  # fmt: skip


def test_every_memscope_option_is_in_train_system_and_commented():
    system = _composed()["train"]["system"]
    assert set(_memscope_keys(system)) == _our_options()
    with open(TRAIN, encoding="utf-8") as f:
        lines = [line for line in f if line.strip().startswith("memscope")]
    assert len(lines) == len(_our_options())
    assert all(" # " in line for line in lines), [line for line in lines if " # " not in line]


def test_flagscale_flattening_of_train_system_parses_with_our_provider():
    config = _composed()
    system = config["train"]["system"]
    argv = _flatten()(copy.deepcopy(system))
    parser = add_memscope_args(argparse.ArgumentParser())
    parsed, unknown = parser.parse_known_args(argv)
    assert not [a for a in unknown if a.startswith("--memscope")]
    for key, value in _memscope_keys(system).items():
        assert getattr(parsed, key) == _expected(value), key
    assert parsed.memscope_outdir == config["experiment"]["exp_dir"] + "/memscope"
    assert "--memscope-hook-modules" in argv and "--memscope-sync-on-module-hooks" in argv
    # Why a default-on switch is turned off with the string "false": a bare false is dropped.
    assert _flatten()({"memscope_hook_modules": False}) == []
    off = parser.parse_args(_flatten()({"memscope_hook_modules": "false"}))
    assert off.memscope_hook_modules is False


def test_flagscale_runner_builds_the_command_line_with_omegaconf():
    omegaconf = pytest.importorskip("omegaconf")
    conf = omegaconf.OmegaConf
    experiment = conf.load(EXPERIMENT)
    experiment.pop("defaults")
    config = conf.merge({"train": conf.load(TRAIN)}, experiment)
    get_args = _flagscale_function(
        "flagscale/runner/runner_train.py",
        "_get_args_megatron",
        {"OmegaConf": conf, "DictConfig": omegaconf.DictConfig, "flatten_dict_to_args": _flatten()},
    )
    argv = get_args(config)
    assert argv == training_args(_composed(), pristine_tree())  # what tools/gpu_e2e.sh runs
    i = argv.index("--memscope-outdir")
    assert argv[i + 1] == "./outputs/memscope_tiny_gpt/memscope"
    assert argv[argv.index("--memscope-profiler-ranks") + 1] == "0"
    assert "--mock-data" in argv and argv[argv.index("--tokenizer-type") + 1] == "NullTokenizer"


def _train_gpt_args(tmp_path, tree: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    worker = os.path.join(HERE, "flagscale_train_gpt_args_worker.py")
    cmd = [sys.executable, worker, tree, str(tmp_path / "args.json"), "--", *argv]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.multiprocess
def test_patched_train_gpt_accepts_the_whole_yaml_and_pristine_refuses_memscope(tmp_path):
    train = _composed()["train"]
    argv = training_args(_composed(), pristine_tree())  # system + model + data, flattened

    proc = _train_gpt_args(tmp_path, patched_tree(), argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "args.json", encoding="utf-8") as f:
        parsed = json.load(f)
    for key, value in _memscope_keys(train["system"]).items():
        assert parsed[key] == _expected(value), key
    assert parsed["num_layers"] == 4 and parsed["vocab_size"] == 4096
    assert parsed["transformer_impl"] == "local" and parsed["mock_data"] is True
    # what the GPU script needs without apex or Transformer Engine, all from the YAML
    for fused in ("gradient_accumulation_fusion", "masked_softmax_fusion",
                  "bias_dropout_fusion", "bias_gelu_fusion"):  # fmt: skip
        assert parsed[fused] is False, fused
    assert parsed["no_persist_layer_norm"] is True and parsed["legacy_tokenizer"] is True

    proc = _train_gpt_args(tmp_path, pristine_tree(), argv)
    assert proc.returncode == 2 and "unrecognized arguments: --memscope" in proc.stderr


def test_static_estimator_configs_load():
    """configs/static/*.json (original MemScope JSON: model + train) and the FlagScale YAML."""
    from memscope.inputs.config_files import load_config_file

    folder = os.path.join(ROOT, "configs", "static")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    assert len(names) >= 3
    for name in names:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            data = json.load(f)
        assert set(data) == {"model", "train"}, name
        spec = load_config_file(os.path.join(folder, name))
        assert spec.model.num_layers == data["model"]["num_layers"], name
        assert spec.parallel.tp == data["train"]["tp"], name
    tiny = load_config_file(os.path.join(folder, "tiny_gpt.json"))
    assert load_config_file(TRAIN).model == tiny.model  # the same model as the YAML pair


def test_integration_snippet_flattens_to_memscope_defaults_with_tracing_on():
    """integrations/flagscale/memscope_system.yaml: every option (memscope_ranks commented out,
    since the runner cannot pass "all ranks"), and each value is MemScope's default."""
    path = os.path.join(ROOT, "integrations", "flagscale", "memscope_system.yaml")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    snippet = yaml.safe_load(text)
    assert set(snippet) | {"memscope_ranks"} == _our_options()
    assert "# memscope_ranks:" in text
    snippet["memscope_outdir"] = "/x/memscope"
    parser = add_memscope_args(argparse.ArgumentParser())
    parsed = parser.parse_args(_flatten()(snippet))
    defaults = parser.parse_args([])
    changed = {k for k in vars(parsed) if getattr(parsed, k) != getattr(defaults, k)}
    assert changed == {"memscope", "memscope_outdir"}
