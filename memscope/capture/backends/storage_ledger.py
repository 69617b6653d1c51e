"""The bookkeeping of the ``storage`` backend: one entry per live tensor storage.

Each storage an op creates is added with a category and its creation context; a weak
reference callback removes it at the moment the storage is really freed (PyTorch keeps one
Python object per live storage, so the callback fires when the last view, autograd saved
tensor or optimizer reference drops it). The running sum is therefore exact for every
storage that is an op output, and the high-water mark is a true running peak.
Re-labelling storages on the category policy's request is :mod:`.storage_categorizer`'s job.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from memscope.capture.backends.base import MemorySample
from memscope.capture.backends.storage_composition import (
    NO_CONTEXT,
    CreationContexts,
    LiveComposition,
    group_survivors,
)
from memscope.capture.backends.storage_history import AllocationHistoryLog, allocator_snapshot
from memscope.capture.python_stack import caller_frames
from memscope.events.schema import (
    CAT_ACTIVATIONS,
    CAT_OTHER,
    CATEGORIES,
    PeakContext,
    Survivor,
)

# What a step should not keep: model state (parameters, gradients, optimizer) is meant to.
_TRANSIENT = frozenset({CAT_ACTIVATIONS, CAT_OTHER})


class LedgerEntry(weakref.ref):
    """A weak reference to a live storage, its size, category and the context (an index
    into :class:`CreationContexts`) it was created in."""

    __slots__ = (
        "addr",
        "born",
        "category",
        "context",
        "desc",
        "key",
        "last_use",
        "nbytes",
        "saved",
        "stack",
    )
    key: int
    nbytes: int
    category: int
    context: int
    addr: int
    saved: bool  # autograd saved it for backward (else a temporary, as far as seen)
    born: int  # the training step it was created in (-1: before the first)
    last_use: int  # when an op last read it (the history's stamp; 0: not seen), with history on
    stack: int  # the Python frames that created it (CreationContexts.stacks; 0: none)
    desc: int  # the shape and dtype of the tensor that created it (CreationContexts.descs)

    def __new__(
        cls, storage: Any, callback: Any, key: int, nbytes: int, category: int, context: int
    ) -> LedgerEntry:
        self = super().__new__(cls, storage, callback)
        self.key, self.nbytes, self.category, self.context = key, nbytes, category, context
        self.addr = 0
        self.saved = False
        self.born = -1
        self.last_use = 0
        self.stack = 0
        self.desc = 0
        return self

    def __init__(
        self, storage: Any, callback: Any, key: int, nbytes: int, category: int, context: int
    ) -> None:
        # weakref.ref.__init__ accepts only (object, callback).
        super().__init__(storage, callback)  # type: ignore[call-arg]


class CapacityExceeded(Exception):
    """An allocation beyond the ledger's capacity (raised as ``torch.OutOfMemoryError``, with
    the wording of the CUDA allocator's message so that the same parsing reads both)."""

    def __init__(self, requested: int, capacity: int, allocated: int) -> None:
        self.requested, self.capacity, self.allocated = requested, capacity, allocated
        super().__init__(
            f"Tried to allocate {requested} bytes. MemScope's storage ledger has a capacity "
            f"of {capacity} bytes ({capacity / 2**20:.2f} MiB, --memscope-storage-capacity-mib) "
            f"of which {capacity - allocated} bytes is free. Of the allocated memory "
            f"{allocated} bytes is allocated by PyTorch."
        )


def _tensor_args(args: Any, kwargs: Any) -> Iterator[torch.Tensor]:
    """The tensors among an op's arguments (and in lists of them, as ``cat`` takes)."""
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item


