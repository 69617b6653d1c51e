"""The analyzers behind a runtime report, in the order their sections are built."""

from __future__ import annotations

from collections.abc import Iterable
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

#: The report sections the default analyzers produce.
RUNTIME_SECTIONS = (
    "allocator_timeline",
    "peak",
    "phase_summary",
    "top_events",
    "module_summary",
    "steps",
    "step_transitions",
    "step_compositions",
    "comparisons",
    "oom",
)


def runtime_analyzers(top_k: int, static: StaticEstimate) -> list[Analyzer]:
    """A fresh set of the runtime report's analyzers (live or for a replay)."""
    return [
        AllocatorTimelineAnalyzer(),
        PeakAnalyzer(),
        PhaseAnalyzer(),
        HotSpotAnalyzer(top_k),
        ModuleAnalyzer(),
        StepAnalyzer(),
        StepTransitionAnalyzer(),
        StepCompositionAnalyzer(),
        StaticComparisonAnalyzer(static),
        OomAnalyzer(static),
    ]


def attributed_peak(events: Iterable[MemoryEvent]) -> dict[str, Any]:
    """The ``peak`` section of a trace's events, built as the report builds it (after the
    allocator history, which gives a backend without a composition of its own one): the one
    attributed peak (step, phase, module, microbatch) every output names."""
    return replay(events, [AllocatorTimelineAnalyzer(), PeakAnalyzer()])["peak"]
