"""Report sections as typed data: what a section is called, how it is drawn, and its value.

An analyzer declares a :class:`SectionSpec` for every section it makes; the report builder
pairs each spec with the value the analyzer produced (:class:`Section`) and writes the specs,
in the order pages show them, as the report's ``sections`` index. Reporters iterate that index
(from the JSON alone, never from analyzers): a section whose ``renderer`` an output has is
drawn by it, any other by the generic renderer of its :class:`SectionLayout`. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

#: The report key under which the builder writes the section index.
INDEX_KEY = "sections"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: Longest title or renderer name read from a report's index.
_MAX_TEXT = 200


class SectionLayout(str, Enum):
    """How a section is drawn where no output has a special renderer for it."""

    #: a JSON object: one line (Markdown) or row (HTML) per key
    KEY_VALUES = "key_values"
    #: a list of JSON objects: one table row each, columns from ``columns`` or the rows' keys
    TABLE = "table"
    #: no generic form: only the outputs that have its ``renderer`` draw it
    CUSTOM = "custom"
    #: kept in the JSON for other tools (diff, job pages), shown on no page
    DATA = "data"


class ColumnKind(str, Enum):
    """How a value of a column is written."""

    TEXT = "text"
    #: a name shown literally (a module path, a file)
    CODE = "code"
    BYTES = "bytes"
    #: a signed byte count (a change)
    DELTA = "delta"


@dataclass(frozen=True)
class Column:
    """One key of a section's rows (or of its object), its title and how it is written."""

    key: str
    title: str
    kind: ColumnKind = ColumnKind.TEXT

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "title": self.title, "kind": self.kind.value}

    @classmethod
    def from_dict(cls, data: Any) -> Column:
        if not isinstance(data, Mapping):
            raise ValueError(f"a column must be an object, not {type(data).__name__}")
        return cls(
            _text(data.get("key"), "column key"),
            _text(data.get("title"), "column title"),
            ColumnKind(data.get("kind", ColumnKind.TEXT.value)),
        )


@dataclass(frozen=True)
class SectionSpec:
    """What a report section is: its JSON key, title, layout, special renderer and columns.

    ``renderer`` names a renderer an output may have for this section (the HTML page draws
    ``peak`` with its own charts); an output without it draws the section by ``layout``.
    ``order`` places it among the sections on every page (lower first; ties keep the order
    the analyzers run in).
    """

    name: str
    title: str
    layout: SectionLayout
    renderer: str = ""
    columns: tuple[Column, ...] = ()
    order: int = 100

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"section name {self.name!r:.70} is not a lowercase identifier")

    def to_dict(self) -> dict[str, Any]:
        """The section's entry in the report's index (``order`` is the index's order)."""
        out: dict[str, Any] = {"name": self.name, "title": self.title, "layout": self.layout.value}
        if self.renderer:
            out["renderer"] = self.renderer
        if self.columns:
            out["columns"] = [c.to_dict() for c in self.columns]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> SectionSpec:
        """An index entry read back; ``ValueError`` for one that is not one."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a section entry must be an object, not {type(data).__name__}")
        columns = data.get("columns") or []
        if not isinstance(columns, list):
            raise ValueError("a section's columns must be a list")
        return cls(
            name=_text(data.get("name"), "section name"),
            title=_text(data.get("title"), "section title"),
            layout=SectionLayout(data.get("layout")),
            renderer=_text(data.get("renderer", ""), "section renderer"),
            columns=tuple(Column.from_dict(c) for c in columns),
        )


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ValueError(f"{what} must be a string of at most {_MAX_TEXT} characters")
    return value


@dataclass(frozen=True)
class Section:
    """One built section: its spec and its JSON-ready value."""

    spec: SectionSpec
    value: Any


class SectionSet(Mapping[str, Any]):
    """The sections of one report, in the order they were built; reads as ``{name: value}``
    (so an analyzer's ``prior`` and the callers of a replay index it by name)."""

    def __init__(self, sections: Sequence[Section] = ()) -> None:
        self.sections = tuple(sections)
        self._by_name: dict[str, Section] = {}
        for section in self.sections:
            name = section.spec.name
            if name in self._by_name:
                raise ValueError(f"two analyzers make the section {name!r}")
            self._by_name[name] = section

    def __getitem__(self, name: str) -> Any:
        return self._by_name[name].value

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def shown(self) -> list[Section]:
        """The sections in the order pages show them (:attr:`SectionSpec.order`)."""
        return sorted(self.sections, key=lambda s: s.spec.order)

    def index(self) -> list[dict[str, Any]]:
        """The report's ``sections`` index: every spec, in the order pages show them."""
        return [s.spec.to_dict() for s in self.shown()]


#: The sections of a report written before the index (schema 1.1 without ``sections``), in
#: the order pages show them; each is drawn by its own renderer (``step_compositions``: data).
PRE_INDEX_SECTIONS = (
    *(
        SectionSpec(name, name, SectionLayout.CUSTOM, name)
        for name in ("oom", "peak", "allocator_timeline", "comparisons", "phase_summary",
                     "top_events", "module_summary", "step_transitions", "steps")
    ),
    SectionSpec("step_compositions", "step_compositions", SectionLayout.DATA),
)  # fmt: skip


def report_sections(report: Mapping[str, Any]) -> list[SectionSpec]:
    """The sections a report holds, in the order pages show them: its index, or for a report
    written before the index, :data:`PRE_INDEX_SECTIONS`. ``ValueError`` for a bad index."""
    index = report.get(INDEX_KEY)
    if index is None:
        return list(PRE_INDEX_SECTIONS)
    if not isinstance(index, list):
        raise ValueError(f"{INDEX_KEY} must be a list, not {type(index).__name__}")
    specs: list[SectionSpec] = []
    for i, entry in enumerate(index):
        try:
            specs.append(SectionSpec.from_dict(entry))
        except ValueError as exc:
            raise ValueError(f"{INDEX_KEY}[{i}]: {exc}") from None
    return specs
