"""Streams events to a per-rank JSON-lines trace so host memory stays bounded."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import IO, Any

from memscope.events.schema import SCHEMA_VERSION, MemoryEvent


class JsonlTraceSink:
    """Appends events as JSON lines; the first line is a header with ``schema_version``."""

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115
        self._file.write(json.dumps({"schema_version": SCHEMA_VERSION, "header": header}) + "\n")
        self.events_written = 0

    def write(self, events: Iterable[MemoryEvent]) -> None:
        if self._file is None:
            return
        lines = [json.dumps(e.to_dict(), separators=(",", ":")) for e in events]
        if lines:
            self._file.write("\n".join(lines) + "\n")
            self.events_written += len(lines)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.close()


class BufferedTraceWriter:
    """An event consumer that buffers events and writes them to a sink on :meth:`flush`
    (at step ends and report writes), so hooks never do file I/O."""

    def __init__(self, sink: JsonlTraceSink) -> None:
        self.sink = sink
        self._pending: list[MemoryEvent] = []

    def consume(self, event: MemoryEvent) -> None:
        self._pending.append(event)

    def flush(self) -> None:
        """Write buffered events to the trace file."""
        if self._pending:
            pending, self._pending = self._pending, []
            self.sink.write(pending)
            self.sink.flush()

    def close(self) -> None:
        self.flush()
        self.sink.close()
