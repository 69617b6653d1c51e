"""Readings of a backend turned into :class:`~memscope.events.schema.MemoryEvent`s.

:class:`EventEmitter` is the tracer's one way to read memory and to emit: it reads the
backend (waiting for the device first where the configuration asks for it and the backend
can), numbers the events, stamps them with the time since tracing started, and hands each
to every consumer (the bounded store, the analyzers, the trace writer).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from memscope.capture.backends.base import MemoryBackend, MemorySample
from memscope.config import RuntimeConfig
from memscope.events.schema import EventConsumer, MemoryEvent


class EventEmitter:
    """Samples one rank's backend and sends the events made from the samples."""

    def __init__(
        self,
        config: RuntimeConfig,
        backend: MemoryBackend,
        rank: int,
        consumers: Sequence[EventConsumer],
        pipeline_stage: int | None = None,
    ) -> None:
        self.backend = backend
        self.rank = rank
        self.pipeline_stage = pipeline_stage
        self.consumers = tuple(consumers)
        self.t0 = time.time()
        self.events_emitted = 0
        caps = backend.capabilities
        self._sync = config.sync_on_module_hooks and caps.can_synchronize
        self._sync_steps = config.sync_on_step_boundaries and caps.can_synchronize
        #: The latest reading taken.
        self.last: MemorySample = backend.sample()

    def elapsed(self) -> float:
        """Seconds since tracing started."""
        return time.time() - self.t0

    def sample(self, detailed: bool = False) -> MemorySample:
        """Read the backend (``detailed``: a step boundary's reading, with its extras)."""
        if (self._sync and not detailed) or (self._sync_steps and detailed):
            self.backend.synchronize()
        sample = self.backend.sample(detailed)
        self.last = sample
        return sample

    def emit(
        self,
        event_type: str,
        step: int,
        phase: str,
        module: str,
        before: MemorySample,
        after: MemorySample,
        **extra: Any,
    ) -> MemoryEvent:
        self.events_emitted += 1
        event = MemoryEvent(
            seq=self.events_emitted,
            event_type=event_type,
            phase=phase,
            step=step,
            module=module,
            timestamp=time.time() - self.t0,
            rank=self.rank,
            mem_allocated_before=before.allocated,
            mem_allocated_after=after.allocated,
            mem_reserved_before=before.reserved,
            mem_reserved_after=after.reserved,
            max_mem_allocated=max(after.peak_allocated, after.allocated),
            max_mem_reserved=max(after.peak_reserved, after.reserved),
            pipeline_stage=self.pipeline_stage,
            categories=after.categories,
            **extra,
        )
        for consumer in self.consumers:
            consumer.consume(event)
        return event
