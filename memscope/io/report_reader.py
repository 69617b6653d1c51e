"""Reading MemScope reports back, with one readable error for every kind of bad input."""

from __future__ import annotations

import json
import os
from typing import Any

from memscope.events.schema import SCHEMA_VERSION, schema_major


class ReportError(ValueError):
    """A report that can't be used; the message is one line meant for the user."""


def load_report(path: str, expected_type: str | None = None) -> dict[str, Any]:
    """Load and check a MemScope JSON report (``runtime`` or ``static``)."""
    if not os.path.exists(path):
        raise ReportError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ReportError(f"{path}: is a directory, expected a report .json file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None
    if not text.strip():
        raise ReportError(f"{path}: file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        at_end = exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated string")
        kind = "truncated" if at_end else "invalid"
        raise ReportError(
            f"{path}: {kind} JSON at line {exc.lineno} column {exc.colno} ({exc.msg})"
        ) from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, found {type(data).__name__}")
    version = data.get("schema_version")
    if version is None:
        raise ReportError(f"{path}: no schema_version; not a MemScope report")
    try:
        major = schema_major(version)
    except ValueError as exc:
        raise ReportError(f"{path}: {exc}") from None
    supported = schema_major(SCHEMA_VERSION)
    if major > supported:
        raise ReportError(
            f"{path}: schema_version {version} is newer than this memscope supports "
            f"({SCHEMA_VERSION}); upgrade memscope"
        )
    if major < supported:
        raise ReportError(
            f"{path}: schema_version {version} is no longer supported ({SCHEMA_VERSION})"
        )
    if expected_type is not None and data.get("report_type") != expected_type:
        raise ReportError(
            f"{path}: is a {data.get('report_type')!r} report, expected {expected_type!r}"
        )
    return data
