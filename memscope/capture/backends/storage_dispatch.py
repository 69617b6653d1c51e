"""How the ``storage`` backend sees every op: a dispatch mode that reports op outputs.

Every aten op runs under :class:`LedgerDispatchMode`, which forwards it unchanged and hands
its outputs to the :class:`~.storage_ledger.StorageLedger`. An op that cannot create a
storage (all its returns alias an input) is skipped after one dict lookup.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memscope.capture.backends.storage_ledger import CapacityExceeded, StorageLedger

_aten = torch.ops.aten
_RESIZE_OPS = frozenset(
    op
    for op in (
        getattr(_aten.resize_, "default", None),
        getattr(_aten.resize_as_, "default", None),
        getattr(_aten.set_, "source_Storage", None),
        getattr(_aten.set_, "source_Storage_storage_offset", None),
        getattr(_aten.set_, "source_Tensor", None),
    )
    if op is not None
)

_SKIP, _NEW_OUTPUTS, _RESIZE = 0, 1, 2


def _classify(func: Any) -> int:
    """What an op can do to storages: resize one, create new ones, or neither.

    An op all of whose returns alias an input (views, in-place and ``out=`` ops, ops with no
    tensor return) cannot create a storage, so the ledger skips it after one dict lookup.
    """
    if func in _RESIZE_OPS:
        return _RESIZE
    try:
        returns = func._schema.returns
    except AttributeError:
        return _NEW_OUTPUTS
    return _SKIP if all(r.alias_info is not None for r in returns) else _NEW_OUTPUTS


class LedgerDispatchMode(TorchDispatchMode):
    """Forwards every op unchanged and reports its outputs to the ledger."""

    def __init__(self, ledger: StorageLedger) -> None:
        super().__init__()
        self._ledger = ledger
        self._kinds: dict[Any, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ledger = self._ledger
        if ledger.active:
            try:  # never let accounting break an op
                kind = self._kinds.get(func)
                if kind is None:
                    kind = self._kinds[func] = _classify(func)
                if kind:
                    ledger.observe(out, kind == _RESIZE)
                if ledger.history is not None:  # deep mode: when each storage was last read
                    ledger.note_uses(args, kwargs)
            except CapacityExceeded as full:  # asked for: fail as the device would
                raise torch.OutOfMemoryError(f"{full} Failing op: {func}.") from None
            except Exception as exc:
                ledger.fail(exc)
        return out
