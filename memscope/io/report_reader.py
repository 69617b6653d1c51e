"""Reading MemScope reports back, with one readable error for every kind of bad input.

Bounded: only a regular file is opened (a FIFO or ``/dev/zero`` is refused at once), at most
:func:`max_report_bytes` of it (512 MiB unless ``MEMSCOPE_MAX_REPORT_BYTES`` says otherwise),
parsed with the shared JSON bounds of :func:`memscope.events.trace_reader.strict_json_loads`
(no NaN/Infinity, no number beyond +-2**63, nesting at most 64 deep). The few numbers every
consumer relies on (``rank``, ``world_size``, the peak's byte counts) are checked too.
"""

from __future__ import annotations

import json
import os
from typing import Any

from memscope.events.bounded_input import InputRefused, read_regular, strict_json_loads
from memscope.events.schema import SCHEMA_VERSION, schema_major

#: Largest report read by default (the runtime report of a 1,000,000-event run is ~300 MiB).
DEFAULT_MAX_REPORT_BYTES = 512 * 2**20
#: Environment variable that overrides :data:`DEFAULT_MAX_REPORT_BYTES` (a byte count).
MAX_REPORT_BYTES_ENV = "MEMSCOPE_MAX_REPORT_BYTES"


class ReportError(ValueError):
    """A report that can't be used; the message is one line meant for the user."""


def max_report_bytes() -> int:
    """The size cap on a report: ``$MEMSCOPE_MAX_REPORT_BYTES`` if it is a positive integer,
    else :data:`DEFAULT_MAX_REPORT_BYTES`."""
    raw = os.environ.get(MAX_REPORT_BYTES_ENV, "").strip()
    if raw.isdigit() and 0 < int(raw) < 2**62:
        return int(raw)
    return DEFAULT_MAX_REPORT_BYTES


def _is_count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _check_numbers(path: str, data: dict[str, Any]) -> None:
    """The numbers every reader of a runtime report relies on are sane (or absent)."""
    for key in ("rank", "world_size"):
        if not _is_count(data.get(key)):
            raise ReportError(
                f"{path}: {key} must be a non-negative integer, not {data[key]!r:.40}"
            )
    rank, world = data.get("rank"), data.get("world_size")
    if rank is not None and world is not None and rank >= world:
        raise ReportError(f"{path}: rank {rank} is not below world_size {world}")
    peak = data.get("peak")
    if peak is not None and not isinstance(peak, dict):
        raise ReportError(f"{path}: peak must be an object, not {type(peak).__name__}")
    for key in ("memory_bytes", "reserved_bytes"):
        value = (peak or {}).get(key)
        if not _is_count(value):
            raise ReportError(
                f"{path}: peak.{key} must be a non-negative integer, not {value!r:.40}"
            )


#: What every reader of a report of each type relies on: the section and its JSON type.
#: (Sections added in later minor versions are optional; these were in every 1.x report.)
REQUIRED_SECTIONS: dict[str, dict[str, type]] = {
    "runtime": {
        "rank": int, "world_size": int, "status": str, "metadata": dict, "peak": dict,
        "steps": list,
    },
}  # fmt: skip
# (a job summary's lists are checked, with their own words, where it is read)


def _check_sections(path: str, data: dict[str, Any]) -> None:
    """A report of a known type has every section its readers need, each of its type."""
    required = REQUIRED_SECTIONS.get(str(data.get("report_type")), {})
    missing = [key for key in required if key not in data]
    if missing:
        names = ", ".join(missing[:6]) + (", ..." if len(missing) > 6 else "")
        raise ReportError(
            f"{path}: not a complete {data['report_type']} report: no {names} (a report "
            "MemScope writes always has them; was it cut or edited?)"
        )
    for key, kind in required.items():
        value = data[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            name = _JSON_NAMES[kind]
            article = "an" if name[0] in "aeiou" else "a"
            raise ReportError(f"{path}: {key} must be {article} {name}, not {type(value).__name__}")


_JSON_NAMES = {int: "integer", str: "string", dict: "object", list: "list"}


def load_report(path: str, expected_type: str | None = None) -> dict[str, Any]:
    """Load and check a MemScope JSON report (``runtime`` or ``static``)."""
    try:
        raw = read_regular(path, max_report_bytes())
    except InputRefused as exc:
        raise ReportError(f"{path}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: cannot read: not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise ReportError(f"{path}: file is empty")
    try:
        data = strict_json_loads(text)
    except json.JSONDecodeError as exc:
        at_end = exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated string")
        kind = "truncated" if at_end else "invalid"
        raise ReportError(
            f"{path}: {kind} JSON at line {exc.lineno} column {exc.colno} ({exc.msg})"
        ) from None
    except InputRefused as exc:
        raise ReportError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, found {type(data).__name__}")
    version = data.get("schema_version")
    if version is None:
        raise ReportError(f"{path}: no schema_version; not a MemScope report")
    if not isinstance(version, str) or len(version) > 32:
        raise ReportError(f"{path}: schema_version {version!r:.40} is not of the form MAJOR.MINOR")
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
            f"{path}: is a {data.get('report_type')!r:.40} report, expected {expected_type!r}"
        )
    _check_sections(path, data)
    if data.get("report_type") == "runtime":
        _check_numbers(path, data)
    return data
