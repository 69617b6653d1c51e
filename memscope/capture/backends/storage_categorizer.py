"""The ``storage`` backend's :class:`~.base.Categorizer`: storages re-labelled on request.

The category policy decides what counts as parameters, gradients, optimizer state and
activations; :class:`StorageCategorizer` applies its decisions to the ledger's entries: the
category of storages created from now on, a tensor's category (adopting a storage made before
tracking), autograd's saved tensors, run-long buffers, and windows of new storages promoted
to a category (an optimizer's state, made in its first step).
"""

from __future__ import annotations

import gc
import warnings

import torch

from memscope.capture.backends.storage_ledger import StorageLedger
from memscope.events.schema import CAT_BUFFERS, CAT_OTHER


def _is_tensor(obj: object) -> bool:
    try:
        return isinstance(obj, torch.Tensor)
    except Exception:  # objects with odd __class__ properties
        return False


class StorageCategorizer:
    """The category policy's requests, applied to a :class:`StorageLedger`."""

    def __init__(self, ledger: StorageLedger) -> None:
        self._ledger = ledger

    def set_alloc_category(self, category: int) -> None:
        """Category for storages first seen from now on."""
        self._ledger.alloc_category = category

    def mark(self, tensor: torch.Tensor, category: int) -> None:
        """Give ``tensor``'s storage a category, adopting it if it predates tracking."""
        ledger = self._ledger
        storage = ledger.storage_of(tensor)
        if storage is None:
            return
        with ledger.lock:
            entry = ledger.entry(storage)
            if entry is None:
                ledger.add(storage, category, tensor)
            elif entry.category != category:
                ledger.recategorise(entry, category)

    def mark_run_long(self, tensor: torch.Tensor, owner: str) -> None:
        """``tensor``'s storage is run-long scratch held by ``owner`` (Megatron's global memory
        buffer): category ``buffers``, created by that owner rather than by the module and
        microbatch that first asked for it."""
        ledger = self._ledger
        storage = ledger.storage_of(tensor)
        if storage is None:
            return
        with ledger.lock:
            composition = ledger.composition
            context = ledger.contexts.context_id(("", owner, None, None))
            composition.keep_peak()
            entry = ledger.entry(storage)
            if entry is None:
                ledger.add(storage, CAT_BUFFERS, tensor)
                entry = ledger.entry(storage)
                assert entry is not None
            elif entry.category == CAT_BUFFERS and entry.context == context:
                return
            else:
                ledger.recategorise(entry, CAT_BUFFERS)
            composition.count(entry.category, entry.context, -entry.nbytes, entry.saved)
            composition.count(entry.category, context, entry.nbytes, entry.saved)
            entry.context = context

    def mark_saved(self, tensor: torch.Tensor) -> None:
        """``tensor`` was saved by autograd for backward: its storage is a saved activation
        (not a temporary) from now on. Runs inside autograd's pack hook: never raises (an
        internal error stops accounting and is reported, as for any op)."""
        ledger = self._ledger
        if not ledger.active:
            return
        try:
            storage = ledger.storage_of(tensor)
            if storage is None:
                return
            with ledger.lock:
                entry = ledger.entry(storage)
                if entry is None or entry.saved:
                    return
                ledger.composition.keep_peak()
                ledger.composition.count(entry.category, entry.context, -entry.nbytes, False)
                ledger.composition.count(entry.category, entry.context, entry.nbytes, True)
                entry.saved = True
        except Exception as exc:
            ledger.fail(exc)

    def adopt_existing(self, category: int = CAT_OTHER) -> int:
        """Adopt every live tensor Python can reach (allocations made before ``start``)."""
        ledger = self._ledger
        adopted = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance() pokes deprecated module attributes
            objects = [o for o in gc.get_objects() if _is_tensor(o)]
        for obj in objects:
            storage = ledger.storage_of(obj)
            if storage is not None:
                with ledger.lock:
                    if ledger.entry(storage) is not None:
                        continue
                    ledger.add(storage, category, obj)
                adopted += 1
        return adopted

    def open_window(self) -> None:
        """Remember storages created from now on (see :meth:`promote_window`)."""
        self._ledger.window_keys = []

    def promote_window(self, category: int, only_from: int = CAT_OTHER) -> int:
        """Re-categorise storages created since :meth:`open_window` that are still alive."""
        ledger = self._ledger
        keys, ledger.window_keys = ledger.window_keys or [], None
        moved = 0
        with ledger.lock:
            for key in keys:
                entry = ledger.entry_by_key(key)
                if entry is not None and entry.category == only_from:
                    ledger.recategorise(entry, category)
                    moved += entry.nbytes
        return moved
