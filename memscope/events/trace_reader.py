"""Reads a rank's ``trace.jsonl`` back: its header and its events (torch-free)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from memscope.events.bounded_input import (
    InputRefused,
    open_regular,
    strict_json_loads,
)
from memscope.events.schema import SCHEMA_VERSION, MemoryEvent, schema_major

#: Longest line of a trace.jsonl (the header with the run's settings is the longest).
MAX_TRACE_LINE_BYTES = 16 * 2**20


class TraceError(ValueError):
    """A trace that can't be used; the message is one line meant for the user."""


@dataclass
class TraceHeader:
    """The first line of a trace: rank, world size, tool version, the run's settings."""

    schema_version: str
    fields: dict[str, Any]


def _check_header(path: str, line: bytes) -> TraceHeader:
    try:
        head = strict_json_loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise TraceError(f"{path}: the first line is not a trace header (invalid JSON)") from None
    except InputRefused as exc:
        raise TraceError(f"{path}: the first line is not a usable trace header ({exc})") from None
    if not isinstance(head, dict) or not isinstance(head.get("header"), dict):
        raise TraceError(f"{path}: the first line is not a MemScope trace header")
    version = head.get("schema_version")
    if not isinstance(version, str) or len(version) > 32:
        raise TraceError(f"{path}: schema_version {version!r:.40} is not of the form MAJOR.MINOR")
    try:
        major = schema_major(version)
    except ValueError as exc:
        raise TraceError(f"{path}: {exc}") from None
    if major != schema_major(SCHEMA_VERSION):
        raise TraceError(
            f"{path}: trace schema_version {version} is not supported by this memscope "
            f"({SCHEMA_VERSION})"
        )
    return TraceHeader(version, head["header"])


def read_trace(
    path: str, max_line_bytes: int = MAX_TRACE_LINE_BYTES
) -> tuple[TraceHeader, Iterator[MemoryEvent]]:
    """The header (read now) and a lazy iterator over the events.

    Only a regular file is read (see :func:`open_regular`); no line may be longer than
    ``max_line_bytes`` or break the JSON bounds of :func:`strict_json_loads`. A torn last
    line (the run was killed mid-write) ends the iteration; any other bad line raises
    :class:`TraceError` naming its line number.
    """
    try:
        f = open_regular(path)
    except InputRefused as exc:
        raise TraceError(f"{path}: {exc}") from None
    try:
        first = f.readline(max_line_bytes + 1)
        if len(first) > max_line_bytes:
            raise TraceError(f"{path}: line 1 is longer than {max_line_bytes} bytes")
        if not first.strip():
            raise TraceError(f"{path}: empty trace")
        header = _check_header(path, first)
    except OSError as exc:
        f.close()
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    except BaseException:
        f.close()
        raise

    def events() -> Iterator[MemoryEvent]:
        with f:
            number = 1
            while True:
                number += 1
                try:
                    line = f.readline(max_line_bytes + 1)
                except OSError as exc:
                    raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
                if not line:
                    return
                if len(line) > max_line_bytes:
                    raise TraceError(f"{path}: line {number} is longer than {max_line_bytes} bytes")
                try:
                    event = MemoryEvent.from_dict(strict_json_loads(line))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    if not line.endswith(b"\n"):
                        return  # a torn last line
                    raise TraceError(f"{path}: line {number} is not valid JSON") from None
                except InputRefused as exc:
                    raise TraceError(f"{path}: line {number}: {exc}") from None
                except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                    raise TraceError(f"{path}: line {number} is not an event ({exc})") from None
                yield event

    return header, events()
