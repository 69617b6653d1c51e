"""The analyzer seam: one small stateful consumer of events per report section.

An analyzer folds the event stream (live, from the tracer, or replayed from ``trace.jsonl``)
into bounded state and, when a report is built, returns its section(s). Analyzers run in list
order; a later one may read the sections an earlier one produced (``prior``), e.g. the static
comparison reads ``peak``. An analyzer never reads files, never imports torch and never
writes anything: the session and the CLI do that.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from memscope.events.schema import MemoryEvent


class Analyzer(Protocol):
    """Consumes events; produces report sections (``{section name: JSON-ready value}``)."""

    def consume(self, event: MemoryEvent) -> None:
        """Fold one event into this analyzer's state."""

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        """This analyzer's report sections, given the sections built before it."""


def build_sections(analyzers: Sequence[Analyzer]) -> dict[str, Any]:
    """Every analyzer's sections, in order, each seeing the ones built before it."""
    out: dict[str, Any] = {}
    for analyzer in analyzers:
        produced = analyzer.sections(out)
        assert not produced.keys() & out.keys(), f"duplicate sections {produced.keys() & out}"
        out.update(produced)
    return out


def replay(events: Iterable[MemoryEvent], analyzers: Sequence[Analyzer]) -> dict[str, Any]:
    """Feed ``events`` to ``analyzers`` and return their sections (offline analysis)."""
    for event in events:
        for analyzer in analyzers:
            analyzer.consume(event)
    return build_sections(analyzers)
