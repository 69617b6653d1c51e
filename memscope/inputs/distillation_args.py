"""A ModelOpt distillation run's teacher and KD settings, read from Megatron args and files.

``--export-kd-teacher-load`` turns distillation on (Megatron-LM ``megatron/post_training/
model_provider.py``); the teacher's architecture comes from ``kd_teacher_<field>`` keys, else
the checkpoint's ``model_config.yaml`` (NeMo field names, as ``_load_teacher_model_config``
translates them); the KD settings from ``kd_*`` keys, else the ``export_kd_cfg`` YAML, else
ModelOpt's defaults. What the teacher costs is :mod:`memscope.analysis.static.distillation`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from memscope.analysis.static.config import DistillationSpec, TrainingSpec
from memscope.analysis.static.distillation import (
    KD_KEYS,
    KD_SETTINGS,
    REQUIRED_TEACHER_FIELDS,
    TEACHER_FIELDS,
    TEACHER_PREFIX,
)

_GIVE = ", ".join(TEACHER_PREFIX + f for f in REQUIRED_TEACHER_FIELDS)


def _get(src: Any, name: str, default: Any = None) -> Any:
    value = src.get(name, default) if isinstance(src, dict) else getattr(src, name, default)
    return default if value is None else value


def _nemo_to_megatron(config: dict[str, Any]) -> dict[str, Any]:
    """The NeMo field names of a teacher ``model_config.yaml`` as Megatron-LM's
    ``_load_teacher_model_config`` translates them."""
    out = dict(config)
    if "encoder_seq_length" in out:
        out["seq_length"] = out["encoder_seq_length"]
    if "bias" in out:
        out["disable_bias_linear"] = not out["bias"]
    if out.get("activation") == "swiglu":
        out["swiglu"] = True
    if "share_embeddings_and_output_weights" in out:
        out["untie_embeddings_and_output_weights"] = not out["share_embeddings_and_output_weights"]
    if "precision" in out:
        out[str(out["precision"])] = True
    return out


def _checkpoint_config(path: str) -> dict[str, Any] | None:
    """The teacher checkpoint's ``model_config.yaml`` (a mapping), or ``None`` when absent."""
    import yaml

    file = os.path.join(str(path), "model_config.yaml")
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"export_kd_teacher_load: {file} is not readable ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"export_kd_teacher_load: {file} is not a mapping")
    return _nemo_to_megatron(data)


def teacher_config(args: Any) -> tuple[dict[str, Any], str]:
    """(the teacher's fields, where they came from); refused with one line naming what to
    give when the architecture is not known."""
    load = _get(args, "export_kd_teacher_load")
    given = {f: _get(args, TEACHER_PREFIX + f) for f in TEACHER_FIELDS}
    given = {k: v for k, v in given.items() if v is not None}
    from_ckpt = _checkpoint_config(load) or {}
    fields = {**from_ckpt, **given}
    missing = [f for f in REQUIRED_TEACHER_FIELDS if f not in fields]
    if missing:
        raise ValueError(
            f"export_kd_teacher_load: the teacher's {', '.join(missing)} not known (no readable "
            f"{os.path.join(str(load), 'model_config.yaml')}); give {_GIVE}"
        )
    source = (
        "kd_teacher_* keys" if not from_ckpt
        else f"{load}/model_config.yaml" + (" and kd_teacher_* keys" if given else "")
    )  # fmt: skip
    return fields, source


def _kd_settings(args: Any) -> tuple[bool, int | None, int]:
    """(skip_lm_loss, logit_kl_topk, intermediate pairs) from ``kd_*`` keys, else the
    ``export_kd_cfg`` YAML, else ModelOpt's ``DistillationConfig`` defaults."""
    import yaml

    cfg: dict[str, Any] = {}
    path = _get(args, "export_kd_cfg")
    overridden = any(_get(args, k) is not None for k in KD_SETTINGS)
    if path is not None and not overridden:
        try:
            with open(str(path), encoding="utf-8") as f:
                cfg = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            raise ValueError(
                f"export_kd_cfg: {path} is not readable here; give {', '.join(KD_SETTINGS)} "
                "(skip_lm_loss, logit_kl_topk, number of intermediate_layer_pairs)"
            ) from None
        if not isinstance(cfg, dict):
            raise ValueError(f"export_kd_cfg: {path} is not a mapping")
    skip = _get(args, "kd_skip_lm_loss", cfg.get("skip_lm_loss", True))
    topk = _get(args, "kd_logit_kl_topk", cfg.get("logit_kl_topk"))
    pairs = _get(args, "kd_intermediate_layer_pairs", cfg.get("intermediate_layer_pairs") or [])
    count = len(pairs) if isinstance(pairs, (list, tuple)) else int(pairs)
    return bool(skip), (None if topk is None else int(topk)), count


def distillation_from_args(
    args: Any, student: TrainingSpec, build: Callable[[dict[str, Any]], TrainingSpec]
) -> DistillationSpec | None:
    """The :class:`DistillationSpec` of Megatron args (``None`` without
    ``export_kd_teacher_load``); the teacher is ``build`` (the args reader,
    :func:`.megatron_args.spec_from_megatron_args`) of the student's arguments with the
    teacher's fields in place (as Megatron-LM does)."""
    if _get(args, "export_kd_teacher_load") is None:
        stray = sorted(k for k in KD_KEYS - {"export_kd_teacher_load"} if _get(args, k) is not None)
        if stray:
            raise ValueError(f"{stray[0]} needs export_kd_teacher_load (ModelOpt distillation)")
        return None
    p = student.parallel
    if p.pp > 1 and p.vpp is not None:  # megatron/post_training/model_provider.py
        raise ValueError("ModelOpt distillation does not support the interleaved pipeline (vpp)")
    fields, source = teacher_config(args)
    base = dict(args) if isinstance(args, dict) else dict(vars(args))
    base.pop("kv_channels", None)  # Megatron: not recalculated if present
    for key in KD_KEYS:
        base.pop(key, None)
    base.update(fields)
    try:
        teacher = build(base)
    except ValueError as exc:
        raise ValueError(f"kd teacher ({source}): {exc}") from None
    skip, topk, pairs = _kd_settings(args)
    return DistillationSpec(teacher, source, skip, topk, pairs)
