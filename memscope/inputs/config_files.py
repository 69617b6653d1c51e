"""A training config file -> the estimator's spec: FlagScale YAML or MemScope JSON.

A FlagScale training YAML is its ``system``/``model``/``data`` sections merged (as the
FlagScale runner does before turning them into ``--flags``), given Megatron's defaults
(:mod:`.flagscale_checks`); an experiment YAML is followed to the train config it names
(:mod:`.flagscale_experiment`). The original MemScope JSON config is flattened through a
few aliases. Both then go through :func:`.megatron_args.spec_from_megatron_args`. Whatever
the file holds, the only exception is a one-line ``ValueError``.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from memscope.analysis.static.config import DTYPE_BYTES, TrainingSpec
from memscope.analysis.static.read_keys import READ_KEYS
from memscope.analysis.static.validation import ConfigWarning, show
from memscope.inputs.config_keys import unknown_key_warnings
from memscope.inputs.config_text import MAX_NESTING, YamlRefusal, load_yaml, read_config_text
from memscope.inputs.flagscale_checks import (
    VISION_KEYS,
    apply_hetero,
    entrypoint_refusal,
    megatron_defaults,
    refuse_non_gpt,
)
from memscope.inputs.flagscale_experiment import train_config_of
from memscope.inputs.megatron_args import spec_from_megatron_args
from memscope.inputs.values import as_bool, as_str


def spec_from_flagscale_yaml(
    config: dict[str, Any],
    vocab_size: int | None = None,
    world_size: int | None = None,
    megatron_core: str | None = None,
) -> TrainingSpec:
    """From a FlagScale training YAML (its ``system``/``model``/``data`` sections merged).

    The merged keys get Megatron's argument defaults (:func:`.megatron_defaults`); a YAML for
    a model other than ``GPTModel`` is refused, heterogeneous meshes are resolved.
    ``megatron_core``: the release that ran it where not the installed one (a logged run's),
    which the spec follows and is checked against."""
    return _from_flagscale_yaml(config, vocab_size, world_size, megatron_core)[0]


def _from_flagscale_yaml(
    config: dict[str, Any],
    vocab_size: int | None,
    world_size: int | None,
    megatron_core: str | None = None,
) -> tuple[TrainingSpec, dict[str, Any]]:
    """:func:`spec_from_flagscale_yaml` and the merged keys as the YAML gives them."""
    merged: dict[str, Any] = {}
    for section in ("system", "model", "data"):
        part = config.get(section) or {}
        if not isinstance(part, dict):
            raise ValueError(
                f"{section}: expected a mapping in a FlagScale training YAML, got {show(part)}"
            )
        for key, value in _flatten(part, section).items():
            merged[key.replace("-", "_")] = value
    if not merged:
        raise ValueError("no system/model/data sections: not a FlagScale training YAML")
    _warn_all(unknown_key_warnings(merged, READ_KEYS | set(VISION_KEYS), yaml=True))
    given = dict(merged)  # before the defaults below fill it in
    refuse_non_gpt(merged)
    megatron_defaults(merged)
    apply_hetero(merged)
    return spec_from_megatron_args(merged, vocab_size, world_size, megatron_core), given


# The original MemScope JSON config's names (and common synonyms) -> Megatron arg names.
JSON_ALIASES = {
    "num_heads": "num_attention_heads",
    "n_heads": "num_attention_heads",
    "num_kv_heads": "num_query_groups",
    "n_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "seq_len": "seq_length",
    "sequence_length": "seq_length",
    "batch_size": "micro_batch_size",
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "dp": "data_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
}


JSON_SECTIONS = ("model", "train", "training", "parallel", "precision")

JSON_KNOWN = READ_KEYS | set(JSON_ALIASES) | {"dtype", "model_type"}

JSON_KNOWN |= {"hetero_stage_layers", "hetero_stage_meshes"}  # what apply_hetero sets


def spec_from_json_config(
    config: dict[str, Any], vocab_size: int | None = None, world_size: int | None = None
) -> TrainingSpec:
    """From the original MemScope JSON config: sections flattened, aliases and ``dtype``."""
    return _from_json_config(config, vocab_size, world_size)[0]


def _from_json_config(
    config: dict[str, Any], vocab_size: int | None, world_size: int | None
) -> tuple[TrainingSpec, dict[str, Any]]:
    """:func:`spec_from_json_config` and the flattened keys under Megatron's names."""
    for section in JSON_SECTIONS:
        if section in config and not isinstance(config[section], dict):
            raise ValueError(f"{section}: expected a mapping, got {show(config[section])}")
    raw = _flatten(config, "", leaves=frozenset(_LEAF_KEYS))
    _warn_all(unknown_key_warnings(raw, JSON_KNOWN, yaml=False))
    flat = {JSON_ALIASES.get(k, k): v for k, v in raw.items()}
    given = dict(flat)  # before dtype and the model_type defaults are resolved
    dtype = flat.pop("dtype", None)
    if dtype is not None:
        name = as_str(dtype, "dtype").lower()
        if name not in DTYPE_BYTES:
            raise ValueError(
                f"dtype {show(dtype)} is unknown; use one of {sorted(set(DTYPE_BYTES))}"
            )
        want = {"bf16": name in ("bf16", "bfloat16"), "fp16": name in ("fp16", "float16")}
        for flag, value in want.items():
            if flat.get(flag) is not None and as_bool(flat[flag], flag) != value:
                raise ValueError(f"dtype {show(dtype)} contradicts {flag}={show(flat[flag])}")
            flat[flag] = value
    model_type = flat.get("model_type")
    if model_type is not None and as_str(model_type, "model_type").lower() in (
        "llama", "qwen", "mistral"
    ):  # fmt: skip
        flat.setdefault("swiglu", True)
        flat.setdefault("normalization", "RMSNorm")
        flat.setdefault("position_embedding_type", "rope")
        flat.setdefault("disable_bias_linear", True)
        flat.setdefault("untie_embeddings_and_output_weights", True)
        flat.setdefault("hidden_dropout", 0.0)  # LLaMA recipes train without dropout
        flat.setdefault("attention_dropout", 0.0)
    return spec_from_megatron_args(flat, vocab_size, world_size), given


def load_config_file(
    path: str, vocab_size: int | None = None, world_size: int | None = None
) -> TrainingSpec:
    """A JSON (original MemScope) or YAML (FlagScale training) config file -> spec.

    Whatever the file holds, the only exception is a one-line ``ValueError`` (naming the
    field where there is one); suspicious values give :class:`.ConfigWarning` warnings."""
    return load_config(path, vocab_size, world_size)[0]


def load_config(
    path: str, vocab_size: int | None = None, world_size: int | None = None
) -> tuple[TrainingSpec, dict[str, Any]]:
    """:func:`load_config_file`, plus the config's own keys under Megatron's names (a YAML's
    ``system``/``model``/``data`` sections merged, a JSON config flattened with its aliases),
    before any default is filled in: what :mod:`.coverage` compares with what was read."""
    text = read_config_text(path)
    try:
        is_json = os.path.splitext(path)[1].lower() == ".json"
        data = _parse_json(path, text) if is_json else _parse_yaml(path, text)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the config must be a mapping at the top level")
        _refuse_memscope_output(path, data)
        if is_json:
            return _from_json_config(data, vocab_size, world_size)
        train = train_config_of(path, data)  # an experiment YAML: the train config it names
        refusal = entrypoint_refusal(train.path)
        if refusal:
            raise ValueError(refusal)
        _warn_all(train.notes)
        try:
            return _from_flagscale_yaml(train.data, vocab_size, world_size)
        except ValueError as exc:
            if train.experiment is None:
                raise
            raise ValueError(f"train config {train.path}: {exc}") from None
    except (ArithmeticError, LookupError, TypeError, AttributeError, RecursionError) as exc:
        # A safety net: every check above should have refused the config first.
        raise ValueError(
            f"{path}: the config could not be read ({UNEXPECTED}: {type(exc).__name__})"
        ) from None


UNEXPECTED = "unexpected value"  # the safety net's words (the fuzz tests look for them)


def _refuse_memscope_output(path: str, data: dict[str, Any]) -> None:
    """A file MemScope wrote (it has a ``report_type`` and a ``schema_version``) is no
    training config: say so instead of asking it for a vocabulary size."""
    kind = data.get("report_type")
    if isinstance(kind, str) and "schema_version" in data:
        raise ValueError(
            f"{path}: this is a MemScope {kind} report, not a training config (give a "
            "FlagScale YAML or a MemScope JSON config; a runtime report is read by summarize, "
            "visualize-runtime and diff)"
        )


def _parse_json(path: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise ValueError(f"{path}: invalid JSON (nested too deeply)") from None
    except ValueError:  # e.g. an integer with more digits than Python converts
        raise ValueError(f"{path}: invalid JSON (a number too long to read)") from None


def _parse_yaml(path: str, text: str) -> Any:
    import yaml

    try:
        return load_yaml(text)
    except YamlRefusal as exc:
        raise ValueError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}: invalid YAML ({type(exc).__name__}{where})") from None
    except RecursionError:
        raise ValueError(f"{path}: invalid YAML (nested too deeply)") from None
    except ValueError:  # e.g. an integer with more digits than Python converts
        raise ValueError(f"{path}: invalid YAML (a value it cannot convert)") from None


def _warn_all(messages: list[str]) -> None:
    for message in messages:
        warnings.warn(ConfigWarning(message), stacklevel=3)


# JSON keys whose value is one number, flag or name: a mapping there is a mistake, not a
# section (FlagScale YAMLs do use ``optimizer:`` as a section of optimizer settings).
_LEAF_KEYS = (READ_KEYS | set(JSON_ALIASES) | {"dtype", "model_type"}) - {"optimizer"}


def _flatten(
    d: dict[str, Any], where: str, depth: int = 0, leaves: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Nested sections merged into one mapping (later keys win, as FlagScale's runner does);
    a key in ``leaves`` holding a mapping is refused."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if not isinstance(key, str):
            raise ValueError(f"{where or 'config'}: key {show(key)} is not a string")
        if isinstance(value, dict):
            if key in leaves:
                raise ValueError(f"{key}: expected a value, got a mapping")
            if depth >= MAX_NESTING:
                raise ValueError(f"{key}: sections nested more than {MAX_NESTING} deep")
            out.update(_flatten(value, key, depth + 1, leaves))
        else:
            out[key] = value
    return out
