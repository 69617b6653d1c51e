"""What a JSON/YAML file or a Megatron namespace holds, as the type the spec needs.

:func:`as_int`, :func:`as_float`, :func:`as_bool`, :func:`as_str` and :func:`as_int_list`
convert one value or refuse it with a one-line ``ValueError`` naming the field;
:func:`label` names a Megatron argument as the spec and the docs call it.
"""

from __future__ import annotations

import math
from typing import Any

from memscope.analysis.static.validation import MAX_LAYERS, show

MAX_INT = 2**63 - 1  # what a Megatron (torch int64) size can hold

# Megatron argument -> the field as the spec and the docs call it (for messages).
LABELS = {
    "tensor_model_parallel_size": "parallel.tp",
    "pipeline_model_parallel_size": "parallel.pp",
    "data_parallel_size": "parallel.dp",
    "context_parallel_size": "parallel.cp",
    "expert_model_parallel_size": "parallel.ep",
    "expert_tensor_parallel_size": "parallel.etp",
    "virtual_pipeline_model_parallel_size": "parallel.vpp",
}


def label(name: str) -> str:
    """``parallel.tp (tensor_model_parallel_size)`` for a Megatron name that has a spec
    field, the name itself otherwise."""
    return f"{LABELS[name]} ({name})" if name in LABELS else name


def as_int(value: Any, field: str, minimum: int | None = None) -> int:
    """``value`` as an integer (ints and digit strings; not bools, floats or containers)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{field}: expected an integer, got {show(value)}")
    if isinstance(value, int):
        number = value
    else:
        try:
            number = int(value.strip())
        except ValueError:
            hint = ""
            if "${" in value:
                hint = (
                    " (an OmegaConf interpolation the experiment config resolves: give the value)"
                )
            raise ValueError(f"{field}: expected an integer, got {show(value)}{hint}") from None
    if abs(number) > MAX_INT:
        raise ValueError(f"{field}: {show(number)} does not fit a 64-bit integer")
    if minimum is not None and number < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {number}")
    return number


def as_float(value: Any, field: str, low: float | None = None, high: float | None = None) -> float:
    """``value`` as a finite float in ``[low, high]`` (numbers and numeric strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field}: expected a number, got {show(value)}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{field}: expected a number, got {show(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{field}: expected a finite number, got {show(value)}")
    if (low is not None and number < low) or (high is not None and number > high):
        span = f"[{low:g}, {high:g}]" if low is not None and high is not None else (
            f">= {low:g}" if low is not None else f"<= {high:g}")  # fmt: skip
        raise ValueError(f"{field} must be in {span}, got {number:g}")
    return number


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def as_bool(value: Any, field: str) -> bool:
    """``value`` as a flag: a bool, 0/1, or ``true``/``false`` spelled out."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{field}: expected true or false, got {show(value)}")


def as_str(value: Any, field: str) -> str:
    """``value`` as a name (a string, or an enum member such as Megatron's AttnBackend)."""
    if isinstance(value, (bool, int, float, list, tuple, dict, set)) or value is None:
        raise ValueError(f"{field}: expected a name (a string), got {show(value)}")
    return str(value)


def as_int_list(value: Any, field: str) -> list[int]:
    """A list of integers (``[2, 1, 1]``)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{field}: expected a list of integers, got {show(value)}")
    if len(value) > MAX_LAYERS * 5:
        raise ValueError(f"{field}: {len(value)} entries, more than any real job has")
    return [as_int(v, field) for v in value]
