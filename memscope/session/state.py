"""The lifecycle state of a tracing session and the status its report carries."""

from __future__ import annotations

from enum import Enum


class SessionState(Enum):
    """Where a :class:`~memscope.session.TracingSession` is in its lifecycle.

    ``IDLE -> STARTING -> TRACING -> STOPPING -> FINALIZED``; ``DISABLED`` when this rank is
    not traced (every call is then a no-op). A start that fails unwinds to ``FINALIZED``.
    """

    DISABLED = "disabled"
    IDLE = "idle"
    STARTING = "starting"
    TRACING = "tracing"
    STOPPING = "stopping"
    FINALIZED = "finalized"


class ReportStatus(str, Enum):
    """The ``status`` field of a runtime report."""

    RUNNING = "running"
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    CRASHED = "crashed"
    OOM = "oom"
