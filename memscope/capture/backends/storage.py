"""Exact, device-agnostic accounting of live tensor storages (the ``storage`` backend).

Every aten op runs under a :class:`~torch.utils._python_dispatch.TorchDispatchMode`; each
output storage not seen before is added to a ledger with a category, and a weak reference
callback removes it at the moment the storage is really freed (PyTorch keeps one Python
object per live storage, so the callback fires when the last view, autograd saved tensor
or optimizer reference drops it). The running sum is therefore exact for every storage that
is an op output, and the high-water mark is a true running peak, not a sampled one.

Not seen: workspaces a kernel allocates and frees internally, and tensors made without an
aten op (``torch.from_numpy``). There is no caching allocator here, so ``reserved`` equals
``allocated``.
"""

from __future__ import annotations

import collections
import gc
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memscope.capture.backends.base import (
    BackendCapabilities,
    BackendOptions,
    Categorizer,
    MemoryBackend,
    MemorySample,
)
from memscope.capture.backends.registry import BackendSpec, register_backend
from memscope.capture.dispatch_stack import remove_dispatch_mode
from memscope.capture.python_stack import Frame, caller_frames, format_frame
from memscope.events.schema import (
    CAT_ACTIVATIONS,
    CAT_BUFFERS,
    CAT_OTHER,
    CATEGORIES,
    FREE_CATEGORY,
    CompositionItem,
    PeakContext,
    Survivor,
)


def register() -> None:
    """Make ``storage`` a backend choice (``auto``'s pick when no GPU is present)."""
    register_backend(
        BackendSpec(
            name="storage",
            factory=lambda options: StorageLedgerBackend(
                "cuda" if torch.cuda.is_available() else "cpu",
                capacity_bytes=(options or BackendOptions()).capacity_bytes,
            ),
            is_available=lambda: True,
            auto_priority=10,
        )
    )


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


def _is_tensor(obj: object) -> bool:
    try:
        return isinstance(obj, torch.Tensor)
    except Exception:  # objects with odd __class__ properties
        return False


_SKIP, _NEW_OUTPUTS, _RESIZE = 0, 1, 2


class _Entry(weakref.ref):
    """A ledger entry: a weak reference to a live storage, its size, category and the
    context (an index into the ledger's context table) it was created in."""

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
    last_use: int  # when an op last read it (µs since the epoch; 0: not seen), with history on
    stack: int  # the Python frames that created it (index into the ledger's stack table; 0: none)
    desc: int  # the shape and dtype of the tensor that created it (ledger's table; 0: unknown)

    def __new__(
        cls, storage: Any, callback: Any, key: int, nbytes: int, category: int, context: int
    ) -> _Entry:
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


# Composition items kept per peak: the largest, and one remainder per category beyond them.
COMPOSITION_ITEMS = 64
# Groups of long-lived storages reported per step (see StorageLedgerBackend.survivors).
SURVIVOR_ITEMS = 32
# What a step should not keep: model state (parameters, gradients, optimizer) is meant to.
_TRANSIENT = frozenset({CAT_ACTIVATIONS, CAT_OTHER})
_NO_CONTEXT = ("", "", None, None)  # phase, module, microbatch, chunk


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


