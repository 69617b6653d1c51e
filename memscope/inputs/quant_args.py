"""Megatron-LM's FP8 / FP4 arguments -> the spec's :class:`~.config.QuantSpec`.

What the recipe costs is :mod:`memscope.analysis.static.fp8`.
"""

from __future__ import annotations

import warnings
from typing import Any

from memscope.analysis.static.config import FP4_RECIPES, FP8_RECIPES, QuantSpec
from memscope.analysis.static.validation import ConfigWarning


def quant_from_args(args: Any, get: Any) -> QuantSpec | None:
    """The :class:`QuantSpec` of Megatron-LM's arguments (``get(args, name, default)`` reads
    one); ``None`` without ``fp8`` / ``fp4`` (megatron/training/arguments.py: ``--fp8-format``
    -> ``fp8``, ``--fp4-format`` -> ``fp4``, ``--fp8-param-gather``, ``--fp4-param-gather`` ->
    ``fp4_param``, ``--first-last-layers-bf16`` ...)."""
    fp8 = get(args, "fp8", None) or get(args, "fp8_format", None)
    fp4 = get(args, "fp4", None) or get(args, "fp4_format", None)
    if _off(fp8) and _off(fp4):
        return None
    if not _off(fp8) and not _off(fp4):
        raise ValueError("fp8 and fp4 are both set (Megatron-LM trains with one of them)")
    if not _off(fp4):
        recipe, choices = str(get(args, "fp4_recipe", "nvfp4")), FP4_RECIPES
        primary = get(args, "fp4_param", False) or get(args, "fp4_param_gather", False)
    else:
        recipe, choices = str(get(args, "fp8_recipe", "delayed")), FP8_RECIPES
        primary = get(args, "fp8_param_gather", False) or get(args, "fp8_param", False)
    if recipe not in choices:
        kind = "fp8" if _off(fp4) else "fp4"
        raise ValueError(f"{kind}_recipe: {recipe!r} is not one of {', '.join(choices)}")
    impl = str(get(args, "transformer_impl", "transformer_engine"))
    if impl != "transformer_engine":
        # megatron/core/fp8_utils.py get_fp8_context enters TE's autocast, which quantizes
        # only TE modules: the local spec's linears run in the activation dtype
        kind = "fp8" if _off(fp4) else "fp4"
        warnings.warn(
            ConfigWarning(
                f"{kind} with transformer_impl {impl}: Transformer Engine's autocast quantizes "
                "only TE layers, so the local layers are estimated in the activation dtype"
            ),
            stacklevel=3,
        )
        return None
    history = _int(get(args, "fp8_amax_history_len", 1), "fp8_amax_history_len")
    bf16 = _bool(get(args, "first_last_layers_bf16", False))
    start = _int(get(args, "num_layers_at_start_in_bf16", 1), "num_layers_at_start_in_bf16")
    end = _int(get(args, "num_layers_at_end_in_bf16", 1), "num_layers_at_end_in_bf16")
    return QuantSpec(
        recipe=recipe,
        primary_weights=_bool(primary),
        amax_history_len=history,
        bf16_layers_start=start if bf16 else 0,
        bf16_layers_end=end if bf16 else 0,
        weight_cache=not _bool(get(args, "disable_parameter_transpose_cache", False)),
    )


def _off(value: Any) -> bool:
    return value is None or value is False or str(value).strip().lower() in ("", "none", "false")


def _bool(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def _int(value: Any, name: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected an integer, got {value!r}") from None
    if out < 1 and name == "fp8_amax_history_len":
        raise ValueError(f"{name} must be >= 1, got {out}")
    if out < 0:
        raise ValueError(f"{name} must be >= 0, got {out}")
    return out
