"""What every memory backend provides: a cheap sample and a resettable high-water mark."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any


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


class MemoryBackend(abc.ABC):
    """A source of memory readings for one rank."""

    name: str = ""

    #: The training-loop context (step, phase, module, microbatch) at the moment the backend
    #: reaches a new high-water mark; only backends that see every allocation can fill it.
    context: tuple[Any, ...] = ()

    def start(self) -> None:  # noqa: B027 - optional hook
        """Begin observing (called once by the runtime)."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Stop observing; must be safe to call twice."""

    @abc.abstractmethod
    def sample(self, detailed: bool = False) -> MemorySample:
        """Read current and high-water memory; ``detailed`` adds step-level extras."""

    @abc.abstractmethod
    def reset_peak(self) -> None:
        """Start a new high-water window at the current allocation level."""

    def peak_context(self) -> tuple[Any, ...] | None:
        """Context recorded when the current window's peak was reached, if known."""
        return None

    def peak_categories(self) -> tuple[int, ...] | None:
        """Per-category bytes at the current window's peak, if the backend classifies."""
        return None

    def describe(self) -> dict[str, Any]:
        """Static facts for the report's metadata (device name, totals...)."""
        return {"backend": self.name}
