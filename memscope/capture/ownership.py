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
* run-long scratch: Megatron's global memory buffer (``parallel_state._GLOBAL_MEMORY_BUFFER``)
  and Megatron-FSDP's (:func:`run_long_buffers`).

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

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from memscope.events.ownership import OwnedRange, OwnerCategory, OwnershipIndex


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
    """Every optimizer object in ``optimizer`` (a list of them, Megatron's chain and wrappers
    unwrapped)."""
    if optimizer is None:
        return
    if isinstance(optimizer, (list, tuple)):
        for one in optimizer:
            yield from _torch_optimizers(one)
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
        self.index = OwnershipIndex()
        self.generation = 0
        self.rebuild()

    # -- building --------------------------------------------------------------------------
    def rebuild(self) -> None:
        """Walk the model and optimizer again and replace every range."""
        ranges: list[OwnedRange] = []

        def add(tensor: Any, owner: str, category: OwnerCategory, container: bool = False) -> None:
            if not isinstance(tensor, torch.Tensor):
                return
            span = _span(tensor)
            if span is None:
                return
            ranges.append(OwnedRange(span[0], span[1], owner, category, container))

        names: dict[int, str] = {}
        model_storages: set[int] = set()  # storages holding model parameters
        for index, chunk in enumerate(self._chunks):
            prefix = f"chunk{index}." if len(self._chunks) > 1 else ""
            model = _unwrap(chunk)
            for name, param in model.named_parameters():
                names.setdefault(id(param), prefix + name)
                model_storages.add(param.untyped_storage().data_ptr())
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
            if isinstance(opt, torch.optim.Optimizer):  # params it steps that the model lacks:
                for g, group in enumerate(opt.param_groups):  # fp32 main copies or shards
                    for k, param in enumerate(group["params"]):
                        own_storage = param.untyped_storage().data_ptr() not in model_storages
                        if id(param) not in names and id(param) not in main_names and own_storage:
                            main_names[id(param)] = f"group{g}[{k}]"
                            add(param, f"main_params:group{g}[{k}]", OwnerCategory.MAIN_PARAMS)
            state = getattr(opt, "state", None)
            if isinstance(opt, torch.optim.Optimizer) and state:
                for param, entries in state.items():
                    owner = names.get(id(param)) or main_names.get(id(param)) or "optimizer"
                    for key, value in entries.items():
                        add(value, f"{owner}:{key}", OwnerCategory.OPTIMIZER_STATE)
        for owner, tensor in run_long_buffers():
            add(tensor, owner, OwnerCategory.BUFFERS)
        self.index = OwnershipIndex(ranges)  # the first owner of a shared tensor keeps it
        self.generation += 1

    def refresh(self) -> bool:
        """Walk the model and optimizer again; say whether any range changed (a buffer was
        re-allocated, the optimizer's state appeared at its first step). No tensor is held
        between calls, so the registry never keeps memory alive."""
        before = self.index.ranges
        self.rebuild()
        return self.index.ranges != before

    # -- queries (see :class:`.OwnershipIndex`) ---------------------------------------------
    @property
    def ranges(self) -> tuple[OwnedRange, ...]:
        return self.index.ranges

    def owner_at(self, address: int) -> OwnedRange | None:
        return self.index.owner_at(address)

    def attribute(self, start: int, size: int) -> list[tuple[OwnedRange | None, int]]:
        return self.index.attribute(start, size)

    def totals(self) -> dict[str, int]:
        return self.index.totals()


#: Where run-long scratch singletons live: (module, attribute, owner name prefix). Each is a
#: ``GlobalMemoryBuffer``: a dict ``buffer`` keyed by (name, dtype) whose tensors
#: ``get_tensor`` grows to the largest request and never frees.
RUN_LONG_SINGLETONS = (
    # megatron/core/parallel_state.py (the class: megatron/core/utils.py): the local
    # attention's score buffer, the sequence-parallel all-gathers, MoE's allgather dispatcher
    ("megatron.core.parallel_state", "_GLOBAL_MEMORY_BUFFER", "global_memory_buffer"),
    # Megatron-FSDP's own copy (megatron_fsdp/utils.py get_global_memory_buffer), in-tree
    # and as the standalone package
    (
        "megatron.core.distributed.fsdp.src.megatron_fsdp.utils",
        "_GLOBAL_MEMORY_BUFFER",
        "megatron_fsdp.global_memory_buffer",
    ),
    ("megatron_fsdp.utils", "_GLOBAL_MEMORY_BUFFER", "megatron_fsdp.global_memory_buffer"),
)


def run_long_buffers() -> list[tuple[str, torch.Tensor]]:
    """Run-long scratch MemScope can see, as (owner name, tensor): the tensors of the
    :data:`RUN_LONG_SINGLETONS` that exist in this process, which live for the whole run
    whichever module first asked for them. Named ``<prefix>[name, dtype]``, e.g.
    ``global_memory_buffer[mpu, float32]``. Looked up in ``sys.modules``: nothing is
    imported."""
    import sys

    out = []
    for module, attribute, prefix in RUN_LONG_SINGLETONS:
        found = sys.modules.get(module)
        buffer = getattr(found, attribute, None) if found else None
        tensors = getattr(buffer, "buffer", None)
        for key, tensor in (tensors if isinstance(tensors, dict) else {}).items():
            if isinstance(tensor, torch.Tensor):
                parts = key if isinstance(key, tuple) else (key,)
                label = ", ".join(str(p).removeprefix("torch.") for p in parts)
                out.append((f"{prefix}[{label}]", tensor))
    return out
