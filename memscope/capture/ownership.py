"""Who owns a device address: the ownership registry of a training process.

Filled from the objects training really uses, so that any allocation (an allocator block, a
storage) can be split into owners and categories:

* the model's parameters and buffers (named as ``named_parameters`` names them; routed
  experts keep their ``.experts.`` path), and their gradients (``.grad``, Megatron's
  ``.main_grad``);
* Megatron DDP's contiguous buffers (``_ParamAndGradBuffer.param_data`` / ``grad_data`` of
  ``buffers`` and ``expert_parallel_buffers``): each parameter's view is owned by the
  parameter, the rest of the buffer (bucket padding) by the buffer;
* the optimizer: fp32 main parameters (Megatron's ``fp32_from_float16_groups`` and the
  distributed optimizer's ``shard_fp32_from_float16_groups``, named after their model
  parameter) and ``optimizer.state`` of every torch optimizer inside (``ChainedOptimizer``
  and Megatron's wrappers unwrapped);
* Megatron's global memory buffer (``parallel_state._GLOBAL_MEMORY_BUFFER``).

Plain torch modules and optimizers work the same way. Owned ranges are either disjoint
(tensors of their own) or a tensor's view inside a container (a DDP buffer): an address is
owned by the narrowest range holding it. :meth:`OwnershipRegistry.refresh` rebuilds the
ranges when a registered tensor has moved (the optimizer's state appears at its first step,
buffers are re-allocated).

Known limitations: tensors that live only inside the optimizer step or in
framework-private caches are not registered (they stay unattributed); ranges are taken from
untyped storages, so a view registers its whole storage only when it is the storage's sole
owner.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


class OwnerCategory(str, enum.Enum):
    """What an owned range is."""

    PARAMETERS = "parameters"
    MAIN_PARAMS = "main_params"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    BUFFERS = "buffers"  # module buffers, Megatron's global memory buffer


@dataclass(frozen=True, slots=True)
class OwnedRange:
    """Bytes ``[start, end)`` of device memory and who holds them."""

    start: int
    end: int
    owner: str
    category: OwnerCategory

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _span(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The byte range of ``tensor``'s own elements (a view: its part of the storage)."""
    if tensor.numel() == 0 or tensor.device.type == "meta":
        return None
    start = tensor.data_ptr()
    if tensor.is_contiguous():
        return start, start + tensor.numel() * tensor.element_size()
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model under Megatron's DDP / Float16Module (and torch DDP) wrappers."""
    while hasattr(module, "module") and isinstance(module.module, torch.nn.Module):
        module = module.module
    return module


def _torch_optimizers(optimizer: Any) -> Iterator[Any]:
    """Every optimizer object in ``optimizer`` (Megatron's chain and wrappers unwrapped)."""
    if optimizer is None:
        return
    yield optimizer
    for inner in getattr(optimizer, "chained_optimizers", None) or ():
        yield from _torch_optimizers(inner)
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and inner is not optimizer:
        yield from _torch_optimizers(inner)