class StorageLedger:
    """Live storages with per-category totals, a true running peak and its context."""

    def __init__(self, device_type: str, capacity_bytes: int = 0) -> None:
        self.device_type = device_type
        #: Live bytes beyond which an allocation fails as on a device that size (0: none).
        self.capacity_bytes = capacity_bytes
        self.active = False
        #: Category given to storages first seen from now on (set by the categorizer).
        self.alloc_category = CAT_OTHER
        #: Why accounting stopped part-way (the first internal error), if it did.
        self.error: str | None = None
        self.contexts = CreationContexts()
        self.composition = LiveComposition(self.contexts)
        #: The allocation log, while one is recorded (:meth:`start_history`).
        self.history: AllocationHistoryLog | None = None
        self._record_stacks = False
        self.context: PeakContext | None = None
        self._context_id = 0
        self._step = -1  # of the current context: every storage remembers its birth step
        self.lock = threading.RLock()
        self._live: dict[int, LedgerEntry] = {}  # id(storage) -> entry
        self._on_device = "is_cuda" if device_type == "cuda" else "is_cpu"
        self.totals = [0] * len(CATEGORIES)
        self.current = 0
        self.peak = 0
        self._phase_peak = 0  # since the last mark_phase()
        self.peak_context: PeakContext | None = None
        self.peak_categories: tuple[int, ...] = tuple(self.totals)
        #: Keys of the storages created since the categorizer opened a window.
        self.window_keys: list[int] | None = None
        self.storages_seen = 0

    def set_context(self, ctx: PeakContext | None) -> None:
        """Where training is now; storages created from now on carry it."""
        self.context = ctx
        if ctx is not None:
            self._step = ctx.step
        key = (
            NO_CONTEXT
            if ctx is None
            else (ctx.phase, ctx.module, ctx.microbatch, ctx.virtual_chunk)
        )
        self._context_id = self.contexts.context_id(key)

    def fail(self, exc: BaseException) -> None:
        """Stop accounting after an internal error; the first reason is kept for the report."""
        self.active = False
        if self.error is None:
            self.error = f"{type(exc).__name__}: {exc}"

    # -- what ops do -----------------------------------------------------------------------
    def observe(self, out: Any, resized: bool = False) -> None:
        """Account the tensors an op returned (a tensor or a flat tuple/list of them)."""
        if isinstance(out, torch.Tensor):
            self._track(out, self.alloc_category, resized)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor):
                    self._track(item, self.alloc_category, resized)

    def note_uses(self, args: Any, kwargs: Any) -> None:
        """The storages an op read are in use now (kept while the history is recorded); the
        time is the history's own stamp, so it orders exactly against its events."""
        history = self.history
        if history is None:
            return
        now = history.stamp()
        live = self._live
        for tensor in _tensor_args(args, kwargs):
            storage = self.storage_of(tensor)
            if storage is not None:
                entry = live.get(id(storage))
                if entry is not None:
                    entry.last_use = now

    def storage_of(self, tensor: torch.Tensor) -> torch.UntypedStorage | None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return None  # sparse, nested, meta-like or subclass without storage
        if storage.device.type != self.device_type:
            return None
        return storage

    def entry(self, storage: torch.UntypedStorage) -> LedgerEntry | None:
        """The entry of a live ``storage`` (``None``: not tracked); call under :attr:`lock`."""
        return self._live.get(id(storage))

    def entry_by_key(self, key: int) -> LedgerEntry | None:
        """The entry of the live storage whose ``id`` is ``key``; call under :attr:`lock`."""
        return self._live.get(key)

    def _track(self, tensor: torch.Tensor, category: int, resized: bool) -> None:
        if not getattr(tensor, self._on_device):
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return  # sparse, nested, meta-like or subclass without storage
        with self.lock:
            entry = self._live.get(id(storage))
            if entry is None:
                self._check_capacity(storage.nbytes())  # only an op's new output can fail
                self.add(storage, category, tensor)
            elif resized:
                self._resize(entry, storage)

    def _resize(self, entry: LedgerEntry, storage: torch.UntypedStorage) -> None:
        diff = storage.nbytes() - entry.nbytes
        if diff > 0:
            self._check_capacity(diff)
        if not diff:
            return
        if diff < 0:
            self.composition.keep_peak()
        history = self.history
        if history is not None:  # the allocator would free and allocate
            history.free(entry)
            entry.addr = storage.data_ptr()
        entry.nbytes += diff
        self.totals[entry.category] += diff
        self.composition.count(entry.category, entry.context, diff, entry.saved)
        self.current += diff
        if history is not None:
            history.alloc(entry)
        self._note_peak()

    def _check_capacity(self, nbytes: int) -> None:
        if self.capacity_bytes and self.current + nbytes > self.capacity_bytes:
            self.composition.keep_failure()  # before anything unwinds
            raise CapacityExceeded(nbytes, self.capacity_bytes, self.current)

    def add(
        self, storage: torch.UntypedStorage, category: int, tensor: torch.Tensor | None = None
    ) -> None:
        """Track ``storage`` (made by ``tensor``) from now on; call under :attr:`lock`."""
        nbytes = storage.nbytes()
        key = id(storage)
        context = self._context_id
        entry = self._live[key] = LedgerEntry(
            storage, self._release, key, nbytes, category, context
        )
        entry.born = self._step
        if tensor is not None:
            entry.desc = self.contexts.desc_id(tensor.shape, tensor.dtype)
        if self._record_stacks:
            entry.stack = self.contexts.stack_id(caller_frames())
        self.storages_seen += 1
        if self.history is not None:
            entry.addr = storage.data_ptr()
            self.history.alloc(entry)
        if self.window_keys is not None:
            self.window_keys.append(key)
        self.totals[category] += nbytes
        self.composition.count(category, context, nbytes)
        self.current += nbytes
        self._note_peak()

    def recategorise(self, entry: LedgerEntry, category: int) -> None:
        """Move ``entry``'s bytes to ``category``; call under :attr:`lock`."""
        self.composition.keep_peak()
        self.totals[entry.category] -= entry.nbytes
        self.totals[category] += entry.nbytes
        self.composition.count(entry.category, entry.context, -entry.nbytes, entry.saved)
        self.composition.count(category, entry.context, entry.nbytes, entry.saved)
        entry.category = category

    def _note_peak(self) -> None:
        if self.current > self._phase_peak:
            self._phase_peak = self.current
        if self.current > self.peak:
            self.peak = self.current
            self.peak_context = self.context
            self.peak_categories = tuple(self.totals)
            self.composition.peak_reached()

    def _release(self, entry: LedgerEntry) -> None:
        # Runs inside the garbage collector / refcount drop of a storage: it must never raise.
        if self.error is not None:
            return
        try:
            with self.lock:
                if self._live.get(entry.key) is entry:
                    self.composition.keep_peak()
                    if self.history is not None:
                        self.history.free(entry)
                    del self._live[entry.key]
                    self.totals[entry.category] -= entry.nbytes
                    self.composition.count(
                        entry.category, entry.context, -entry.nbytes, entry.saved
                    )
                    self.current -= entry.nbytes
        except Exception as exc:
            self.fail(exc)

    # -- readings --------------------------------------------------------------------------
    def sample(self, detailed: bool = False) -> MemorySample:
        with self.lock:
            current, peak, totals = self.current, self.peak, tuple(self.totals)
            phase_peak = max(self._phase_peak, current)
        extras = {"live_storages": len(self._live)} if detailed else None
        return MemorySample(current, current, peak, peak, totals, extras, phase_peak)

    def mark_phase(self) -> None:
        with self.lock:
            self._phase_peak = self.current

    def reset_peak(self) -> None:
        with self.lock:
            self.peak = self.current
            self.peak_context = self.context
            self.peak_categories = tuple(self.totals)
            self.composition.peak_reached()

    def survivors(self, born_from: int, born_until: int) -> tuple[Survivor, ...]:
        """Live activations and other storages born in steps ``born_from..born_until``."""
        with self.lock:
            rows = [
                (e.context, e.born, e.nbytes, e.stack, e.desc)
                for e in self._live.values()
                if born_from <= e.born <= born_until and e.category in _TRANSIENT
            ]
        return group_survivors(rows, self.contexts)

    # -- allocation history ----------------------------------------------------------------
    def start_history(self, max_entries: int, stacks: bool = False) -> None:
        """Log every allocation and free from now on (the last ``max_entries`` kept); with
        ``stacks``, each storage created from now on also remembers its Python frames."""
        with self.lock:
            self.history = AllocationHistoryLog(max_entries, self.contexts)
            self._record_stacks = stacks
            for entry in self._live.values():  # live now: known by address for the frees
                storage = entry()
                if storage is not None:
                    entry.addr = storage.data_ptr()

    def stop_history(self) -> None:
        with self.lock:
            self.history = None
            self._record_stacks = False

    def history_snapshot(self) -> dict[str, Any]:
        """The history and the live storages as a CUDA allocator snapshot would hold them."""
        with self.lock:
            trace = [dict(e) for e in (self.history.entries if self.history else ())]
            live = [
                (e.addr, e.nbytes, e.category, e.context, e.last_use, e.stack)
                for e in self._live.values()
            ]
        return allocator_snapshot(trace, live, self.contexts)
