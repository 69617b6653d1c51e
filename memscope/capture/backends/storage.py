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

import gc
import threading
import warnings
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memscope.capture.backends.base import (
    BackendCapabilities,
    Categorizer,
    MemoryBackend,
    MemorySample,
)
from memscope.capture.backends.registry import BackendSpec, register_backend
from memscope.capture.dispatch_stack import remove_dispatch_mode
from memscope.events.schema import CAT_OTHER, CATEGORIES, PeakContext


def register() -> None:
    """Make ``storage`` a backend choice (``auto``'s pick when no GPU is present)."""
    register_backend(
        BackendSpec(
            name="storage",
            factory=lambda options: StorageLedgerBackend(
                "cuda" if torch.cuda.is_available() else "cpu"
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
    """A ledger entry: a weak reference to a live storage, its size and category."""

    __slots__ = ("category", "key", "nbytes")
    key: int
    nbytes: int
    category: int

    def __new__(cls, storage: Any, callback: Any, key: int, nbytes: int, category: int) -> _Entry:
        self = super().__new__(cls, storage, callback)
        self.key, self.nbytes, self.category = key, nbytes, category
        return self

    def __init__(self, storage: Any, callback: Any, key: int, nbytes: int, category: int) -> None:
        # weakref.ref.__init__ accepts only (object, callback).
        super().__init__(storage, callback)  # type: ignore[call-arg]


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
            except Exception as exc:
                ledger.fail(exc)
        return out


class StorageLedgerBackend(MemoryBackend):
    """Live-storage ledger with per-category totals and a true running peak."""

    name = "storage"

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self._capabilities = BackendCapabilities(
            device_type=device_type,
            exact_categories=True,
            true_peak=True,
            peak_context=True,
            can_synchronize=False,
            distinct_reserved=False,
        )
        self.active = False
        #: Category given to storages first seen from now on (set per phase by the policy).
        self.alloc_category = CAT_OTHER
        self.context: PeakContext | None = None
        self.error: str | None = None
        self._lock = threading.RLock()
        self._live: dict[int, _Entry] = {}  # id(storage) -> entry
        self._on_device = "is_cuda" if device_type == "cuda" else "is_cpu"
        self._totals = [0] * len(CATEGORIES)
        self._current = 0
        self._peak = 0
        self._peak_context: PeakContext | None = None
        self._peak_categories: tuple[int, ...] = tuple(self._totals)
        self._mode: _LedgerMode | None = None
        self._window_keys: list[int] | None = None
        self.storages_seen = 0

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._capabilities

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
                self._add(storage, category)
            elif entry.category != category:
                self._totals[entry.category] -= entry.nbytes
                self._totals[category] += entry.nbytes
                entry.category = category

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
                    self._add(storage, category)
                adopted += 1
        return adopted

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
                    self._totals[only_from] -= entry.nbytes
                    self._totals[category] += entry.nbytes
                    entry.category = category
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
                self._add(storage, category)
            elif resized:
                diff = storage.nbytes() - entry.nbytes
                if diff:
                    entry.nbytes += diff
                    self._totals[entry.category] += diff
                    self._current += diff
                    self._note_peak()

    def _add(self, storage: torch.UntypedStorage, category: int) -> None:
        nbytes = storage.nbytes()
        key = id(storage)
        self._live[key] = _Entry(storage, self._release, key, nbytes, category)
        self.storages_seen += 1
        if self._window_keys is not None:
            self._window_keys.append(key)
        self._totals[category] += nbytes
        self._current += nbytes
        self._note_peak()

    def _note_peak(self) -> None:
        if self._current > self._peak:
            self._peak = self._current
            self._peak_context = self.context
            self._peak_categories = tuple(self._totals)

    def _release(self, entry: _Entry) -> None:
        # Runs inside the garbage collector / refcount drop of a storage: it must never raise.
        if self.error is not None:
            return
        try:
            with self._lock:
                if self._live.get(entry.key) is entry:
                    del self._live[entry.key]
                    self._totals[entry.category] -= entry.nbytes
                    self._current -= entry.nbytes
        except Exception as exc:
            self.fail(exc)

    # -- readings --------------------------------------------------------------------------
    def sample(self, detailed: bool = False) -> MemorySample:
        with self._lock:
            current, peak, totals = self._current, self._peak, tuple(self._totals)
        extras = {"live_storages": len(self._live)} if detailed else None
        return MemorySample(current, current, peak, peak, totals, extras)

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._current
            self._peak_context = self.context
            self._peak_categories = tuple(self._totals)

    def peak_context(self) -> PeakContext | None:
        return self._peak_context

    def peak_categories(self) -> tuple[int, ...] | None:
        return self._peak_categories

    def live_bytes_by_category(self) -> dict[str, int]:
        """Current bytes per category name."""
        with self._lock:
            return dict(zip(CATEGORIES, self._totals, strict=True))

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "device_type": self.device_type,
            "accounting": "exact live tensor storages (aten op outputs); reserved == allocated",
        }
