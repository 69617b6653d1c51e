"""The whole-job view of a run: one row per rank, missing and incomplete ranks, imbalance.

Ranks nobody reported are listed compactly (one row per run of them), so the rows are bounded
by the rank folders present, whatever world size a report claims.

Stateless and plain: it takes each rank's runtime report dict (or why there is none) and
returns a JSON-ready summary. Reading the reports is the CLI's business; plotting the
per-rank step series is the reporters'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memscope.analysis.cross_rank import explain_job
from memscope.downsample import downsample_indices

#: What the job view keeps of a rank's runtime report (its events and tables are dropped):
#: a rank summary, as a job directory's reports give it or as ranks exchange it in-run.
SUMMARY_KEYS = ("schema_version", "report_type", "rank", "world_size", "status", "status_reason",
                "metadata", "training", "peak", "comparisons", "steps", "oom")  # fmt: skip
#: Step rows a rank summary keeps (min/max per bucket of the per-step peak, the peak kept),
#: and the columns of each.
SUMMARY_STEPS = 64
SUMMARY_STEP_KEYS = ("step", "allocated_start", "allocated_end", "reserved_end",
                     "peak_allocated", "peak_reserved", "peak_phase")  # fmt: skip
#: Items of the peak's composition a rank summary keeps (the largest; per-category totals
#: stay in ``peak.categories``).
SUMMARY_ITEMS = 16


@dataclass
class RankEntry:
    """One rank of a job: its runtime report, or why there is none."""

    rank: int
    report: dict[str, Any] | None
    problem: str = ""
    #: Where the report came from, as the user knows it (its rank folder's name).
    where: str = ""
    #: The rank's own page, relative to the job page (when one was written).
    page: str | None = None

    @property
    def name(self) -> str:
        return self.where or f"rank {self.rank}"

    @property
    def run_id(self) -> str:
        """The report's run id (``unknown`` without one)."""
        return str(((self.report or {}).get("metadata") or {}).get("run_id") or "unknown")


def rank_summary(report: Mapping[str, Any], max_steps: int = SUMMARY_STEPS) -> dict[str, Any]:
    """What the job view needs of one rank's report, small enough to send between ranks:
    :data:`SUMMARY_KEYS`, with the step rows thinned to ``max_steps`` (``steps_total`` says
    how many there were) and to :data:`SUMMARY_STEP_KEYS`, and the peak's composition to its
    :data:`SUMMARY_ITEMS` largest items (``items_total``)."""
    out = {k: report[k] for k in SUMMARY_KEYS if k in report}
    peak = out.get("peak")
    if isinstance(peak, dict) and isinstance(peak.get("composition"), dict):
        composition = peak["composition"]
        items = composition.get("items")
        if isinstance(items, list) and len(items) > SUMMARY_ITEMS:
            kept = {**composition, "items": items[:SUMMARY_ITEMS], "items_total": len(items)}
            out["peak"] = {**peak, "composition": kept}
    steps = report.get("steps")
    if isinstance(steps, list) and all(isinstance(row, dict) for row in steps):
        if len(steps) > max_steps:
            peaks = [_number(row.get("peak_allocated")) for row in steps]
            out["steps_total"] = len(steps)
            steps = [steps[i] for i in downsample_indices(peaks, max_steps)]
        out["steps"] = [{k: row[k] for k in SUMMARY_STEP_KEYS if k in row} for row in steps]
    return out


def _number(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else 0.0


def _count(value: Any) -> int | None:
    """``value`` if it is a non-negative integer (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def job_world_size(entries: Sequence[RankEntry]) -> int:
    """The job's world size: what the reports agree on (widened to the highest rank that has
    a report), else the largest rank seen or the largest ``world_size`` reported. A folder
    without a report beyond the agreed size is a stray (:func:`stray_entries`), not a rank.

    A claim costs nothing: ranks nobody reported are one compact row per gap in
    :func:`summarize_job`, so ``world_size: 10**12`` can't make the page allocate."""
    claims = {_count(e.report.get("world_size")) for e in entries if e.report}
    claims.discard(None)
    reported = [e.rank + 1 for e in entries if e.rank >= 0 and not _empty_folder(e)]
    if len(claims) == 1:
        (agreed,) = claims
        assert agreed is not None
        return max([agreed, *reported])
    return max(
        [e.rank + 1 for e in entries if e.rank >= 0] + [c for c in claims if c is not None],
        default=0,
    )


