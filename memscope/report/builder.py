"""The one place a runtime report is built, live (the session) or from a trace (``analyze``).

A :class:`RuntimeReportBuilder` owns what the events are folded into: the registered analyzers
(:mod:`memscope.analysis.runtime_sections`) and the bounded store of events the report keeps.
The caller feeds it every event (the tracer live, the trace reader offline) and, when a report
is due, hands it what only the caller knows (:class:`RunFacts`: who ran, how it ended, what
was written); :meth:`RuntimeReportBuilder.build` returns the JSON-ready document of
:mod:`memscope.reporters.runtime_json`. No I/O and no torch here: the caller writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from memscope.analysis.base import Analyzer, build_sections
from memscope.analysis.runtime_sections import runtime_analyzers
from memscope.analysis.static_comparison import StaticEstimate
from memscope.analysis.steps import StepAnalyzer
from memscope.config import RuntimeConfig
from memscope.events.schema import EventConsumer, MemoryEvent
from memscope.events.trace_store import BoundedTraceStore
from memscope.reporters.runtime_json import RuntimeReportInputs, build_runtime_report

TRACE_POLICY = (
    "step phases for up to 2000 steps (then evenly thinned); module/grad events for the first "
    "detail_steps traced steps; all recorded events in the JSONL trace"
)


#: Bounds on the settings a trace header may carry (a replay holds what they allow).
HEADER_BOUNDS = {"top_k": (1, 10**6), "detail_steps": (0, 10**6), "max_trace_events": (1, 10**8)}


@dataclass(frozen=True)
class ReportSettings:
    """The settings a report is built with (each defined once, on :class:`RuntimeConfig`)."""

    top_k: int
    detail_steps: int
    max_trace_events: int

    @classmethod
    def from_config(cls, config: RuntimeConfig) -> ReportSettings:
        return cls(config.top_k, config.detail_steps, config.max_trace_events)

    @classmethod
    def from_header(cls, config: Mapping[str, Any]) -> ReportSettings:
        """From a trace header's ``config`` block: a setting it lacks takes its default; one
        outside :data:`HEADER_BOUNDS` (the replay's memory follows them) is a ``ValueError``."""
        defaults = cls.from_config(RuntimeConfig())
        values = {}
        for f in fields(cls):
            value = config.get(f.name, getattr(defaults, f.name))
            lo, hi = HEADER_BOUNDS[f.name]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(
                    f"config.{f.name} must be an integer in [{lo}, {hi}], not {value!r:.40}"
                )
            values[f.name] = value
        return cls(**values)


@dataclass
class RunFacts:
    """What the caller knows beyond the events: who ran, how it ended, what was written."""

    metadata: dict[str, Any]
    status: str
    status_reason: str = ""
    #: The training settings memory depends on (``None`` when the adapter has none).
    training: dict[str, Any] | None = None
    #: Events recorded in the run (the store may keep fewer).
    events_recorded: int = 0
    #: The trace file's name (``None``: none written) and the caller's facts about it.
    jsonl: str | None = None
    trace: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)


class RuntimeReportBuilder:
    """The analyzers and the bounded event store of one rank's report."""

    def __init__(self, settings: ReportSettings, static: StaticEstimate) -> None:
        self.settings = settings
        self.store = BoundedTraceStore(settings.detail_steps, settings.max_trace_events)
        self.analyzers: list[Analyzer] = runtime_analyzers(settings.top_k, static)
        self._steps: StepAnalyzer = next(a for a in self.analyzers if isinstance(a, StepAnalyzer))

    @property
    def consumers(self) -> list[EventConsumer]:
        """What every event must reach: the store, then each analyzer."""
        return [self.store, *self.analyzers]

    def consume(self, event: MemoryEvent) -> None:
        """Fold one event in (a replay; live, the tracer feeds :attr:`consumers` itself)."""
        for consumer in self.consumers:
            consumer.consume(event)

    def trace_info(self, facts: RunFacts) -> dict[str, Any]:
        """The report's ``trace`` section: what was recorded and what the report holds."""
        store = self.store
        return {
            "events_recorded": facts.events_recorded,
            "events_in_report": len(store.events),
            "events_not_in_report": store.dropped,
            "detail_steps": store.detail_steps_kept,
            "max_events": store.max_events,
            "step_stride": store.stride,
            "step_summaries_thinned": self._steps.thinned,
            "step_phase_steps_thinned": store.steps_thinned,
            "jsonl": facts.jsonl,
            **facts.trace,
            "policy": TRACE_POLICY,
        }

    def build(self, facts: RunFacts) -> dict[str, Any]:
        """The runtime report as a JSON-ready dict (every registered section included)."""
        return build_runtime_report(
            RuntimeReportInputs(
                metadata=facts.metadata,
                status=facts.status,
                status_reason=facts.status_reason,
                sections=build_sections(self.analyzers),
                events=self.store.events,
                trace_info=self.trace_info(facts),
                training=facts.training,
                errors=facts.errors,
                warnings=facts.warnings,
                artifacts=facts.artifacts,
            )
        )
