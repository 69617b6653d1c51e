"""The whole-job view of a run: one row per rank, missing and incomplete ranks, imbalance.

Stateless and plain: it takes each rank's runtime report dict (or why there is none) and
returns a JSON-ready summary. Reading the reports is the CLI's business; plotting the
per-rank step series is the reporters'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class RankEntry:
    """One rank of a job: its runtime report, or why there is none."""

    rank: int
    report: dict[str, Any] | None
    problem: str = ""


def job_world_size(entries: Sequence[RankEntry]) -> int:
    """The job's world size: the largest rank seen or the largest ``world_size`` reported."""
    return max(
        [e.rank + 1 for e in entries]
        + [int(e.report.get("world_size") or 0) for e in entries if e.report],
        default=0,
    )


def rank_row(rank: int, report: dict[str, Any]) -> dict[str, Any]:
    """One rank's line: status, parallel coordinates, peak and where, static estimate."""
    meta, peak = report.get("metadata") or {}, report.get("peak") or {}
    comp = report.get("comparisons") or {}
    return {
        "rank": rank,
        "status": report.get("status"),
        "problem": report.get("status_reason", ""),
        "tp_rank": meta.get("tp_rank"),
        "pp_rank": meta.get("pp_rank"),
        "dp_rank": meta.get("dp_rank"),
        "peak_allocated": peak.get("memory_bytes"),
        "peak_reserved": peak.get("reserved_bytes"),
        "peak_step": peak.get("step"),
        "peak_phase": peak.get("phase"),
        "peak_module": peak.get("module"),
        "static_peak": comp.get("static_peak_memory_bytes"),
        "static_diff": comp.get("peak_diff_bytes"),
        "static_ratio": comp.get("peak_diff_ratio"),
    }


def imbalance(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Highest and lowest peak among the ranks that have one, and their ratio (empty if none)."""
    present = [row for row in rows if row.get("peak_allocated")]
    if not present:
        return {}
    hi = max(present, key=lambda row: row["peak_allocated"])
    lo = min(present, key=lambda row: row["peak_allocated"])
    return {
        "max_rank": hi["rank"],
        "max_bytes": hi["peak_allocated"],
        "max_pp_rank": hi.get("pp_rank"),
        "max_tp_rank": hi.get("tp_rank"),
        "min_rank": lo["rank"],
        "min_bytes": lo["peak_allocated"],
        "ratio": hi["peak_allocated"] / lo["peak_allocated"],
    }


def summarize_job(entries: Sequence[RankEntry]) -> dict[str, Any]:
    """Every rank of the job, in order: a row per rank (``missing`` with the reason when a
    rank has no usable report), how many are missing or incomplete, and the imbalance."""
    world = job_world_size(entries)
    by_rank = {e.rank: e for e in entries}
    rows: list[dict[str, Any]] = []
    for rank in range(world):
        entry = by_rank.get(rank)
        if entry is None or entry.report is None:
            reason = entry.problem if entry else "no rank directory / report"
            rows.append({"rank": rank, "status": "missing", "problem": reason})
            continue
        rows.append(rank_row(rank, entry.report))
    return {
        "world_size": world,
        "ranks": rows,
        "missing": sum(row["status"] == "missing" for row in rows),
        "incomplete": sum(row["status"] not in ("complete", "missing") for row in rows),
        "imbalance": imbalance(rows),
    }


def rank_steps(entries: Sequence[RankEntry]) -> dict[int, list[dict[str, Any]]]:
    """Each present rank's per-step rows (``report["steps"]``), by rank, in rank order."""
    by_rank = {e.rank: e for e in entries}
    steps: dict[int, list[dict[str, Any]]] = {}
    for rank in sorted(by_rank):
        report = by_rank[rank].report
        if report is not None and rank >= 0:
            steps[rank] = report.get("steps") or []
    return steps
