"""Exact, device-agnostic accounting of live tensor storages (the ``storage`` backend).

Every aten op runs under a dispatch mode (:mod:`.storage_dispatch`); each output storage not
seen before is added to a ledger (:mod:`.storage_ledger`) with a category and its creation
context (:mod:`.storage_composition`), and a weak reference callback removes it at the moment
the storage is really freed. The running sum is therefore exact for every storage that is an
op output, and the high-water mark is a true running peak, not a sampled one. While asked,
the ledger also logs its allocations and frees in the CUDA snapshot's format
(:mod:`.storage_history`).

Not seen: workspaces a kernel allocates and frees internally, and tensors made without an
aten op (``torch.from_numpy``). There is no caching allocator here, so ``reserved`` equals
``allocated``.
"""

from __future__ import annotations

from typing import Any

import torch

from memscope.capture.backends.base import (
    BackendCapabilities,
    BackendOptions,
    Categorizer,
    MemoryBackend,
    MemorySample,
)
from memscope.capture.backends.registry import BackendSpec, register_backend
from memscope.capture.backends.storage_categorizer import StorageCategorizer
from memscope.capture.backends.storage_dispatch import LedgerDispatchMode
from memscope.capture.backends.storage_ledger import StorageLedger
from memscope.capture.dispatch_stack import remove_dispatch_mode
from memscope.events.schema import CATEGORIES, CompositionItem, PeakContext, Survivor


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


class StorageLedgerBackend(MemoryBackend):
    """The ``storage`` backend: a :class:`StorageLedger` fed by a dispatch mode while
    started, re-labelled through a :class:`StorageCategorizer`, read as a
    :class:`MemoryBackend` (per-category totals, a true running peak with its context and
    composition, an allocation history in the CUDA snapshot's format)."""

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
        #: The bookkeeping, and how the category policy re-labels its storages.
        self.ledger = StorageLedger(device_type, capacity_bytes)
        self._categorizer = StorageCategorizer(self.ledger)
        self._mode: LedgerDispatchMode | None = None

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._capabilities

    @property
    def context(self) -> PeakContext | None:
        """Where training is now (set by the tracer); storages created from now on carry it."""
        return self.ledger.context

    @context.setter
    def context(self, ctx: PeakContext | None) -> None:
        self.ledger.set_context(ctx)

    @property
    def error(self) -> str | None:
        """Why accounting stopped part-way (the ledger's first internal error), if it did."""
        return self.ledger.error

    @error.setter
    def error(self, reason: str | None) -> None:
        self.ledger.error = reason

    def categorizer(self) -> Categorizer:
        return self._categorizer

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._mode is not None:
            return
        self._mode = LedgerDispatchMode(self.ledger)
        self._mode.__enter__()
        self.ledger.active = True

    def stop(self) -> None:
        """Leave the dispatch stack: exactly our mode, whatever was entered after it."""
        self.ledger.active = False
        mode, self._mode = self._mode, None
        if mode is not None:
            remove_dispatch_mode(mode)

    # -- allocation history ----------------------------------------------------------------
    def start_history(self, max_entries: int, stacks: bool = False) -> None:
        """Log every allocation and free from now on (the last ``max_entries`` kept); with
        ``stacks``, each storage created from now on also remembers its Python frames."""
        self.ledger.start_history(max_entries, stacks)

    def stop_history(self) -> None:
        self.ledger.stop_history()

    def history_snapshot(self) -> dict[str, Any]:
        """The history and the live storages as a CUDA allocator snapshot would hold them
        (``segments`` with one block per live storage, ``device_traces[0]``), so that
        pytorch.org/memory_viz and ``memscope analyze-snapshot`` read it. Each event carries
        MemScope's ``category`` and a frame naming the phase, module, microbatch and chunk
        that created the storage."""
        return self.ledger.history_snapshot()

    # -- readings --------------------------------------------------------------------------
    def sample(self, detailed: bool = False) -> MemorySample:
        return self.ledger.sample(detailed)

    def mark_phase(self) -> None:
        self.ledger.mark_phase()

    def reset_peak(self) -> None:
        self.ledger.reset_peak()

    def peak_context(self) -> PeakContext | None:
        return self.ledger.peak_context

    def peak_categories(self) -> tuple[int, ...] | None:
        return self.ledger.peak_categories

    def peak_composition(self) -> tuple[CompositionItem, ...] | None:
        """What was live at the window's peak by category x creation context, largest
        first: the largest items, then one remainder per category (module ``"(rest)"``).
        The bytes sum to the peak."""
        with self.ledger.lock:
            return self.ledger.composition.peak_items()

    def live_composition(self) -> tuple[CompositionItem, ...] | None:
        """What is live now, as :meth:`peak_composition` gives the peak's."""
        with self.ledger.lock:
            composition = self.ledger.composition
            return composition.items(composition.live)

    def composition_at_failure(self) -> tuple[CompositionItem, ...] | None:
        """What was live when the capacity limit failed an allocation (else: now)."""
        kept = self.ledger.composition.at_failure
        return kept if kept is not None else self.live_composition()

    def survivors(self, born_from: int, born_until: int) -> tuple[Survivor, ...] | None:
        """Live activations and other storages born in steps ``born_from..born_until``, by
        creation context and step: the largest groups, each with the Python stack of its
        largest storage when stacks were recorded at its birth."""
        return self.ledger.survivors(born_from, born_until)

    def live_bytes_by_category(self) -> dict[str, int]:
        """Current bytes per category name."""
        with self.ledger.lock:
            return dict(zip(CATEGORIES, self.ledger.totals, strict=True))

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "backend": self.name,
            "device_type": self.device_type,
            "accounting": "exact live tensor storages (aten op outputs); reserved == allocated",
        }
        if self.capacity_bytes:
            out["capacity_bytes"] = self.capacity_bytes
        return out
