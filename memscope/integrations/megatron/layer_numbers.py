"""Megatron's global layer numbers of a rank's transformer layers, by the names events use.

megatron-core gives every ``TransformerLayer`` a 1-based ``layer_number`` that already adds
the stage's offset (``get_transformer_layer_offset`` in
``megatron/core/transformer/transformer_layer.py``: uneven first/last stages, pipeline layouts
and virtual chunks included), so reading it back is exact where recomputing the offset from
the parallel settings would duplicate Megatron's rules.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memscope.capture.hooks import module_path


def global_layer_numbers(chunks: Sequence[torch.nn.Module]) -> dict[str, int]:
    """``{event module name of a layer: its global layer_number}`` for every module at
    ``*.layers.<i>`` carrying an integer ``layer_number`` (transformer and MTP layers)."""
    numbers: dict[str, int] = {}
    for chunk_index, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            parent, _, index = name.rpartition(".")
            number = getattr(module, "layer_number", None)
            if not index.isdigit() or not parent.endswith("layers"):
                continue
            if isinstance(number, int) and not isinstance(number, bool):
                numbers[module_path(chunk_index, name, len(chunks))] = number
    return numbers