def _empty_folder(entry: RankEntry) -> bool:
    """A rank folder on disk without a usable report (not a rank a job summary names)."""
    return entry.report is None and bool(entry.where)


def stray_entries(entries: Sequence[RankEntry], world: int) -> list[RankEntry]:
    """Folders beyond the job's world size with no report: leftovers (another run's, an
    empty folder), named apart, never counted as missing ranks."""
    return [e for e in entries if e.rank >= world and _empty_folder(e)]


def rank_row(rank: int, report: dict[str, Any]) -> dict[str, Any]:
    """One rank's line: status, parallel coordinates, peak and where, static estimate."""
    meta, peak = report.get("metadata") or {}, report.get("peak") or {}
    comp = report.get("comparisons") or {}
    in_flight = comp.get("in_flight") or {}
    return {
        "rank": rank,
        "run_id": meta.get("run_id"),
        "status": report.get("status"),
        "problem": report.get("status_reason", ""),
        "tp_rank": meta.get("tp_rank"),
        "pp_rank": meta.get("pp_rank"),
        "dp_rank": meta.get("dp_rank"),
        "cp_rank": meta.get("cp_rank"),
        "ep_rank": meta.get("ep_rank"),
        "peak_allocated": peak.get("memory_bytes"),
        "peak_reserved": peak.get("reserved_bytes"),
        "peak_step": peak.get("step"),
        "peak_phase": peak.get("phase"),
        "peak_module": peak.get("module"),
        "static_peak": comp.get("static_peak_memory_bytes"),
        "static_diff": comp.get("peak_diff_bytes"),
        "static_ratio": comp.get("peak_diff_ratio"),
        "terms": peak.get("categories"),
        "predicted_terms": {
            str(row.get("component")): row.get("static_bytes")
            for row in comp.get("components") or []
            if isinstance(row, dict) and row.get("static_bytes") is not None
        }
        or None,
        "in_flight_measured": (in_flight.get("measured") or {}).get("microbatches"),
        "in_flight_predicted": in_flight.get("predicted"),
        **_oom_and_headroom(report),
    }


def _oom_and_headroom(report: dict[str, Any]) -> dict[str, Any]:
    """Where an OOMed rank failed; for the others, the device memory their peak left free
    (the device's total, or the storage backend's capacity, from ``metadata.backend_info``,
    minus the reserved peak)."""
    oom = report.get("oom") or {}
    if oom:
        return {"oom_where": oom.get("where"), "oom_verdict": oom.get("verdict")}
    peak = report.get("peak") or {}
    device = (report.get("metadata") or {}).get("backend_info") or {}
    total = _count(device.get("device_total_bytes")) or _count(device.get("capacity_bytes"))
    reserved = _count(peak.get("reserved_bytes"))
    if not total or reserved is None:
        return {}
    return {"capacity": total, "headroom": total - reserved}


def oom_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Which ranks ran out of memory (and where), and the tightest headroom among the rest."""
    ooms = [{"rank": r["rank"], "where": r.get("oom_where"), "verdict": r.get("oom_verdict")}
            for r in rows if r.get("status") == "oom"]  # fmt: skip
    room = [r for r in rows if isinstance(r.get("headroom"), int)]
    tightest = min(room, key=lambda r: r["headroom"]) if room else None
    return {
        "ranks": ooms,
        "tightest_rank": None if tightest is None else tightest["rank"],
        "tightest_headroom": None if tightest is None else tightest["headroom"],
        "ranks_with_headroom": len(room),
    }


def _peak(row: dict[str, Any]) -> float | None:
    value = row.get("peak_allocated")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def imbalance(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Highest and lowest peak among the ranks that have one, and their ratio (empty if none)."""
    present = [(peak, row) for row in rows if (peak := _peak(row)) is not None]
    if not present:
        return {}
    hi = max(present, key=lambda p: p[0])[1]
    lo = min(present, key=lambda p: p[0])[1]
    return {
        "max_rank": hi["rank"],
        "max_bytes": hi["peak_allocated"],
        "max_pp_rank": hi.get("pp_rank"),
        "max_tp_rank": hi.get("tp_rank"),
        "min_rank": lo["rank"],
        "min_bytes": lo["peak_allocated"],
        "ratio": hi["peak_allocated"] / lo["peak_allocated"],
    }


