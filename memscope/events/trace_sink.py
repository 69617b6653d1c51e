"""Streams events to a per-rank JSON-lines trace so host memory stays bounded.

Guarantees: a line is whole or absent. Each batch is written with ``os.write`` calls on an
append-only descriptor, and if a write fails part-way (disk full, file-size limit) the file is
cut back to its last whole line before the error is raised; only a process killed in the
middle of a write can leave a torn last line, which the reader ignores. The file is capped at
``max_bytes``: past it, the trace is rotated (``trace.jsonl`` becomes ``trace.1.jsonl``,
replacing an older one) and a fresh file starts with the same header. A trace deleted under a
running job (its directory removed) is recreated at the next write.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from typing import Any

from memscope.events.schema import SCHEMA_VERSION, MemoryEvent

#: Events held for the trace while its file can't be written; beyond, the oldest are dropped.
MAX_PENDING_EVENTS = 100_000


class JsonlTraceSink:
    """Appends events as JSON lines; the first line is a header with ``schema_version``."""

    def __init__(self, path: str, header: dict[str, Any], max_bytes: int = 0) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._header = (
            json.dumps({"schema_version": SCHEMA_VERSION, "header": header}) + "\n"
        ).encode()
        self._fd: int | None = None
        self._size = 0
        self.events_written = 0
        self.rotations = 0
        self._open(truncate=True)

    def _open(self, truncate: bool) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        # never through a symlink at the trace's own name: in a shared output folder anyone
        # could have planted one (ELOOP then, and the session turns the trace file off)
        flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(self.path, flags, 0o666)
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):
            os.close(self._fd)
            self._fd = None
            raise OSError(f"{self.path}: not a regular file; the trace is not written there")
        self._size = os.fstat(self._fd).st_size
        if self._size == 0:
            self._write_whole(self._header)

    def _write_whole(self, data: bytes) -> None:
        assert self._fd is not None
        good = self._size
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except BaseException:
            try:
                os.ftruncate(self._fd, good)  # back to the last whole line
            finally:
                raise
        self._size = good + len(data)

    def _ensure_open(self) -> None:
        if self._fd is None:
            return
        if not os.path.exists(self.path):  # deleted under us: writes would vanish
            os.close(self._fd)
            self._fd = None
            self._open(truncate=True)

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        root, ext = os.path.splitext(self.path)
        os.replace(self.path, f"{root}.1{ext}")
        self.rotations += 1
        self._open(truncate=True)

    def write(self, events: Iterable[MemoryEvent]) -> None:
        """Append ``events`` as whole lines (raises ``OSError`` when the file can't take them;
        nothing partial is left)."""
        if self._fd is None:
            return
        self._ensure_open()
        data = "".join(
            json.dumps(e.to_dict(), separators=(",", ":")) + "\n" for e in events
        ).encode()
        if not data:
            return
        if self.max_bytes and self._size + len(data) > self.max_bytes > len(self._header):
            self._rotate()
        self._write_whole(data)
        self.events_written += data.count(b"\n")

    def flush(self) -> None:
        """Nothing is buffered in this process (kept for the sink interface)."""

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class BufferedTraceWriter:
    """An event consumer that buffers events and writes them to a sink on :meth:`flush`
    (at step ends and report writes), so hooks never do file I/O. While the sink fails, events
    wait (at most :data:`MAX_PENDING_EVENTS`, oldest dropped and counted) for the next try."""

    def __init__(self, sink: JsonlTraceSink) -> None:
        self.sink = sink
        self.dropped = 0
        self._pending: list[MemoryEvent] = []

    def consume(self, event: MemoryEvent) -> None:
        self._pending.append(event)
        if len(self._pending) > MAX_PENDING_EVENTS:
            excess = len(self._pending) - MAX_PENDING_EVENTS
            del self._pending[:excess]
            self.dropped += excess

    def flush(self) -> None:
        """Write buffered events to the trace file (raises if the file can't take them)."""
        if self._pending:
            self.sink.write(self._pending)
            self._pending = []

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.sink.close()
