"""The memory-backend interface: a cheap sample, a resettable high-water mark, capabilities.

A backend says what it can do through :class:`BackendCapabilities`; the tracer and the
session read those flags and never check a backend's type or name.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Protocol

from memscope.events.schema import CompositionItem, PeakContext, Survivor


@dataclass(slots=True)
class MemorySample:
    """One reading of a backend.

    ``peak_*`` is the high-water mark since the last :meth:`MemoryBackend.reset_peak`.
    ``categories`` is a per-category byte tuple (see ``events.schema.CATEGORIES``) when the
    backend classifies memory, else ``None``. ``device`` holds step-level extras (allocator
    counters, device-level used memory) and is only filled when asked for.
    """

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    categories: tuple[int, ...] | None = None
    device: dict[str, int] | None = None
    #: The high-water mark since the last :meth:`MemoryBackend.mark_phase` (backends with a
    #: true running peak; ``None`` where only a process-wide counter exists).
    phase_peak_allocated: int | None = None


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """Settings a backend is built with (from the runtime configuration)."""

    #: Reset the device's process-wide peak counters at every step start (exact per-step
    #: peaks from the counter, at the cost of the host's own "max allocated" figures).
    reset_peak_stats: bool = False
    #: Storage backend: live bytes beyond which an allocation raises ``OutOfMemoryError``.
    capacity_bytes: int = 0


@dataclass(frozen=True, slots=True)
class BackendCapabilities:
    """What a backend can tell and do; the tracer adapts to these, never to a type."""

    #: ``cuda`` or ``cpu``: where the memory it measures lives.
    device_type: str
    #: Every live byte is in a category (parameters, gradients, ...): the backend offers a
    #: :class:`Categorizer`.
    exact_categories: bool
    #: The high-water mark is the true running peak (not a value seen at a sample).
    true_peak: bool
    #: It records the training-loop context (step, phase, module, microbatch) at the peak.
    peak_context: bool
    #: :meth:`MemoryBackend.synchronize` waits for the device (asynchronous devices only).
    can_synchronize: bool
    #: Reserved memory differs from allocated (a caching allocator).
    distinct_reserved: bool
    #: It logs its own allocation history (``start_history`` / ``history_snapshot``) in the
    #: CUDA allocator snapshot's format.
    allocation_history: bool = False


class Categorizer(Protocol):
    """Category bookkeeping of a backend that sees every allocation (see CategoryPolicy)."""

    def set_alloc_category(self, category: int) -> None:
        """Category for storages first seen from now on."""

    def mark(self, tensor: Any, category: int) -> None:
        """Give ``tensor``'s storage ``category``, adopting it if it predates tracking."""

    def mark_saved(self, tensor: Any) -> None:
        """``tensor`` was saved by autograd for backward (a saved activation)."""

    def mark_run_long(self, tensor: Any, owner: str) -> None:
        """``tensor``'s storage is run-long scratch held by ``owner`` (category ``buffers``)."""

    def adopt_existing(self, category: int) -> int:
        """Adopt every reachable live tensor not yet tracked; returns how many."""

    def open_window(self) -> None:
        """Remember storages created from now on."""

    def promote_window(self, category: int) -> int:
        """Move storages created since :meth:`open_window` and still alive to ``category``."""


class MemoryBackend(abc.ABC):
    """A source of memory readings for one rank."""

    name: str = ""

    #: Training-loop context, set by the tracer at every hook; a backend with
    #: ``capabilities.peak_context`` remembers it at the moment a new high-water mark is set.
    context: PeakContext | None = None

    #: Why the backend stopped working part-way, if it did (reported, never raised).
    error: str | None = None

    #: What this backend cannot give with this torch, one line each (report warnings).
    notes: tuple[str, ...] = ()

    @property
    @abc.abstractmethod
    def capabilities(self) -> BackendCapabilities:
        """What this backend can do."""

    def start(self) -> None:  # noqa: B027 - optional hook
        """Begin observing (called once by the session)."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Stop observing; must be safe to call twice."""

    @abc.abstractmethod
    def sample(self, detailed: bool = False) -> MemorySample:
        """Read current and high-water memory; ``detailed`` adds step-level extras."""

    @abc.abstractmethod
    def reset_peak(self) -> None:
        """Start a new high-water window at the current allocation level."""

    def mark_phase(self) -> None:  # noqa: B027 - optional hook
        """Start a new phase's high-water mark (``MemorySample.phase_peak_allocated``) at the
        current allocation level, without touching the step's window."""

    def synchronize(self) -> None:  # noqa: B027 - optional hook
        """Wait for queued device work (only meaningful with ``can_synchronize``)."""

    def categorizer(self) -> Categorizer | None:
        """The category bookkeeping, for backends with ``exact_categories``."""
        return None

    def peak_context(self) -> PeakContext | None:
        """Context recorded when the current window's peak was reached, if known."""
        return None

    def peak_categories(self) -> tuple[int, ...] | None:
        """Per-category bytes at the current window's peak, if the backend classifies."""
        return None

    def peak_composition(self) -> tuple[CompositionItem, ...] | None:
        """What was live at the current window's peak by category and creation context."""
        return None

    def live_composition(self) -> tuple[CompositionItem, ...] | None:
        """What is live now by category and creation context (None: cannot tell)."""
        return None

    def composition_at_failure(self) -> tuple[CompositionItem, ...] | None:
        """What was live when an allocation failed (backends that see the failure keep it;
        by default: what is live now)."""
        return self.live_composition()

    def survivors(self, born_from: int, born_until: int) -> tuple[Survivor, ...] | None:
        """Activations and other memory born in steps ``born_from..born_until`` and still
        live, by creation context and step (None: the backend cannot tell)."""
        return None

    def describe(self) -> dict[str, Any]:
        """Static facts for the report's metadata (device name, totals...)."""
        return {"backend": self.name}