class OwnershipRegistry:
    """Address ranges -> owner and category, for the model chunks and optimizer given."""

    def __init__(self, chunks: Iterable[torch.nn.Module] = (), optimizer: Any = None) -> None:
        self._chunks = list(chunks)
        self._optimizer = optimizer
        self._leaves: list[OwnedRange] = []  # disjoint, sorted by start
        self._starts: list[int] = []
        self._containers: list[OwnedRange] = []  # ranges that hold leaves (DDP buffers)
        self._tensors: list[tuple[torch.Tensor, int]] = []  # registered tensor, its data_ptr
        self.generation = 0
        self.rebuild()

    # -- building --------------------------------------------------------------------------
    def rebuild(self) -> None:
        """Walk the model and optimizer again and replace every range."""
        leaves: dict[tuple[int, int], OwnedRange] = {}
        containers: list[OwnedRange] = []
        tensors: list[tuple[torch.Tensor, int]] = []

        def add(tensor: Any, owner: str, category: OwnerCategory, container: bool = False) -> None:
            if not isinstance(tensor, torch.Tensor):
                return
            span = _span(tensor)
            if span is None:
                return
            tensors.append((tensor, tensor.data_ptr()))
            entry = OwnedRange(span[0], span[1], owner, category)
            if container:
                containers.append(entry)
            else:
                leaves.setdefault(span, entry)  # the first owner of a shared tensor keeps it

        names: dict[int, str] = {}
        for index, chunk in enumerate(self._chunks):
            prefix = f"chunk{index}." if len(self._chunks) > 1 else ""
            model = _unwrap(chunk)
            for name, param in model.named_parameters():
                names.setdefault(id(param), prefix + name)
                add(param, prefix + name, OwnerCategory.PARAMETERS)
                for attr in ("main_grad", "grad"):
                    add(getattr(param, attr, None), prefix + name, OwnerCategory.GRADIENTS)
            for name, buf in model.named_buffers():
                add(buf, prefix + name, OwnerCategory.BUFFERS)
            for kind in ("buffers", "expert_parallel_buffers"):
                found = getattr(chunk, kind, None)  # a list on Megatron's DDP (not the method)
                for j, buffer in enumerate(found if isinstance(found, (list, tuple)) else ()):
                    tag = f"{prefix}ddp.{kind}[{j}]"
                    add(getattr(buffer, "param_data", None), f"{tag}.param_data",
                        OwnerCategory.PARAMETERS, container=True)  # fmt: skip
                    add(getattr(buffer, "grad_data", None), f"{tag}.grad_data",
                        OwnerCategory.GRADIENTS, container=True)  # fmt: skip
        main_names: dict[int, str] = {}  # fp32 main parameter -> its model parameter's name
        for opt in _torch_optimizers(self._optimizer):
            for model_attr, main_attr in (
                ("float16_groups", "fp32_from_float16_groups"),
                ("model_float16_groups", "shard_fp32_from_float16_groups"),
            ):
                model_groups = getattr(opt, model_attr, None) or ()
                main_groups = getattr(opt, main_attr, None) or ()
                for g, group in enumerate(main_groups):
                    models = model_groups[g] if g < len(model_groups) else ()
                    for k, main in enumerate(group):
                        known = names.get(id(models[k])) if k < len(models) else None
                        main_names[id(main)] = known or f"group{g}[{k}]"
                        add(main, f"main_params:{main_names[id(main)]}",
                            OwnerCategory.MAIN_PARAMS)  # fmt: skip
            state = getattr(opt, "state", None)
            if isinstance(opt, torch.optim.Optimizer) and state:
                for param, entries in state.items():
                    owner = names.get(id(param)) or main_names.get(id(param)) or "optimizer"
                    for key, value in entries.items():
                        add(value, f"{owner}:{key}", OwnerCategory.OPTIMIZER_STATE)
        for key, tensor in _global_memory_buffers():
            add(tensor, f"global_memory_buffer[{key}]", OwnerCategory.BUFFERS)
        self._leaves = sorted(leaves.values(), key=lambda r: r.start)
        self._starts = [r.start for r in self._leaves]
        self._containers = containers
        self._tensors = tensors
        self.generation += 1

    def refresh(self) -> bool:
        """Rebuild when a registered tensor moved or the optimizer gained state; say so."""
        moved = any(t.data_ptr() != ptr for t, ptr in self._tensors)
        states = sum(
            len(opt.state) for opt in _torch_optimizers(self._optimizer)
            if isinstance(opt, torch.optim.Optimizer)
        )  # fmt: skip
        known = sum(1 for r in self._leaves if r.category is OwnerCategory.OPTIMIZER_STATE)
        if moved or (states and not known):
            self.rebuild()
            return True
        return False

    # -- queries ---------------------------------------------------------------------------
    @property
    def ranges(self) -> tuple[OwnedRange, ...]:
        """Every range: the leaves, then the containers."""
        return (*self._leaves, *self._containers)

    def owner_at(self, address: int) -> OwnedRange | None:
        """The narrowest range holding ``address``, if any."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and self._leaves[i].start <= address < self._leaves[i].end:
            return self._leaves[i]
        holding = [c for c in self._containers if c.start <= address < c.end]
        return min(holding, key=lambda c: c.nbytes) if holding else None

    def attribute(self, start: int, size: int) -> list[tuple[OwnedRange | None, int]]:
        """Split ``[start, start + size)`` into (owning range or None, bytes), leaves first,
        then what containers hold beyond their leaves, then the unowned rest."""
        end = start + size
        out: list[tuple[OwnedRange | None, int]] = []
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        covered: list[tuple[int, int]] = []
        while i < len(self._leaves) and self._leaves[i].start < end:
            leaf = self._leaves[i]
            lo, hi = max(leaf.start, start), min(leaf.end, end)
            if hi > lo:
                out.append((leaf, hi - lo))
                covered.append((lo, hi))
            i += 1
        for container in sorted(self._containers, key=lambda c: c.nbytes):
            lo, hi = max(container.start, start), min(container.end, end)
            if hi <= lo:
                continue
            free = (hi - lo) - sum(max(0, min(b, hi) - max(a, lo)) for a, b in covered)
            if free > 0:
                out.append((container, free))
            covered.append((lo, hi))
        owned = sum(n for _, n in out)
        if size - owned > 0:
            out.append((None, size - owned))
        return out

    def totals(self) -> dict[str, int]:
        """Registered bytes per category (containers count only beyond their leaves)."""
        out = {c.value: 0 for c in OwnerCategory}
        for leaf in self._leaves:
            out[leaf.category.value] += leaf.nbytes
        for container in self._containers:
            for owner, n in self.attribute(container.start, container.nbytes):
                if owner is container:
                    out[container.category.value] += n
        return out


def _global_memory_buffers() -> list[tuple[str, torch.Tensor]]:
    """Megatron's global memory buffer tensors, when megatron-core is in use."""
    import sys

    state = sys.modules.get("megatron.core.parallel_state")
    buffer = getattr(state, "_GLOBAL_MEMORY_BUFFER", None) if state else None
    tensors = getattr(buffer, "buffer", None) or {}
    return [(str(key), t) for key, t in tensors.items() if isinstance(t, torch.Tensor)]
