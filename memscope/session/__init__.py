"""The framework-neutral tracing session (lifecycle, analyzers, reports, crash handling)."""

from memscope.session.adapter_facts import AdapterFacts, StaticEstimateProvider
from memscope.session.session import TracingSession
from memscope.session.state import ReportStatus, SessionState

__all__ = [
    "AdapterFacts",
    "ReportStatus",
    "SessionState",
    "StaticEstimateProvider",
    "TracingSession",
]