#: The parallel coordinates that place a rank in the grid: no two ranks of a run share them.
COORDINATES = ("pp_rank", "tp_rank", "dp_rank", "cp_rank", "ep_rank")
#: How many folders (or runs of consecutive folders) a problem names before "and N more".
NAMED = 4


def _names(entries: Sequence[RankEntry]) -> str:
    """The entries' names, consecutive ranks as one range, at most :data:`NAMED` of them."""
    spans: list[list[RankEntry]] = []
    for e in sorted(entries, key=lambda e: e.rank):
        if spans and e.rank == spans[-1][-1].rank + 1:
            spans[-1].append(e)
        else:
            spans.append([e])
    text = [s[0].name if len(s) == 1 else f"{s[0].name}..{s[-1].name}" for s in spans[:NAMED]]
    more = f" and {len(spans) - NAMED} more" if len(spans) > NAMED else ""
    return ", ".join(text) + more


def _grouped(entries: Sequence[RankEntry], key: Any) -> dict[Any, list[RankEntry]]:
    groups: dict[Any, list[RankEntry]] = {}
    for e in entries:
        k = key(e)
        if k is not None:
            groups.setdefault(k, []).append(e)
    return groups


def _coordinates(e: RankEntry) -> tuple[int, ...] | None:
    meta = (e.report or {}).get("metadata") or {}
    coords = tuple(meta.get(k) for k in COORDINATES)
    return coords if all(_count(c) is not None for c in coords) else None  # type: ignore[return-value]


def job_mixups(entries: Sequence[RankEntry]) -> dict[str, str]:
    """What says the rank reports of ``entries`` are not one launch's, by kind (``runs``,
    ``world_size``, ``rank``, ``coordinates``), each one sentence naming the folders; empty
    when they agree. Ranks without a report are not judged."""
    reported = [e for e in entries if e.report is not None]
    out: dict[str, str] = {}
    runs = _grouped(reported, lambda e: e.run_id)
    if len(runs) > 1:
        ordered = sorted(runs.items(), key=lambda kv: (-len(kv[1]), kv[1][0].rank))
        out["runs"] = f"rank reports of {len(runs)} runs: " + ", ".join(
            f"{run} ({_names(group)})" for run, group in ordered[:NAMED]
        )
    worlds = _grouped(reported, lambda e: _count((e.report or {}).get("world_size")))
    if len(worlds) > 1:
        out["world_size"] = "world sizes disagree: " + ", ".join(
            f"{size} ({_names(group)})" for size, group in sorted(worlds.items())
        )
    claimed = _grouped(reported, lambda e: _count((e.report or {}).get("rank")))
    twice = [(rank, group) for rank, group in sorted(claimed.items()) if len(group) > 1]
    counted = {id(e) for _, group in twice for e in group}
    moved = [e for e in reported if id(e) not in counted
             and _count((e.report or {}).get("rank")) not in (None, e.rank)]  # fmt: skip
    if twice or moved:
        said = [f"rank {rank} claimed by {_names(group)}" for rank, group in twice[:NAMED]]
        said += [f"{e.name} holds rank {(e.report or {}).get('rank')}'s report"
                 for e in moved[: max(0, NAMED - len(said))]]  # fmt: skip
        out["rank"] = "; ".join(said)
    grid = _grouped(reported, _coordinates)
    shared = [(c, group) for c, group in sorted(grid.items()) if len(group) > 1]
    if shared:
        out["coordinates"] = "; ".join(
            "grid position "
            + " ".join(f"{k[:-5]}{v}" for k, v in zip(COORDINATES, c, strict=True))
            + f" claimed by {_names(group)}"
            for c, group in shared[:NAMED]
        ) + (f" and {len(shared) - NAMED} more" if len(shared) > NAMED else "")
    return out


def entries_of_run(entries: Sequence[RankEntry], run_id: str) -> list[RankEntry]:
    """The entries of run ``run_id`` (and those without a report, whose run is unknown)."""
    return [e for e in entries if e.report is None or e.run_id == run_id]


