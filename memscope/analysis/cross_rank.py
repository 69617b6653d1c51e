"""The whole job explained by term: per pipeline stage, who peaks, why, and how close to full.

Stateless and plain: it takes the job's rank rows (:func:`memscope.analysis.job.rank_row`:
parallel coordinates, peak, the bytes per term at the peak, in-flight microbatches measured
and predicted, headroom) and returns

* ``stages``: per pipeline stage, its ranks' highest, median and lowest peak, the heaviest
  rank with its terms (measured, and as the static estimate predicted them), the
  (chunk-)microbatches it had in flight at the peak against what Megatron's schedule
  arithmetic predicts, and the rank with the least headroom with its *binding term* (the
  largest term at that rank's peak: what a remedy must shrink);
* ``imbalance``: the heaviest stage against the lightest, term by term, in one sentence;
* ``outliers``: ranks whose peak is off their stage's median by more than
  :data:`OUTLIER_SHARE`, with the term that differs most;
* ``grid``: peak allocated over pipeline stage (rows) x the other coordinates (columns), with
  each cell's terms for the page's heatmap.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from memscope.units import format_bytes

#: A rank is an outlier when its peak is this share above or below its stage's median.
OUTLIER_SHARE = 0.02
#: Outliers listed (largest deviation first).
MAX_OUTLIERS = 50
#: Grid cells kept (a job larger than this shows the first stages' cells).
MAX_GRID_CELLS = 100_000


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _stage_key(pp: Any) -> tuple[bool, int]:
    return (not isinstance(pp, int), pp if isinstance(pp, int) else 0)


def _terms(row: Mapping[str, Any]) -> dict[str, int]:
    terms = row.get("terms")
    if not isinstance(terms, Mapping):
        return {}
    return {str(k): v for k, v in terms.items() if _int(v) is not None}


def _stage(pp: Any, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    peaks = [int(r["peak_allocated"]) for r in rows]
    top = max(rows, key=lambda r: (int(r["peak_allocated"]), -int(r["rank"])))
    out: dict[str, Any] = {
        "pp_rank": pp,
        "ranks": len(rows),
        "peak_max": max(peaks),
        "peak_median": int(statistics.median(peaks)),
        "peak_min": min(peaks),
        "max_rank": top["rank"],
        "max_terms": _terms(top),
        "max_predicted_terms": top.get("predicted_terms") or {},
        "in_flight_measured": top.get("in_flight_measured"),
        "in_flight_predicted": top.get("in_flight_predicted"),
        "static_peak": top.get("static_peak"),
    }
    roomy = [r for r in rows if _int(r.get("headroom")) is not None]
    if roomy:
        tight = min(roomy, key=lambda r: (int(r["headroom"]), int(r["rank"])))
        terms = _terms(tight)
        out.update(
            least_headroom_rank=tight["rank"],
            least_headroom=tight["headroom"],
            binding_term=max(terms, key=lambda k: terms[k]) if terms else None,
        )
    return out


def _outliers(by_stage: Mapping[Any, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    found = []
    for pp, rows in by_stage.items():
        if len(rows) < 3:
            continue
        median = statistics.median(int(r["peak_allocated"]) for r in rows)
        row_terms = [_terms(r) for r in rows]
        names = {k for terms in row_terms for k in terms}
        term_median = {k: statistics.median(t.get(k, 0) for t in row_terms) for k in names}
        for row, terms in zip(rows, row_terms, strict=True):
            off = int(row["peak_allocated"]) - median
            if not median or abs(off) <= OUTLIER_SHARE * median:
                continue
            diffs = {k: terms.get(k, 0) - term_median[k] for k in names}
            term = max(diffs, key=lambda k: abs(diffs[k])) if diffs else None
            found.append(
                {
                    "rank": row["rank"],
                    "pp_rank": pp,
                    "peak_allocated": row["peak_allocated"],
                    "stage_median": int(median),
                    "deviation": off / median,
                    "term": term,
                    "term_delta": int(diffs[term]) if term else None,
                }
            )
    found.sort(key=lambda o: -abs(o["deviation"]))
    return found[:MAX_OUTLIERS]


def _imbalance(stages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if len(stages) < 2:
        return {}
    hi = max(stages, key=lambda s: s["peak_max"])
    lo = min(stages, key=lambda s: s["peak_max"])
    names = set(hi["max_terms"]) | set(lo["max_terms"])
    deltas = {k: hi["max_terms"].get(k, 0) - lo["max_terms"].get(k, 0) for k in names}
    ranked = sorted((k for k in deltas if deltas[k]), key=lambda k: (-abs(deltas[k]), k))
    parts = []
    for k in ranked[:3]:
        part = f"{k} {format_bytes(deltas[k], signed=True)}"
        if k == "activations" and hi.get("in_flight_measured") and lo.get("in_flight_measured"):
            part += (
                f" ({hi['in_flight_measured']} vs {lo['in_flight_measured']} microbatches in "
                "flight)"
            )
        parts.append(part)
    gap = hi["peak_max"] - lo["peak_max"]
    sentence = (
        f"stage {hi['pp_rank']} (rank {hi['max_rank']}) peaks {format_bytes(gap)} above stage "
        f"{lo['pp_rank']} (rank {lo['max_rank']})" + (": " + ", ".join(parts) if parts else "")
    )
    return {
        "heaviest_stage": hi["pp_rank"],
        "lightest_stage": lo["pp_rank"],
        "gap_bytes": gap,
        "term_deltas": {k: deltas[k] for k in ranked},
        "sentence": sentence,
    }


def _grid(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Peak allocated per (stage, column); a column is one (dp, cp, ep, tp) coordinate."""
    cols: dict[tuple[Any, ...], int] = {}
    stages: dict[Any, int] = {}
    cells = []
    for row in rows[:MAX_GRID_CELLS]:
        key = tuple(row.get(k) for k in ("dp_rank", "cp_rank", "ep_rank", "tp_rank"))
        col = cols.setdefault(key, len(cols))
        stage = stages.setdefault(row.get("pp_rank"), len(stages))
        cells.append([stage, col, row["rank"], row["peak_allocated"]])
    labels = [
        " ".join(
            f"{n}{v}" for n, v in zip(("dp", "cp", "ep", "tp"), key, strict=True) if v is not None
        )
        for key in cols
    ]
    return {"stages": list(stages), "columns": labels, "cells": cells}


def explain_job(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``stages``, ``imbalance``, ``outliers`` and ``grid`` of a job (see the module
    docstring); ranks without a measured peak are left out."""
    measured = [
        r
        for r in rows
        if r.get("status") != "missing" and _int(r.get("peak_allocated")) is not None
    ]
    by_stage: dict[Any, list[Mapping[str, Any]]] = {}
    for row in measured:
        by_stage.setdefault(row.get("pp_rank"), []).append(row)
    order = sorted(by_stage, key=_stage_key)
    stages = [_stage(pp, by_stage[pp]) for pp in order]
    ordered = sorted(measured, key=lambda r: (*_stage_key(r.get("pp_rank")), int(r["rank"])))
    return {
        "stages": stages,
        "imbalance_by_term": _imbalance(stages),
        "outliers": _outliers(by_stage),
        "grid": _grid(ordered),
    }
