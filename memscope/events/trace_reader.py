"""Reads a rank's ``trace.jsonl`` back: its header and its events (torch-free)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from memscope.events.schema import SCHEMA_VERSION, MemoryEvent, schema_major


class TraceError(ValueError):
    """A trace that can't be used; the message is one line meant for the user."""


@dataclass
class TraceHeader:
    """The first line of a trace: rank, world size, tool version, the run's settings."""

    schema_version: str
    fields: dict[str, Any]


def _check_header(path: str, line: str) -> TraceHeader:
    try:
        head = json.loads(line)
    except json.JSONDecodeError:
        raise TraceError(f"{path}: the first line is not a trace header (invalid JSON)") from None
    if not isinstance(head, dict) or not isinstance(head.get("header"), dict):
        raise TraceError(f"{path}: the first line is not a MemScope trace header")
    version = str(head.get("schema_version"))
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


def read_trace(path: str) -> tuple[TraceHeader, Iterator[MemoryEvent]]:
    """The header (read now) and a lazy iterator over the events.

    A torn last line (the run was killed mid-write) ends the iteration; any other bad line
    raises :class:`TraceError` naming its line number.
    """
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 - closed by the generator
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    first = f.readline()
    if not first.strip():
        f.close()
        raise TraceError(f"{path}: empty trace")
    try:
        header = _check_header(path, first)
    except TraceError:
        f.close()
        raise

    def events() -> Iterator[MemoryEvent]:
        with f:
            for number, line in enumerate(f, start=2):
                try:
                    yield MemoryEvent.from_dict(json.loads(line))
                except json.JSONDecodeError:
                    if not line.endswith("\n"):
                        return  # a torn last line
                    raise TraceError(f"{path}: line {number} is not valid JSON") from None
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise TraceError(f"{path}: line {number} is not an event ({exc})") from None

    return header, events()