class CapacityExceeded(Exception):
    """An allocation beyond the ledger's capacity (raised as ``torch.OutOfMemoryError``, with
    the wording of the CUDA allocator's message so that the same parsing reads both)."""

    def __init__(self, requested: int, capacity: int, allocated: int) -> None:
        self.requested, self.capacity, self.allocated = requested, capacity, allocated
        super().__init__(
            f"Tried to allocate {requested} bytes. MemScope's storage ledger has a capacity "
            f"of {capacity} bytes ({_mib(capacity)}, --memscope-storage-capacity-mib) of which "
            f"{capacity - allocated} bytes is free. Of the allocated memory {allocated} bytes "
            "is allocated by PyTorch."
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


def _intern(table: dict[Any, int], values: list[Any], value: Any) -> int:
    """``value``'s index in ``values`` (``table`` maps each to its index), added if new."""
    found = table.get(value)
    if found is None:
        found = table[value] = len(values)
        values.append(value)
    return found


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


class _LedgerMode(TorchDispatchMode):
    """Forwards every op unchanged and reports its outputs to the ledger."""

    def __init__(self, ledger: StorageLedgerBackend) -> None:
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
                if ledger._history is not None:  # deep mode: when each storage was last read
                    ledger.note_uses(args, kwargs)
            except CapacityExceeded as full:  # asked for: fail as the device would
                raise torch.OutOfMemoryError(f"{full} Failing op: {func}.") from None
            except Exception as exc:
                ledger.fail(exc)
        return out


class StorageLedgerBackend(MemoryBackend):
    """Live-storage ledger with per-category totals and a true running peak."""

    name = "storage"

    def __init__(self, device_type: str = "cpu", capacity_bytes: int = 0) -> None:
        self.device_type = device_type
        #: Live bytes beyond which an allocation fails as on a device that size (0: none).
        self.capacity_bytes = capacity_bytes
        self._capabilities = BackendCapabilities(
            device_type=device_type,
            exact_categories=True,
            true_peak=True,
            peak_context=True,
            can_synchronize=False,
            distinct_reserved=False,
            allocation_history=True,
        )
        self.active = False
        #: Category given to storages first seen from now on (set per phase by the policy).
        self.alloc_category = CAT_OTHER
        self._context: PeakContext | None = None
        # creation contexts (phase, module, microbatch, chunk), interned; live bytes per
        # (category, context); its copy at the window's peak, taken lazily: when the first
        # decrease after a new peak happens (or when asked), not at every new peak
        self._contexts: dict[tuple[Any, ...], int] = {_NO_CONTEXT: 0}
        self._context_list: list[tuple[Any, ...]] = [_NO_CONTEXT]
        self._context_id = 0
        self._step = -1  # of the current context: every storage remembers its birth step
        self._composition: dict[tuple[int, int, bool], int] = {}
        self._peak_composition: dict[tuple[int, int, bool], int] = {}
        self._composition_stale = False
        self._at_failure: tuple[CompositionItem, ...] | None = None
        # allocation history in the CUDA snapshot's trace format (start_history), oldest
        # entries dropped past the limit as the allocator's ring does
        self._history: collections.deque[dict[str, Any]] | None = None
        # with stacks asked for, the Python frames creating each storage, interned
        self._record_stacks = False
        self._stacks: dict[tuple[Frame, ...], int] = {(): 0}
        self._stack_list: list[tuple[Frame, ...]] = [()]
        # (shape, dtype) of the tensor that created each storage, interned
        self._descs: dict[tuple[Any, Any], int] = {(None, None): 0}
        self._desc_list: list[tuple[Any, Any]] = [(None, None)]
        self.error: str | None = None
        self._lock = threading.RLock()
        self._live: dict[int, _Entry] = {}  # id(storage) -> entry
        self._on_device = "is_cuda" if device_type == "cuda" else "is_cpu"
        self._totals = [0] * len(CATEGORIES)
        self._current = 0
        self._peak = 0
        self._phase_peak = 0  # since the last mark_phase()
        self._peak_context: PeakContext | None = None
        self._peak_categories: tuple[int, ...] = tuple(self._totals)
        self._mode: _LedgerMode | None = None
        self._window_keys: list[int] | None = None
        self.storages_seen = 0

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._capabilities

    @property
    def context(self) -> PeakContext | None:
        """Where training is now (set by the tracer); storages created from now on carry it."""
        return self._context

    @context.setter
    def context(self, ctx: PeakContext | None) -> None:
        self._context = ctx
        if ctx is not None:
            self._step = ctx.step
        key = (
            _NO_CONTEXT
            if ctx is None
            else (ctx.phase, ctx.module, ctx.microbatch, ctx.virtual_chunk)
        )
        self._context_id = self._context_key(key)

    def categorizer(self) -> Categorizer:
        return self

    def set_alloc_category(self, category: int) -> None:
        self.alloc_category = category

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._mode is not None:
            return
        self._mode = _LedgerMode(self)
        self._mode.__enter__()
        self.active = True

    def stop(self) -> None:
        """Leave the dispatch stack: exactly our mode, whatever was entered after it."""
        self.active = False
        mode, self._mode = self._mode, None
        if mode is not None:
            remove_dispatch_mode(mode)

    def fail(self, exc: BaseException) -> None:
        """Stop accounting after an internal error; the first reason is kept for the report."""
        self.active = False
        if self.error is None:
            self.error = f"{type(exc).__name__}: {exc}"

    # -- accounting ------------------------------------------------------------------------
    def observe(self, out: Any, resized: bool = False) -> None:
        """Account the tensors an op returned (a tensor or a flat tuple/list of them)."""
        if isinstance(out, torch.Tensor):
            self._track(out, self.alloc_category, resized)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor):
                    self._track(item, self.alloc_category, resized)

    def mark(self, tensor: torch.Tensor, category: int) -> None:
        """Give ``tensor``'s storage a category, adopting it if it predates tracking."""
        storage = self._storage_of(tensor)
        if storage is None:
            return
        with self._lock:
            entry = self._live.get(id(storage))
            if entry is None:
                self._add(storage, category, tensor)
            elif entry.category != category:
                self._recategorise(entry, category)

    def mark_run_long(self, tensor: torch.Tensor, owner: str) -> None:
        """``tensor``'s storage is run-long scratch held by ``owner`` (Megatron's global memory
        buffer): category ``buffers``, created by that owner rather than by the module and
        microbatch that first asked for it."""
        storage = self._storage_of(tensor)
        if storage is None:
            return
        with self._lock:
            context = self._context_key(("", owner, None, None))
            self._keep_peak_composition()
            entry = self._live.get(id(storage))
            if entry is None:
                self._add(storage, CAT_BUFFERS, tensor)
                entry = self._live[id(storage)]
            elif entry.category == CAT_BUFFERS and entry.context == context:
                return
            else:
                self._recategorise(entry, CAT_BUFFERS)
            self._count(entry.category, entry.context, -entry.nbytes, entry.saved)
            self._count(entry.category, context, entry.nbytes, entry.saved)
            entry.context = context

    def _context_key(self, key: tuple[Any, ...]) -> int:
        return _intern(self._contexts, self._context_list, key)

    def adopt_existing(self, category: int = CAT_OTHER) -> int:
        """Adopt every live tensor Python can reach (allocations made before ``start``)."""
        adopted = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance() pokes deprecated module attributes
            objects = [o for o in gc.get_objects() if _is_tensor(o)]
        for obj in objects:
            storage = self._storage_of(obj)
            if storage is not None and id(storage) not in self._live:
                with self._lock:
                    self._add(storage, category, obj)
                adopted += 1
        return adopted

    def mark_saved(self, tensor: torch.Tensor) -> None:
        """``tensor`` was saved by autograd for backward: its storage is a saved activation
        (not a temporary) from now on. Runs inside autograd's pack hook: never raises (an
        internal error stops accounting and is reported, as for any op)."""
        if not self.active:
            return
        try:
            storage = self._storage_of(tensor)
            if storage is None:
                return
            with self._lock:
                entry = self._live.get(id(storage))
                if entry is None or entry.saved:
                    return
                self._keep_peak_composition()
                self._count(entry.category, entry.context, -entry.nbytes, False)
                self._count(entry.category, entry.context, entry.nbytes, True)
                entry.saved = True
        except Exception as exc:
            self.fail(exc)

    def open_window(self) -> None:
        """Remember storages created from now on (see :meth:`promote_window`)."""
        self._window_keys = []

    def promote_window(self, category: int, only_from: int = CAT_OTHER) -> int:
        """Re-categorise storages created since :meth:`open_window` that are still alive."""
        keys, self._window_keys = self._window_keys or [], None
        moved = 0
        with self._lock:
            for key in keys:
                entry = self._live.get(key)
                if entry is not None and entry.category == only_from:
                    self._recategorise(entry, category)
                    moved += entry.nbytes
        return moved

    def _storage_of(self, tensor: torch.Tensor) -> torch.UntypedStorage | None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return None  # sparse, nested, meta-like or subclass without storage
        if storage.device.type != self.device_type:
            return None
        return storage

    def _track(self, tensor: torch.Tensor, category: int, resized: bool) -> None:
        if not getattr(tensor, self._on_device):
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return  # sparse, nested, meta-like or subclass without storage
        with self._lock:
            entry = self._live.get(id(storage))
            if entry is None:
                self._check_capacity(storage.nbytes())  # only an op's new output can fail
                self._add(storage, category, tensor)
            elif resized:
                diff = storage.nbytes() - entry.nbytes
                if diff > 0:
                    self._check_capacity(diff)
                if diff:
                    if diff < 0:
                        self._keep_peak_composition()
                    if self._history is not None:  # the allocator would free and allocate
                        self._log("free_requested", entry)
                        self._log("free_completed", entry)
                        entry.addr = storage.data_ptr()
                    entry.nbytes += diff
                    self._totals[entry.category] += diff
                    self._count(entry.category, entry.context, diff, entry.saved)
                    self._current += diff
                    if self._history is not None:
                        self._log("alloc", entry)
                    self._note_peak()

    def _check_capacity(self, nbytes: int) -> None:
        if self.capacity_bytes and self._current + nbytes > self.capacity_bytes:
            self._at_failure = self._items(self._composition)  # before anything unwinds
            raise CapacityExceeded(nbytes, self.capacity_bytes, self._current)

    def _add(
        self, storage: torch.UntypedStorage, category: int, tensor: torch.Tensor | None = None
    ) -> None:
        nbytes = storage.nbytes()
        key = id(storage)
        context = self._context_id
        entry = self._live[key] = _Entry(storage, self._release, key, nbytes, category, context)
        entry.born = self._step
        if tensor is not None:
            entry.desc = _intern(self._descs, self._desc_list, (tensor.shape, tensor.dtype))
        if self._record_stacks:
            entry.stack = self._stack_id(caller_frames())
        self.storages_seen += 1
        if self._history is not None:
            entry.addr = storage.data_ptr()
            self._log("alloc", entry)
        if self._window_keys is not None:
            self._window_keys.append(key)
        self._totals[category] += nbytes
        self._count(category, context, nbytes)
        self._current += nbytes
        self._note_peak()

    def _count(self, category: int, context: int, nbytes: int, saved: bool = False) -> None:
        key = (category, context, saved)
        left = self._composition.get(key, 0) + nbytes
        if left:
            self._composition[key] = left
        else:
            self._composition.pop(key, None)

    def _recategorise(self, entry: _Entry, category: int) -> None:
        self._keep_peak_composition()
        self._totals[entry.category] -= entry.nbytes
        self._totals[category] += entry.nbytes
        self._count(entry.category, entry.context, -entry.nbytes, entry.saved)
        self._count(category, entry.context, entry.nbytes, entry.saved)
        entry.category = category

    def _keep_peak_composition(self) -> None:
        """Before the live set changes other than by growing: copy it if it is the peak's."""
        if self._composition_stale:
            self._peak_composition = dict(self._composition)
            self._composition_stale = False

    def _note_peak(self) -> None:
        if self._current > self._phase_peak:
            self._phase_peak = self._current
        if self._current > self._peak:
            self._peak = self._current
            self._peak_context = self._context
            self._peak_categories = tuple(self._totals)
            self._composition_stale = True

    def _release(self, entry: _Entry) -> None:
        # Runs inside the garbage collector / refcount drop of a storage: it must never raise.
        if self.error is not None:
            return
        try:
            with self._lock:
                if self._live.get(entry.key) is entry:
                    self._keep_peak_composition()
                    if self._history is not None:
                        self._log("free_requested", entry)
                        self._log("free_completed", entry)
                    del self._live[entry.key]
                    self._totals[entry.category] -= entry.nbytes
                    self._count(entry.category, entry.context, -entry.nbytes, entry.saved)
                    self._current -= entry.nbytes
        except Exception as exc:
            self.fail(exc)

    # -- allocation history ----------------------------------------------------------------
    def note_uses(self, args: Any, kwargs: Any) -> None:
        """The storages an op read are in use now (kept while the history is recorded)."""
        now = time.time_ns() // 1000
        live = self._live
        for tensor in _tensor_args(args, kwargs):
            storage = self._storage_of(tensor)
            if storage is not None:
                entry = live.get(id(storage))
                if entry is not None:
                    entry.last_use = now

    def start_history(self, max_entries: int, stacks: bool = False) -> None:
        """Log every allocation and free from now on (the last ``max_entries`` kept); with
        ``stacks``, each storage created from now on also remembers its Python frames."""
        with self._lock:
            self._history = collections.deque(maxlen=max(1, max_entries))
            self._record_stacks = stacks
            for entry in self._live.values():  # live now: known by address for the frees
                storage = entry()
                if storage is not None:
                    entry.addr = storage.data_ptr()

    def stop_history(self) -> None:
        with self._lock:
            self._history = None
            self._record_stacks = False

    def _stack_id(self, frames: tuple[Frame, ...]) -> int:
        return _intern(self._stacks, self._stack_list, frames)

    def history_snapshot(self) -> dict[str, Any]:
        """The history and the live storages as a CUDA allocator snapshot would hold them
        (``segments`` with one block per live storage, ``device_traces[0]``), so that
        pytorch.org/memory_viz and ``memscope analyze-snapshot`` read it. Each event carries
        MemScope's ``category`` and a frame naming the phase, module, microbatch and chunk
        that created the storage."""
        with self._lock:
            trace = [dict(e) for e in self._history or ()]
            live = [
                (e.addr, e.nbytes, e.category, e.context, e.last_use, e.stack)
                for e in self._live.values()
            ]
        segments = [
            {
                "device": 0,
                "address": addr,
                "total_size": size,
                "allocated_size": size,
                "active_size": size,
                "requested_size": size,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [
                    {
                        "address": addr,
                        "size": size,
                        "requested_size": size,
                        "state": "active_allocated",
                        "category": CATEGORIES[category],
                        "frames": self._frames(context, stack),
                        "last_use_us": last_use or None,
                    }
                ],
            }
            for addr, size, category, context, last_use, stack in live
            if addr
        ]
        return {"segments": segments, "device_traces": [trace], "allocator_settings": {}}

    def _frames(self, context: int, stack: int = 0) -> list[dict[str, Any]]:
        phase, module, microbatch, chunk = self._context_list[context]
        where = " ".join(
            str(x)
            for x in (
                phase or "setup",
                module or "(no module)",
                None if microbatch is None else f"microbatch {microbatch}",
                None if chunk is None else f"chunk {chunk}",
            )
            if x is not None
        )
        own = [{"filename": f, "line": n, "name": fn} for f, n, fn in self._stack_list[stack]]
        return [{"filename": "memscope", "line": 0, "name": where}, *own]

    def _log(self, action: str, entry: _Entry) -> None:
        assert self._history is not None
        self._history.append(
            {
                "action": action,
                "addr": entry.addr,
                "size": entry.nbytes,
                "stream": 0,
                "time_us": time.time_ns() // 1000,
                "category": FREE_CATEGORY if action != "alloc" else CATEGORIES[entry.category],
                "frames": self._frames(entry.context, entry.stack),
                **({"last_use_us": entry.last_use or None} if action == "free_requested" else {}),
            }
        )

    # -- readings --------------------------------------------------------------------------
    def sample(self, detailed: bool = False) -> MemorySample:
        with self._lock:
            current, peak, totals = self._current, self._peak, tuple(self._totals)
            phase_peak = max(self._phase_peak, current)
        extras = {"live_storages": len(self._live)} if detailed else None
        return MemorySample(current, current, peak, peak, totals, extras, phase_peak)

    def mark_phase(self) -> None:
        with self._lock:
            self._phase_peak = self._current

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._current
            self._peak_context = self._context
            self._peak_categories = tuple(self._totals)
            self._composition_stale = True

    def peak_context(self) -> PeakContext | None:
        return self._peak_context

    def peak_composition(self) -> tuple[CompositionItem, ...] | None:
        """What was live at the window's peak by category x creation context, largest
        first: the :data:`COMPOSITION_ITEMS` largest, then one remainder per category
        (module ``"(rest)"``). The bytes sum to the peak."""
        with self._lock:
            self._keep_peak_composition()
            return self._items(self._peak_composition)

    def live_composition(self) -> tuple[CompositionItem, ...] | None:
        """What is live now, as :meth:`peak_composition` gives the peak's."""
        with self._lock:
            return self._items(self._composition)

    def composition_at_failure(self) -> tuple[CompositionItem, ...] | None:
        """What was live when the capacity limit failed an allocation (else: now)."""
        return self._at_failure if self._at_failure is not None else self.live_composition()

    def _items(self, composition: dict[tuple[int, int, bool], int]) -> tuple[CompositionItem, ...]:
        live = sorted(composition.items(), key=lambda kv: -kv[1])
        items = []
        for (category, context, saved), nbytes in live[:COMPOSITION_ITEMS]:
            phase, module, microbatch, chunk = self._context_list[context]
            kept = saved if category == CAT_ACTIVATIONS else None
            items.append(
                CompositionItem(
                    CATEGORIES[category], phase, module, microbatch, chunk, nbytes, kept
                )
            )
        rest: dict[int, int] = {}
        for (category, _, _), nbytes in live[COMPOSITION_ITEMS:]:
            rest[category] = rest.get(category, 0) + nbytes
        for category, nbytes in sorted(rest.items(), key=lambda kv: -kv[1]):
            items.append(CompositionItem(CATEGORIES[category], "", "(rest)", None, None, nbytes))
        return tuple(items)

    def peak_categories(self) -> tuple[int, ...] | None:
        return self._peak_categories

    def survivors(self, born_from: int, born_until: int) -> tuple[Survivor, ...] | None:
        """Live activations and other storages born in steps ``born_from..born_until``, by
        creation context and step: the :data:`SURVIVOR_ITEMS` largest groups, each with the
        Python stack of its largest storage when stacks were recorded at its birth."""
        # (context, born) -> [bytes, count, largest storage's bytes, its stack, its shape]
        groups: dict[tuple[int, int], list[int]] = {}
        with self._lock:
            for entry in self._live.values():
                if born_from <= entry.born <= born_until and entry.category in _TRANSIENT:
                    found = groups.setdefault((entry.context, entry.born), [0, 0, -1, 0, 0])
                    found[0] += entry.nbytes
                    found[1] += 1
                    if entry.nbytes > found[2]:
                        found[2], found[3], found[4] = entry.nbytes, entry.stack, entry.desc
        largest = sorted(groups.items(), key=lambda kv: -kv[1][0])[:SURVIVOR_ITEMS]
        out = []
        for (context, born), (nbytes, count, _, stack, desc) in largest:
            phase, module, microbatch, chunk = self._context_list[context]
            frames = tuple(format_frame(f) for f in self._stack_list[stack])
            shape, dtype = self._desc_list[desc]
            out.append(
                Survivor(
                    phase, module, microbatch, chunk, born, nbytes, count, frames,
                    None if shape is None else tuple(shape),
                    "" if dtype is None else str(dtype).removeprefix("torch."),
                )
            )  # fmt: skip
        return tuple(out)

    def live_bytes_by_category(self) -> dict[str, int]:
        """Current bytes per category name."""
        with self._lock:
            return dict(zip(CATEGORIES, self._totals, strict=True))

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "backend": self.name,
            "device_type": self.device_type,
            "accounting": "exact live tensor storages (aten op outputs); reserved == allocated",
        }
        if self.capacity_bytes:
            out["capacity_bytes"] = self.capacity_bytes
        return out
