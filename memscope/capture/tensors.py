"""What a hook records about a tensor (shape, dtype, bytes), as torch-free event data."""

from __future__ import annotations

from typing import Any

import torch

from memscope.events.schema import TensorInfo

_DTYPE_NAMES: dict[torch.dtype, str] = {}


def tensor_info(tensor: torch.Tensor, name: str = "") -> TensorInfo:
    """Shape, dtype name and storage-visible byte size of ``tensor``."""
    dtype = tensor.dtype
    dtype_name = _DTYPE_NAMES.get(dtype)
    if dtype_name is None:
        dtype_name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return TensorInfo(tuple(tensor.shape), dtype_name, tensor.numel() * tensor.element_size(), name)


def tensors_in(value: Any, limit: int = 16) -> list[torch.Tensor]:
    """Tensors in ``value`` and one level of tuple/list/dict inside it (at most ``limit``)."""
    if isinstance(value, torch.Tensor):
        return [value]
    items: Any = ()
    if isinstance(value, (tuple, list)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    out = [v for v in items if isinstance(v, torch.Tensor)]
    return out[:limit]
