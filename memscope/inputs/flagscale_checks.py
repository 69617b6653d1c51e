"""What a FlagScale training YAML means to Megatron before it becomes a spec.

* :func:`refuse_non_gpt` / :func:`entrypoint_refusal`: the estimator models Megatron's
  ``GPTModel`` only; a YAML for another model (vision-language, RWKV, robotics policies) is
  refused with one ``ValueError`` that names the key or the experiment file proving it.
* :func:`megatron_defaults`: the argument defaults ``validate_args`` fills in that the
  estimator needs (SwiGLU FFN width, ``group_query_attention`` off unless set).
* :func:`apply_hetero`: FlagScale's heterogeneous process meshes: each stage gets its
  mesh's tp and dp and the layer split; cp and ep must agree across meshes.
* :func:`eval_layer_pattern`: Megatron's ``--moe-layer-freq`` list expressions, evaluated
  without ``eval``.
"""

from __future__ import annotations

import ast
import glob
import os
import re
from typing import Any

from memscope.analysis.static.validation import show
from memscope.inputs.config_text import load_yaml, read_config_text
from memscope.inputs.values import as_bool, as_float, as_int

# Keys that only multimodal (vision-language / robotics VLA) training scripts read.
VISION_KEYS = (
    "freeze_ViT",
    "freeze_LM",
    "vision_model_type",
    "language_model_type",
    "vision_root",
    "img_h",
    "img_w",
    "patch_dim",
    "mrope_section",
    "image_aspect_ratio",
)
# FlagScale entrypoints that build a Megatron GPTModel from these arguments.
GPT_ENTRYPOINTS = ("train_gpt.py", "pretrain_gpt.py", "train_aquila_sft.py")
CORE_KEYS = ("num_layers", "hidden_size", "num_attention_heads")
_REFUSAL = "the static estimator models Megatron GPTModel training only"


# Megatron-LM's argparse defaults of the vision options every arguments dump prints
# (megatron/training/arguments.py ``_add_vision_args``: --img-h 224, --img-w 224,
# --patch-dim 16): a key at its default, or None, does not prove a multimodal model.
VISION_DEFAULTS: dict[str, Any] = {"img_h": 224, "img_w": 224, "patch_dim": 16}


def _sets_vision(merged: dict[str, Any], key: str) -> bool:
    value = merged.get(key)
    if value is None or str(value).strip() in ("None", "null", ""):
        return False
    return key not in VISION_DEFAULTS or str(value).strip() != str(VISION_DEFAULTS[key])


def refuse_non_gpt(merged: dict[str, Any]) -> None:
    """Raise when the merged ``system``/``model``/``data`` keys prove a non-GPT model."""
    for key in VISION_KEYS:
        if _sets_vision(merged, key):
            raise ValueError(
                f"{key}: a vision-language(-action) model config (a multimodal entrypoint "
                f"builds its language model next to a vision encoder); {_REFUSAL}"
            )
    if str(merged.get("position_embedding_type")) == "mrope":
        raise ValueError(
            f"position_embedding_type: 'mrope' is the multimodal rotary embedding of a "
            f"vision-language model; {_REFUSAL}"
        )
    missing = [k for k in CORE_KEYS if k not in merged]
    if missing:
        present = ", ".join(sorted(merged)[:6])
        raise ValueError(
            f"{missing[0]}: missing ({', '.join(missing)} absent; keys found: {present}, ...) "
            f"-- not a Megatron GPT training config; {_REFUSAL}"
        )


