"""The analyzers behind a runtime report: a registry, in the order their sections are built.

A new analysis registers a factory here (:func:`register_analyzer`); from then on every report
built live and every ``memscope analyze`` replay runs it, and its declared sections reach the
JSON, Markdown and HTML outputs without an edit to any reporter. A registered analyzer runs
after the built-in ones, so it may read all of their sections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from memscope.analysis.base import Analyzer, replay
from memscope.analysis.hot_spots import HotSpotAnalyzer
from memscope.analysis.modules import ModuleAnalyzer
from memscope.analysis.oom import OomAnalyzer
from memscope.analysis.peak import PeakAnalyzer
from memscope.analysis.phases import PhaseAnalyzer
from memscope.analysis.static_comparison import StaticComparisonAnalyzer, StaticEstimate
from memscope.analysis.step_compositions import StepCompositionAnalyzer
from memscope.analysis.step_transitions import StepTransitionAnalyzer
from memscope.analysis.steps import StepAnalyzer
from memscope.analysis.timeline import AllocatorTimelineAnalyzer
from memscope.events.schema import MemoryEvent


@dataclass(frozen=True)
class AnalyzerSettings:
    """What an analyzer factory may use: the run's settings and its static estimate."""

    top_k: int
    static: StaticEstimate


AnalyzerFactory = Callable[[AnalyzerSettings], Analyzer]

_BUILT_IN: tuple[tuple[str, AnalyzerFactory], ...] = (
    ("allocator_timeline", lambda s: AllocatorTimelineAnalyzer()),
    ("peak", lambda s: PeakAnalyzer()),
    ("phases", lambda s: PhaseAnalyzer()),
    ("hot_spots", lambda s: HotSpotAnalyzer(s.top_k)),
    ("modules", lambda s: ModuleAnalyzer()),
    ("steps", lambda s: StepAnalyzer()),
    ("step_transitions", lambda s: StepTransitionAnalyzer()),
    ("step_compositions", lambda s: StepCompositionAnalyzer()),
    ("static_comparison", lambda s: StaticComparisonAnalyzer(s.static)),
    ("oom", lambda s: OomAnalyzer(s.static)),
)
_REGISTRY: dict[str, AnalyzerFactory] = dict(_BUILT_IN)

#: The report sections the built-in analyzers produce, in the order they are built.
RUNTIME_SECTIONS = tuple(
    spec.name
    for _, factory in _BUILT_IN
    for spec in factory(AnalyzerSettings(1, StaticEstimate(None))).section_specs
)


def register_analyzer(name: str, factory: AnalyzerFactory) -> None:
    """Run ``factory(settings)``'s analyzer in every runtime report from now on, after the
    analyzers registered before it. ``ValueError`` when ``name`` is taken."""
    if name in _REGISTRY:
        raise ValueError(f"an analyzer named {name!r} is already registered")
    _REGISTRY[name] = factory


def unregister_analyzer(name: str) -> None:
    """Stop running the analyzer registered as ``name`` (a built-in one stays)."""
    if name in dict(_BUILT_IN):
        raise ValueError(f"{name!r} is a built-in analyzer")
    _REGISTRY.pop(name, None)


def runtime_analyzers(top_k: int, static: StaticEstimate) -> list[Analyzer]:
    """A fresh set of the runtime report's analyzers (live or for a replay)."""
    settings = AnalyzerSettings(top_k, static)
    return [factory(settings) for factory in _REGISTRY.values()]


def attributed_peak(events: Iterable[MemoryEvent]) -> dict[str, Any]:
    """The ``peak`` section of a trace's events, built as the report builds it (after the
    allocator history, which gives a backend without a composition of its own one): the one
    attributed peak (step, phase, module, microbatch) every output names."""
    peak: dict[str, Any] = replay(events, [AllocatorTimelineAnalyzer(), PeakAnalyzer()])["peak"]
    return peak
