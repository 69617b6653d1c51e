"""The storage ledger's allocation history, in the CUDA allocator snapshot's format.

While the history is recorded (``--memscope-enable-memory-snapshot`` with the ``storage``
backend) every allocation and free the ledger sees is logged as the caching allocator's
``device_traces`` would hold it, the oldest entries dropped past the limit as the
allocator's ring does. :func:`allocator_snapshot` wraps the log and the live storages into
a snapshot that pytorch.org/memory_viz and ``memscope analyze-snapshot`` read.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from typing import Any, Protocol

from memscope.capture.backends.storage_composition import CreationContexts
from memscope.events.schema import CATEGORIES, FREE_CATEGORY


class LoggedStorage(Protocol):
    """What the log reads of a ledger entry."""

    addr: int
    nbytes: int
    category: int
    context: int
    stack: int
    last_use: int


class AllocationHistoryLog:
    """The last ``max_entries`` allocations and frees, each with MemScope's category and a
    frame naming the phase, module, microbatch and chunk that created the storage."""

    def __init__(self, max_entries: int, contexts: CreationContexts) -> None:
        self.entries: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=max(1, max_entries)
        )
        self._contexts = contexts
        self._last_stamp = 0

    def stamp(self) -> int:
        """Microseconds since the epoch, strictly increasing over this log's events and the
        ledger's uses: two stamps never tie, so comparing a last use with an event's time
        orders them as they happened (a stamp taken in the same microsecond as the previous
        one is moved 1 µs on)."""
        now = max(time.time_ns() // 1000, self._last_stamp + 1)
        self._last_stamp = now
        return now

    def alloc(self, entry: LoggedStorage) -> None:
        self._log("alloc", entry)

    def free(self, entry: LoggedStorage) -> None:
        """A free as the allocator logs it: requested, then completed."""
        self._log("free_requested", entry)
        self._log("free_completed", entry)

    def _log(self, action: str, entry: LoggedStorage) -> None:
        self.entries.append(
            {
                "action": action,
                "addr": entry.addr,
                "size": entry.nbytes,
                "stream": 0,
                "time_us": self.stamp(),
                "category": FREE_CATEGORY if action != "alloc" else CATEGORIES[entry.category],
                "frames": self._contexts.snapshot_frames(entry.context, entry.stack),
                **({"last_use_us": entry.last_use or None} if action == "free_requested" else {}),
            }
        )


def allocator_snapshot(
    trace: list[dict[str, Any]],
    live: Iterable[tuple[int, int, int, int, int, int]],
    contexts: CreationContexts,
) -> dict[str, Any]:
    """A CUDA allocator snapshot of ``trace`` (``device_traces[0]``) and the ``live``
    storages, given as ``(addr, nbytes, category, context, last_use, stack)`` rows: one
    segment with one block each (storages never seen at an address are left out)."""
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
                    "frames": contexts.snapshot_frames(context, stack),
                    "last_use_us": last_use or None,
                }
            ],
        }
        for addr, size, category, context, last_use, stack in live
        if addr
    ]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}}