def entrypoint_refusal(path: str) -> str | None:
    """Why ``<example>/conf/train/<name>.yaml`` is not GPT training, from the experiment
    configs next to it (``<example>/conf/*.yaml``): the ``experiment.task.entrypoint`` of
    those that compose ``train: <name>``, else of all those that compose a ``train`` config.
    ``None`` when nothing proves a non-GPT entrypoint (other layouts included)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(folder) != "train":
        return None
    name = os.path.splitext(os.path.basename(path))[0]
    found: list[tuple[str, str]] = []  # (experiment file, entrypoint), naming this config
    others: list[tuple[str, str]] = []  # ... composing another train config
    for exp in sorted(glob.glob(os.path.join(os.path.dirname(folder), "*.yaml"))):
        train, entry = _experiment_train_and_entrypoint(exp)
        if train is not None and entry is not None:
            (found if train == name else others).append((exp, entry))
    for exp, entry in found or others:
        script = os.path.basename(entry)
        if script.startswith(("train_", "pretrain_")) and script not in GPT_ENTRYPOINTS:
            where = os.path.relpath(exp, os.path.dirname(os.path.dirname(folder)))
            return (
                f"experiment.task.entrypoint: {where} trains this example with {entry}, not "
                f"a GPTModel script ({', '.join(GPT_ENTRYPOINTS)}); {_REFUSAL}"
            )
    return None


def _experiment_train_and_entrypoint(path: str) -> tuple[str | None, str | None]:
    import yaml

    try:  # the same limits as the training YAML itself (size, regular file, no alias bombs)
        data = load_yaml(read_config_text(path))
    except (ValueError, yaml.YAMLError, RecursionError):  # YamlRefusal is a ValueError
        return None, None
    if not isinstance(data, dict):
        return None, None
    train = None
    defaults = data.get("defaults")
    for item in defaults if isinstance(defaults, list) else []:
        if isinstance(item, dict) and isinstance(item.get("train"), str):
            train = item["train"]
    experiment = data.get("experiment")
    task = experiment.get("task") if isinstance(experiment, dict) else None
    entry = task.get("entrypoint") if isinstance(task, dict) else None
    return train, (entry if isinstance(entry, str) and entry else None)


def megatron_defaults(merged: dict[str, Any]) -> None:
    """Fill in what Megatron's argparse and ``validate_args`` would (in place)."""
    merged.setdefault("group_query_attention", False)  # a store_true flag
    swiglu = merged.get("swiglu")
    if merged.get("ffn_hidden_size") is None and swiglu is not None and as_bool(swiglu, "swiglu"):
        h = as_int(merged.get("hidden_size"), "model.hidden_size", minimum=1)
        multiple = merged.get("multiple_of")
        if multiple is not None:
            multiple = as_int(multiple, "multiple_of", minimum=1)
            width = 8 * h // 3  # int(4 * h * 2 / 3), exact for any size
            factor = merged.get("hidden_dim_multiplier")
            if factor is not None:
                width = int(width * as_float(factor, "hidden_dim_multiplier", 0.0, 1e6))
            merged["ffn_hidden_size"] = multiple * ((width + multiple - 1) // multiple)
        else:
            merged["ffn_hidden_size"] = 8 * h // 3 // 64 * 64  # int((4 * h * 2 / 3) / 64) * 64


def apply_hetero(merged: dict[str, Any]) -> None:
    """FlagScale's ``enable_hetero``: meshes ``[tp, cp, ep, dp, pp] * n`` and a layer split.

    Each mesh's stages get that mesh's tp and dp (``hetero_stage_meshes``); cp, ep and the
    expert tp must agree across meshes (one spec holds one of each)."""
    hetero = merged.get("enable_hetero")
    if hetero is None or not as_bool(hetero, "enable_hetero"):
        return
    meshes = merged.get("hetero_process_meshes")
    if not isinstance(meshes, list) or not meshes or len(meshes) % 5 or len(meshes) > 5 * 4096:
        raise ValueError("hetero_process_meshes: expected a list of [tp, cp, ep, dp, pp] * n")
    rows = [[as_int(v, "hetero_process_meshes", minimum=1) for v in meshes[i : i + 5]]
            for i in range(0, len(meshes), 5)]  # fmt: skip
    etps = merged.get("expert_tensor_parallel_size_per_process_mesh")
    if etps is not None:
        if not isinstance(etps, list):
            raise ValueError(
                f"expert_tensor_parallel_size_per_process_mesh: expected a list, got {show(etps)}"
            )
        etps = [as_int(x, "expert_tensor_parallel_size_per_process_mesh", minimum=1) for x in etps]
    for column, name in ((1, "cp"), (2, "ep")):
        values = [row[column] for row in rows]
        if len(set(values)) > 1:
            raise ValueError(
                f"hetero_process_meshes: the meshes use different {name} sizes {values}; "
                "estimate each mesh's stages as their own homogeneous config"
            )
    if etps and len(set(etps)) > 1:
        raise ValueError(
            f"expert_tensor_parallel_size_per_process_mesh: different sizes {etps}; one spec "
            "holds one expert tensor-parallel size"
        )
    tp, cp, ep, dp, _ = rows[0]
    pp = sum(row[4] for row in rows)
    if pp > 4096:
        raise ValueError(f"hetero_process_meshes: {pp} pipeline stages, more than any real job")
    stages = [(row[0], row[3]) for row in rows for _ in range(row[4])]
    merged.update(
        tensor_model_parallel_size=tp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        data_parallel_size=dp,
        pipeline_model_parallel_size=pp,
    )
    if len(set(stages)) > 1:
        merged["hetero_stage_meshes"] = stages
    if etps:
        merged["expert_tensor_parallel_size"] = etps[0]
    split = merged.get("hetero_pipeline_layer_split")
    if split is None:
        return
    if not isinstance(split, list):
        raise ValueError(f"hetero_pipeline_layer_split: expected a list, got {show(split)}")
    counts = [as_int(v, "hetero_pipeline_layer_split") for v in split]
    if len(counts) != pp:
        raise ValueError(f"hetero_pipeline_layer_split: {len(counts)} stages, the meshes have {pp}")
    merged["hetero_stage_layers"] = counts


_PATTERN_CHARS = re.compile(r"[^,\d\[\]()+*\s]")


def eval_layer_pattern(text: str, field: str = "moe_layer_freq") -> list[int]:
    """Megatron's list expression (``"[0]+[1]*26"``, ``"([1]*3+[0])*2"``): only integer
    literals, lists/tuples, ``+`` and ``*`` are evaluated; anything else raises."""
    if _PATTERN_CHARS.search(text):
        raise ValueError(f"{field}: {show(text)} is not a list expression of digits, [], (), +, *")
    try:
        value = _eval_node(ast.parse(text.strip(), mode="eval").body, field, text)
    except (SyntaxError, RecursionError):
        raise ValueError(f"{field}: {text!r} is not a valid list expression") from None
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{field}: {text!r} does not evaluate to a list of integers")
    return value


def _eval_node(node: ast.AST, field: str, text: str) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_eval_node(e, field, text) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _eval_node(node.left, field, text), _eval_node(node.right, field, text)
        if isinstance(node.op, ast.Add) and type(left) is type(right):
            return left + right
        if isinstance(node.op, ast.Mult):
            seq, count = (left, right) if isinstance(right, int) else (right, left)
            size = len(seq) if isinstance(seq, (list, tuple)) else 1
            if isinstance(count, int) and size * max(count, 0) <= 1_000_000:
                return seq * count
    raise ValueError(f"{field}: {text!r} is not a valid list expression")
