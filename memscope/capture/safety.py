"""Failure isolation: anything inside MemScope that raises is caught, logged once, degraded."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("memscope")


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

    def record(self, site: str, exc: BaseException) -> None:
        entry = self.sites.get(site)
        if entry is None:
            reason = f"{type(exc).__name__}: {exc}"
            where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            loc = f" at {where[0].filename}:{where[0].lineno}" if where else ""
            self.sites[site] = failure_row(site, reason + loc)
            logger.warning(
                "memscope rank %d: %s failed (%s%s); this part of tracing is now off, "
                "training continues",
                self.rank,
                site,
                reason,
                loc,
            )
        else:
            entry["count"] += 1
        if self.sites[site]["count"] >= self.max_failures_per_site:
            self.disabled.add(site)

    def is_disabled(self, site: str) -> bool:
        return site in self.disabled

    def to_list(self) -> list[dict[str, Any]]:
        return [dict(v) for v in self.sites.values()]
