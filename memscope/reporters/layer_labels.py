"""Global layer numbers next to stage-local module names.

Under pipeline parallelism each stage numbers its transformer layers from 0
(``decoder.layers.1`` on stage 1 of a 4-layer PP=2 model is the model's third layer). Megatron
gives every ``TransformerLayer`` its global 1-based ``layer_number`` (stage offset included, for
uneven first/last stages and virtual chunks alike), and the Megatron adapter records it per
layer path in the report's ``metadata.layer_numbers``. Reporters label a module inside such a
layer as ``decoder.layers.1.mlp (layer 3)`` through :func:`label_modules`, the one rule both
the Markdown and the HTML page use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

#: The report sections never relabelled (raw events: large, and read by tools, not people).
RAW_SECTIONS = frozenset({"runtime_trace"})


def layer_labeler(layer_numbers: Mapping[str, int] | None) -> Callable[[str], str]:
    """``name -> name (layer N)`` for names inside a recorded layer; others unchanged."""
    numbers = dict(layer_numbers or {})
    cache: dict[str, str] = {}

    def label(name: str) -> str:
        if not numbers:
            return name
        found = cache.get(name)
        if found is None:
            found = name
            parts = name.split(".")
            for end in range(len(parts), 0, -1):  # the innermost layer holding the module
                number = numbers.get(".".join(parts[:end]))
                if number is not None:
                    found = f"{name} (layer {number})"
                    break
            cache[name] = found
        return found

    return label


def label_modules(data: T, layer_numbers: Mapping[str, int] | None) -> T:
    """A copy of ``data`` (a report or page payload) whose ``module`` values carry global
    layer numbers: every ``"module": str`` and every ``"module": [str, ...]`` column, at any
    depth, outside :data:`RAW_SECTIONS`. ``data`` itself is left as it is."""
    if not layer_numbers:
        return data
    label = layer_labeler(layer_numbers)

    def walk(value: Any, key: str | None) -> Any:
        if key == "module":
            if isinstance(value, str) and value:
                return label(value)
            if isinstance(value, list):
                return [label(v) if isinstance(v, str) and v else v for v in value]
            return value
        if isinstance(value, dict):
            return {k: v if k in RAW_SECTIONS else walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, None) for v in value]
        return value

    relabelled: T = walk(data, None)
    return relabelled
