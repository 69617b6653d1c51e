"""One Megatron argument, read and typed: from a parsed namespace or a dict with the same
underscore keys (``None`` counts as absent, as Megatron's defaults do)."""

from __future__ import annotations

import warnings
from typing import Any

from memscope.analysis.static.validation import ConfigWarning
from memscope.inputs.values import as_bool, as_float, as_int, as_int_list, as_str, label


def get(src: Any, name: str, default: Any = None) -> Any:
    value = src.get(name, default) if isinstance(src, dict) else getattr(src, name, default)
    return default if value is None else value


def get_int(src: Any, name: str, default: Any = None, field: str | None = None) -> Any:
    """``src.name`` as an int (``default`` when absent); anything else raises naming it."""
    value = get(src, name, default)
    return None if value is None else as_int(value, field or label(name))


def get_size(src: Any, name: str, default: int = 1) -> int:
    """A parallel size: an integer >= 1."""
    return as_int(get(src, name, default), label(name), minimum=1)


def get_flag(src: Any, name: str, default: bool = False) -> bool:
    return as_bool(get(src, name, default), name)


def get_float(src: Any, name: str, default: float, low: float, high: float | None = None) -> float:
    field = f"model.{name}" if name.endswith("dropout") else name
    return as_float(get(src, name, default), field, low, high)


def get_name(src: Any, name: str, default: str) -> str:
    return as_str(get(src, name, default), name)


def get_choice(args: Any, name: str, default: str, choices: tuple[str, ...]) -> str:
    value = get_name(args, name, default)
    if value not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(choices)}")
    return value


def get_int_tuple(args: Any, name: str) -> tuple[int, ...] | None:
    value = get(args, name)
    return None if value is None else tuple(as_int_list(value, name))


def warn_all(messages: list[str]) -> None:
    for message in messages:
        warnings.warn(ConfigWarning(message), stacklevel=3)
