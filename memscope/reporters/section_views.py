"""The generic view of a report section: rows of text cells from its spec and its value.

A section that no output draws by hand (a new analysis) is laid out here once, by its
:class:`~memscope.events.sections.SectionLayout`, and the Markdown and HTML reporters only
escape and place the cells. Plain data in, plain data out; nothing is read or analysed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memscope.events.sections import Column, ColumnKind, SectionLayout, SectionSpec
from memscope.units import format_bytes

#: Longest cell text (a nested value is written as compact JSON, cut here).
MAX_CELL = 200
#: What a cell without a value shows.
EMPTY = "—"


def cell_text(value: Any, kind: ColumnKind = ColumnKind.TEXT) -> str:
    """``value`` as the plain text of a cell of ``kind`` (not yet escaped for any output)."""
    if value is None:
        return EMPTY
    if kind is ColumnKind.BYTES:
        return format_bytes(value)
    if kind is ColumnKind.DELTA:
        return format_bytes(value, signed=True)
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


@dataclass(frozen=True)
class SectionView:
    """A section laid out for any output: a title, column headers and text cells."""

    name: str
    title: str
    layout: SectionLayout
    headers: list[str] = field(default_factory=list)
    kinds: list[ColumnKind] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    #: Rows the section has (``rows`` holds at most ``max_rows`` of them).
    total: int = 0
    #: Said instead of (or after) the rows.
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The view as plain JSON-ready data (the HTML page's payload)."""
        return {
            "name": self.name,
            "title": self.title,
            "layout": self.layout.value,
            "headers": self.headers,
            "kinds": [k.value for k in self.kinds],
            "rows": self.rows,
            "total": self.total,
            "note": self.note,
        }


def column_value(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, or for a dotted key of a nested value (``measured.max_allocated``) the
    value it names; ``None`` where there is none."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _columns(spec: SectionSpec, rows: list[Mapping[str, Any]]) -> tuple[Column, ...]:
    """The spec's columns, or every key of the rows in the order first seen."""
    if spec.columns:
        return spec.columns
    keys = dict.fromkeys(key for row in rows for key in row)
    return tuple(Column(str(key), str(key)) for key in keys)


def section_view(spec: SectionSpec, value: Any, max_rows: int) -> SectionView | None:
    """``value`` laid out by ``spec.layout`` (at most ``max_rows`` rows); ``None`` for a
    section with nothing to show (no value, or kept for tools only)."""
    if value is None or spec.layout is SectionLayout.DATA:
        return None
    columns: tuple[Column, ...] = ()
    rows: list[list[str]] = []
    total, note = 0, ""
    if spec.layout is SectionLayout.KEY_VALUES and isinstance(value, Mapping):
        pairs = [(c.title, c.kind, column_value(value, c.key)) for c in _columns(spec, [value])]
        columns = (Column("key", ""), Column("value", ""))
        rows = [[title, cell_text(v, kind)] for title, kind, v in pairs]
        total = len(rows)
    elif spec.layout is SectionLayout.TABLE and isinstance(value, list):
        items = [row if isinstance(row, Mapping) else {"value": row} for row in value]
        shown = items[:max_rows]
        columns = _columns(spec, shown) if shown else ()
        note = "" if shown else "None."
        rows = [[cell_text(column_value(row, c.key), c.kind) for c in columns] for row in shown]
        total = len(items)
    else:
        note = f"No generic view of this section: the JSON report has it under {spec.name}."
    if len(rows) > max_rows:
        rows = rows[:max_rows]
    if len(rows) < total:
        note = f"{len(rows)} of {total} rows shown."
    return SectionView(
        name=spec.name,
        title=spec.title,
        layout=spec.layout,
        headers=[c.title for c in columns],
        kinds=[c.kind for c in columns],
        rows=rows,
        total=total,
        note=note,
    )
