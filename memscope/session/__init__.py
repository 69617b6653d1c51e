"""The framework-neutral tracing session (lifecycle, analyzers, reports, crash handling)."""

from memscope.session.session import StaticEstimateProvider, TracingSession
from memscope.session.state import ReportStatus, SessionState

__all__ = ["ReportStatus", "SessionState", "StaticEstimateProvider", "TracingSession"]
