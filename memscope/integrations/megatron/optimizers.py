"""The torch optimizers inside Megatron's optimizer wrappers."""

from __future__ import annotations

from typing import Any

import torch


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """torch optimizers inside Megatron wrappers (``.optimizer``, ``chained_optimizers``)."""
    found: list[torch.optim.Optimizer] = []
    stack = [optimizer]
    seen: set[int] = set()
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.optim.Optimizer):
            found.append(obj)
            continue
        stack.extend(getattr(obj, "chained_optimizers", None) or [])
        stack.append(getattr(obj, "optimizer", None))
    return found
