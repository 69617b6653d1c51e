"""Failure isolation: anything inside MemScope that raises is caught, logged once, degraded."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("memscope")


def _describe(exc: BaseException) -> str:
    """``Type: message at file:line``, even for an exception whose ``__str__`` raises."""
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    reason = f"{type(exc).__name__}: {text}"[:2000]
    try:
        where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    except Exception:
        where = []
    return reason + (f" at {where[0].filename}:{where[0].lineno}" if where else "")


def failure_row(site: str, reason: str, count: int = 1) -> dict[str, Any]:
    """One row of a report's ``errors``: where, how often, the first reason."""
    return {"site": site, "count": count, "first_error": reason}


@dataclass
class FailureLog:
    """Per-site failure counts with the first reason; sites that failed can be disabled."""

    rank: int = 0
    max_failures_per_site: int = 1
    sites: dict[str, dict[str, Any]] = field(default_factory=dict)
    disabled: set[str] = field(default_factory=set)

    def record(self, site: str, exc: BaseException, disable: bool = True) -> None:
        """Count a failure at ``site``; the first one is logged with its reason. ``disable``
        switches the site off (a transient failure, e.g. a full disk, leaves it on to retry).

        Never raises, whatever ``exc`` does when printed."""
        try:
            entry = self.sites.get(site)
            if entry is None:
                reason = _describe(exc)
                self.sites[site] = failure_row(site, reason)
                logger.warning(
                    "memscope rank %d: %s failed (%s); %s, training continues",
                    self.rank,
                    site,
                    reason,
                    "this part of tracing is now off" if disable else "it will be retried",
                )
            else:
                entry["count"] += 1
            if disable and self.sites[site]["count"] >= self.max_failures_per_site:
                self.disabled.add(site)
        except Exception:
            self.disabled.add(site)

    def is_disabled(self, site: str) -> bool:
        return site in self.disabled

    def to_list(self) -> list[dict[str, Any]]:
        return [dict(v) for v in self.sites.values()]
