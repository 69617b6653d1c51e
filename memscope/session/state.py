"""The lifecycle state of a tracing session and the status its report carries."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memscope.capture.safety import FailureLog

#: Sites whose loss leaves the report complete: an extra reading each step row marks as
#: absent (``host_rss_end`` missing), not a gap in what was traced.
OPTIONAL_SITES = frozenset({"host_rss"})


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


def parts_turned_off(failures: FailureLog) -> str:
    """'' when every part of tracing ran to the end; else which turned itself off after a
    failure (a callback, a hook family, a sampler), each with its first reason: what makes a
    finished report ``incomplete`` rather than ``complete``."""
    off = [
        f"{site} ({failures.sites[site]['first_error']})" if site in failures.sites else site
        for site in sorted(failures.disabled - OPTIONAL_SITES)
    ]
    if not off:
        return ""
    return "parts of tracing turned themselves off after a failure: " + "; ".join(off)


def final_status(
    status: ReportStatus, reason: str, failures: FailureLog
) -> tuple[ReportStatus, str]:
    """The status (and its reason) a report ends with at ``finalize``: a status already set
    (crashed, OOM, incomplete) stays; else ``complete`` unless a part turned itself off."""
    if status is not ReportStatus.RUNNING:
        return status, reason
    off = parts_turned_off(failures)
    return (ReportStatus.INCOMPLETE, off) if off else (ReportStatus.COMPLETE, "")
