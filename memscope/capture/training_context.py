"""Where training is: step, phase, module, microbatch and virtual-pipeline chunk.

The tracer updates a :class:`TrainingContext` at every hook. A backend that records where
its peak was set (``capabilities.peak_context``) is told each change; while an allocator
history is recorded each change is also kept as a timestamped
:class:`~memscope.events.schema.ContextMarker`; and the latest context is where a crash or
OOM is placed.
"""

from __future__ import annotations

import time

from memscope.capture.backends.base import MemoryBackend
from memscope.events import schema as s
from memscope.events.schema import ContextMarker, PeakContext


class TrainingContext:
    """The latest training-loop context, handed to the backend and kept as markers."""

    def __init__(self, backend: MemoryBackend) -> None:
        self._backend = backend if backend.capabilities.peak_context else None
        #: (module, microbatch, phase, VPP chunk) as the latest hook set it.
        self.current: tuple[str, int | None, str, int | None] = ("", None, s.PHASE_SETUP, None)
        #: Context changes with their time, kept while an allocator history is recorded
        #: (:meth:`start_markers`); bounded by ``max_markers``.
        self.markers: list[ContextMarker] | None = None
        self.max_markers = 0

    def set(
        self, step: int, phase: str, module: str, microbatch: int | None, chunk: int | None
    ) -> None:
        self.current = (module, microbatch, phase, chunk)
        if self._backend is not None:
            self._backend.context = PeakContext(step, phase, module, microbatch, chunk)
        markers = self.markers
        if markers is not None and len(markers) < self.max_markers:
            markers.append(
                ContextMarker(time.time_ns() // 1000, phase, module, microbatch, chunk, step)
            )

    def start_markers(self, limit: int) -> None:
        """Keep every context change from now on (at most ``limit``) with its time."""
        self.markers, self.max_markers = [], limit

    def take_markers(self) -> list[ContextMarker]:
        """The markers kept so far; keeping goes on."""
        return list(self.markers or ())
