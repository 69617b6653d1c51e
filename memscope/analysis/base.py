"""The analyzer seam: one small stateful consumer of events per report section.

An analyzer folds the event stream (live, from the tracer, or replayed from ``trace.jsonl``)
into bounded state and, when a report is built, returns its section(s). Each analyzer declares
the sections it makes (``section_specs``: name, title, layout, see
:mod:`memscope.events.sections`); :func:`build_sections` pairs every value with its spec, so the
JSON, Markdown and HTML reporters find a new section without being edited. Analyzers run in
list order; a later one may read the sections an earlier one produced (``prior``), e.g. the
static comparison reads ``peak``. An analyzer never reads files, never imports torch and never
writes anything: the session and the CLI do that.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from memscope.events.schema import MemoryEvent
from memscope.events.sections import Section, SectionSet, SectionSpec


class Analyzer(Protocol):
    """Consumes events; produces the report sections it declares in ``section_specs``."""

    @property
    def section_specs(self) -> tuple[SectionSpec, ...]:
        """The sections :meth:`sections` returns, one spec each (a class attribute)."""

    def consume(self, event: MemoryEvent) -> None:
        """Fold one event into this analyzer's state."""

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        """``{section name: JSON-ready value}`` for every declared section, given the
        sections built before it."""


def build_sections(analyzers: Sequence[Analyzer]) -> SectionSet:
    """Every analyzer's sections, in order, each seeing the ones built before it; a section
    an analyzer makes but does not declare (or declares but does not make) is refused."""
    built: list[Section] = []
    for analyzer in analyzers:
        values = analyzer.sections(SectionSet(built))
        specs = {spec.name: spec for spec in analyzer.section_specs}
        if values.keys() != specs.keys():
            raise ValueError(
                f"{type(analyzer).__name__} made the sections {sorted(values)} but declares "
                f"{sorted(specs)} in section_specs"
            )
        built += [Section(spec, values[name]) for name, spec in specs.items()]
    return SectionSet(built)


def replay(events: Iterable[MemoryEvent], analyzers: Sequence[Analyzer]) -> SectionSet:
    """Feed ``events`` to ``analyzers`` and return their sections (offline analysis)."""
    for event in events:
        for analyzer in analyzers:
            analyzer.consume(event)
    return build_sections(analyzers)