NO_REPORT = "no rank directory / report"


def _gap(first: int, last: int) -> dict[str, Any]:
    """One row for ranks ``first..last`` that nobody reported (however many there are)."""
    if first == last:
        return {"rank": first, "status": "missing", "problem": NO_REPORT}
    count = last - first + 1
    return {
        "rank": first,
        "last_rank": last,
        "count": count,
        "status": "missing",
        "problem": f"{NO_REPORT} (ranks {first}-{last}: {count} ranks)",
    }


def summarize_job(entries: Sequence[RankEntry]) -> dict[str, Any]:
    """Every rank of the job, in order: a row per rank that has a folder (``missing`` with the
    reason when it has no usable report), one row per run of ranks up to the world size that
    have none (``rank``..``last_rank``, ``count``), how many are missing or incomplete, the
    imbalance, and what says the reports are not one launch's (``mixups``, see
    :func:`job_mixups`; with the runs, in ``runs_warning``). Rows are bounded by the entries
    given, never by a claimed world size; the first entry of a rank counts, a duplicate is
    ignored."""
    world = job_world_size(entries)
    strays = stray_entries(entries, world)
    by_rank: dict[int, RankEntry] = {}
    for e in entries:
        if e.rank >= 0 and e not in strays:
            by_rank.setdefault(e.rank, e)
    rows: list[dict[str, Any]] = []
    missing = 0
    expected = 0  # the next rank a row is owed to
    for rank in sorted(by_rank):
        if rank > expected:
            rows.append(_gap(expected, rank - 1))
            missing += rank - expected
        entry = by_rank[rank]
        if entry.report is None:
            rows.append({"rank": rank, "status": "missing", "problem": entry.problem or NO_REPORT})
            missing += 1
        else:
            rows.append(rank_row(rank, entry.report))
            if entry.page:
                rows[-1]["page"] = entry.page
        expected = rank + 1
    if world > expected:
        rows.append(_gap(expected, world - 1))
        missing += world - expected
    runs, warning = _runs(rows)
    mixups = job_mixups([e for e in entries if e.rank >= 0])
    others = [text for kind, text in mixups.items() if kind != "runs"]
    return {
        "world_size": world,
        "ranks": rows,
        "missing": missing,
        "incomplete": sum(row["status"] not in ("complete", "missing") for row in rows),
        "imbalance": imbalance(rows),
        "oom": oom_summary(rows),
        **explain_job(rows),
        "runs": runs,
        "mixups": mixups,
        "runs_warning": "; ".join(([warning] if warning else []) + others),
        "strays": [
            {"rank": e.rank, "where": e.where or e.name, "problem": e.problem or NO_REPORT}
            for e in strays
        ],
    }


def _runs(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Which runs the rank reports come from (most ranks first); each row of a run other than
    the main one is flagged ``other_run``, and a warning says the folder mixes runs."""
    counts: dict[str, int] = {}
    for row in rows:
        if row["status"] != "missing":
            key = str(row.get("run_id") or "unknown")
            counts[key] = counts.get(key, 0) + 1
    runs = [{"run_id": k, "ranks": n} for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    if len(runs) < 2:
        return runs, ""
    main = runs[0]["run_id"]
    for row in rows:
        if row["status"] != "missing" and str(row.get("run_id") or "unknown") != main:
            row["other_run"] = True
    others = ", ".join(f"{r['run_id']} ({r['ranks']} ranks)" for r in runs[1:5])
    more = f" and {len(runs) - 5} more" if len(runs) > 5 else ""
    return runs, (
        f"rank reports come from {len(runs)} runs: {main} ({runs[0]['ranks']} ranks), "
        f"{others}{more}; the rows marked 'other run' are not from the main run"
    )


def rank_steps(entries: Sequence[RankEntry]) -> dict[int, list[dict[str, Any]]]:
    """Each present rank's per-step rows (``report["steps"]``), by rank, in rank order."""
    by_rank = {e.rank: e for e in entries}
    steps: dict[int, list[dict[str, Any]]] = {}
    for rank in sorted(by_rank):
        report = by_rank[rank].report
        if report is not None and rank >= 0:
            steps[rank] = report.get("steps") or []
    return steps
