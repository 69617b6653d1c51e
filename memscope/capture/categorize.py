"""Which live storages are parameters, gradients and optimizer state (for the exact ledger)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from memscope.capture.backends.storage import StorageLedgerBackend
from memscope.events.schema import CAT_GRADIENTS, CAT_OPTIMIZER_STATE, CAT_PARAMETERS


def mark_model_state(ledger: StorageLedgerBackend, chunks: Iterable[torch.nn.Module]) -> None:
    """Parameters and buffers as ``parameters``; existing grads as ``gradients``."""
    chunks = list(chunks)
    for chunk in chunks:
        for p in chunk.parameters():
            ledger.mark(p, CAT_PARAMETERS)
        for b in chunk.buffers():
            ledger.mark(b, CAT_PARAMETERS)
    mark_grads(ledger, chunks)


def mark_grads(ledger: StorageLedgerBackend, chunks: Iterable[torch.nn.Module]) -> None:
    """``.grad`` and Megatron's ``.main_grad`` (a view into the DDP grad buffer)."""
    for chunk in chunks:
        for p in chunk.parameters():
            for g in (p.grad, getattr(p, "main_grad", None)):
                if isinstance(g, torch.Tensor):
                    ledger.mark(g, CAT_GRADIENTS)


def mark_optimizer_state(
    ledger: StorageLedgerBackend, optimizer: Any, chunks: Iterable[torch.nn.Module]
) -> None:
    """Optimizer state tensors and master copies of parameters as ``optimizer_state``."""
    model_params = {id(p) for c in chunks for p in c.parameters()}
    for opt in torch_optimizers(optimizer):
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    ledger.mark(value, CAT_OPTIMIZER_STATE)
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) not in model_params:  # fp32 master copies
                    ledger.mark(p, CAT_OPTIMIZER_STATE)


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
