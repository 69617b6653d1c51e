"""What changed between two steps of a run, or between two runs (``memscope diff``).

Two sides, each a runtime report and optionally one of its steps:

* **the peak**: bytes, and whether the moment moved (step, phase, module, microbatch);
* **composition**: what was live at each side's peak by category x module x microbatch, the
  difference per item, *new* (only on B) and *vanished* (only on A) items first by size;
  available where the report has one (the storage backend, or a replayed allocator history);
* **the step**: with a step on each side, its peak, start and end allocated, per-phase
  high-water marks and bytes per category at its end;
* **per category**: at each side's peak (or step end);
* **the layout**: each side's parallel grid, and whether they differ (ranks of different
  layouts hold different shards, so their items are not like for like).

When the live microbatches differ between the sides (the peak moved to another microbatch,
or a different pipeline schedule), a microbatch number names a different thing on each side
and a per-microbatch comparison is a list of offsetting rows. The composition is then
compared per (category, module), summed over microbatches, and each row lists the
microbatches it had on each side.

Plain dicts in, a plain dict out; nothing here reads files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

#: Composition rows listed (largest change first).
MAX_ROWS = 200
_MOMENT = ("step", "phase", "module", "microbatch")
_STEP_TOTALS = ("allocated_start", "allocated_end", "peak_allocated", "reserved_end")
CompositionKey = tuple[str, str, int | None]
#: The parallel sizes that make two ranks hold like-for-like shards.
LAYOUT_KEYS = ("world_size", "tp_size", "pp_size", "vpp_size", "cp_size", "ep_size", "dp_size")


def _composition(report: Mapping[str, Any]) -> dict[CompositionKey, int]:
    peak = report.get("peak") or {}
    comp = peak.get("composition") or (report.get("allocator_timeline") or {}).get("composition")
    return _by_key((comp or {}).get("items") or [])


def _by_key(items: Sequence[Mapping[str, Any]]) -> dict[CompositionKey, int]:
    out: dict[CompositionKey, int] = {}
    for item in items:
        key = (str(item["category"]), str(item["module"]), item.get("microbatch"))
        out[key] = out.get(key, 0) + int(item["bytes"])
    return out


def diff_compositions(
    a: Mapping[CompositionKey, int],
    b: Mapping[CompositionKey, int],
    limit: int = MAX_ROWS,
) -> list[dict[str, Any]]:
    """Rows per (category, module, microbatch): bytes on each side, B - A, and whether the
    item is new on B, vanished from A or changed; largest change first, equal ones left out."""
    rows: list[dict[str, Any]] = []
    for key in set(a) | set(b):
        before, after = a.get(key, 0), b.get(key, 0)
        if before == after:
            continue
        category, module, microbatch = key
        rows.append(_row(category, module, before, after, key in a, key in b, microbatch))
    return _largest_first(rows)[:limit]


def diff_compositions_over_microbatches(
    a: Mapping[CompositionKey, int],
    b: Mapping[CompositionKey, int],
    limit: int = MAX_ROWS,
) -> tuple[list[dict[str, Any]], int]:
    """Rows per (category, module), each side summed over its microbatches, with the
    microbatches each side had (``microbatches_a`` / ``_b``); and how many (category, module)
    items only moved between microbatches (same bytes on both sides, so no row)."""
    sums: dict[tuple[str, str], list[int]] = {}
    present: dict[tuple[str, str], list[bool]] = {}  # has the item on side A / B
    micro: dict[tuple[str, str], tuple[set[int], set[int]]] = {}
    for side, comp in enumerate((a, b)):
        for (category, module, microbatch), nbytes in comp.items():
            key = (category, module)
            sums.setdefault(key, [0, 0])[side] += nbytes
            present.setdefault(key, [False, False])[side] = True
            seen = micro.setdefault(key, (set(), set()))
            if microbatch is not None:
                seen[side].add(microbatch)
    rows, moved_only = [], 0
    for key, (before, after) in sums.items():
        in_a, in_b = micro[key]
        if before == after:
            moved_only += in_a != in_b
            continue
        in_side_a, in_side_b = present[key]
        row = _row(*key, before, after, in_side_a, in_side_b, None)
        row.update(microbatches_a=sorted(in_a), microbatches_b=sorted(in_b))
        rows.append(row)
    return _largest_first(rows)[:limit], moved_only


def _row(
    category: str, module: str, before: int, after: int, in_a: bool, in_b: bool,
    microbatch: int | None,
) -> dict[str, Any]:  # fmt: skip
    status = "new" if not in_a else "vanished" if not in_b else "changed"
    return {
        "category": category,
        "module": module,
        "microbatch": microbatch,
        "a_bytes": before,
        "b_bytes": after,
        "delta_bytes": after - before,
        "status": status,
    }


def _largest_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        rows, key=lambda r: (-abs(int(r["delta_bytes"])), str(r["category"]), str(r["module"]))
    )


def _live_microbatches(comp: Mapping[CompositionKey, int]) -> set[int]:
    return {mb for (_, _, mb), nbytes in comp.items() if mb is not None and nbytes}


def layout(report: Mapping[str, Any]) -> dict[str, Any]:
    """A report's parallel grid (sizes only): what decides which shard a rank holds."""
    meta = report.get("metadata") or {}
    out = {k: meta.get(k) for k in LAYOUT_KEYS}
    if out["world_size"] is None:
        out["world_size"] = report.get("world_size")
    return out


def describe_layout(grid: Mapping[str, Any]) -> str:
    """``TP 1 PP 2 DP 1 (world 2)``; sizes a report does not give are left out."""
    names = (("tp_size", "TP"), ("pp_size", "PP"), ("vpp_size", "VPP"), ("cp_size", "CP"),
             ("ep_size", "EP"), ("dp_size", "DP"))  # fmt: skip
    parts = [f"{label} {grid[key]}" for key, label in names if grid.get(key) is not None]
    world = grid.get("world_size")
    return " ".join(parts) + (f" (world {world})" if world is not None else "")


def layout_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Both sides' grids and whether they differ in a size both reports give."""
    grid_a, grid_b = layout(a), layout(b)
    differs = [
        k for k in LAYOUT_KEYS
        if grid_a[k] is not None and grid_b[k] is not None and grid_a[k] != grid_b[k]
    ]  # fmt: skip
    return {
        "a": describe_layout(grid_a),
        "b": describe_layout(grid_b),
        "same": not differs,
        "differs_in": differs,
    }


def _by_category(items: Mapping[CompositionKey, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (category, _, _), nbytes in items.items():
        out[category] = out.get(category, 0) + nbytes
    return out


def _step_row(report: Mapping[str, Any], step: int) -> Mapping[str, Any]:
    for row in report.get("steps") or []:
        if row.get("step") == step:
            return row
    known = [r.get("step") for r in report.get("steps") or []]
    raise ValueError(f"step {step} is not in the report (its steps: {known[:20]})")


def _step_peak(
    report: Mapping[str, Any], step: int
) -> tuple[dict[str, Any], dict[CompositionKey, int]]:
    """A step's peak (bytes and phase) and what was live there: the step's own composition
    (``step_compositions``, kept for hooked steps), else the run's when its peak is in that
    step."""
    row = _step_row(report, step)
    for kept in report.get("step_compositions") or []:
        if kept.get("step") == step and kept.get("items"):
            moment = {k: kept.get(k) for k in _MOMENT}
            return {"memory_bytes": kept.get("peak_bytes"), **moment}, _by_key(kept["items"])
    peak = report.get("peak") or {}
    here = peak.get("step") == step and peak.get("memory_bytes") == row.get("peak_allocated")
    moment = {k: peak.get(k) for k in _MOMENT} if here else {"step": step,
              "phase": row.get("peak_phase"), "module": None, "microbatch": None}  # fmt: skip
    return {"memory_bytes": row.get("peak_allocated"), **moment}, (
        _composition(report) if here else {}
    )


def _delta_maps(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    return {
        k: {"a": int(a.get(k) or 0), "b": int(b.get(k) or 0),
            "delta": int(b.get(k) or 0) - int(a.get(k) or 0)}
        for k in sorted(set(a) | set(b))
    }  # fmt: skip


def diff_reports(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    step_a: int | None = None,
    step_b: int | None = None,
) -> dict[str, Any]:
    """The difference B - A of two runtime reports (the same report twice with two steps:
    two steps of one run). Raises ``ValueError`` for a step a report does not have."""
    stepped = step_a is not None or step_b is not None
    if stepped:
        sa = step_a if step_a is not None else int(step_b or 0)
        sb = step_b if step_b is not None else int(step_a or 0)
        peak_a, comp_a = _step_peak(a, sa)
        peak_b, comp_b = _step_peak(b, sb)
    else:
        peak_a, peak_b = a.get("peak") or {}, b.get("peak") or {}
        comp_a, comp_b = _composition(a), _composition(b)
    moved = {k: [peak_a.get(k), peak_b.get(k)] for k in _MOMENT if peak_a.get(k) != peak_b.get(k)}
    out: dict[str, Any] = {
        "peak": {
            "a_bytes": peak_a.get("memory_bytes"),
            "b_bytes": peak_b.get("memory_bytes"),
            "delta_bytes": int(peak_b.get("memory_bytes") or 0)
            - int(peak_a.get("memory_bytes") or 0),
            "a_moment": {k: peak_a.get(k) for k in _MOMENT},
            "b_moment": {k: peak_b.get(k) for k in _MOMENT},
            "moved": moved,
        },
        "composition": {
            "available": bool(comp_a) and bool(comp_b),
            "reason": ""
            if comp_a and comp_b
            else "this step's composition is not in the report: it is kept for the first "
            "and latest hooked steps (storage backend), and for the run's peak"
            if stepped
            else "what was live at the peak is recorded by the storage backend, or by "
            "allocator history over the peak step",
            "rows": [],
            "over_microbatches": False,
            "moved_between_microbatches": 0,
            "by_category": _delta_maps(_by_category(comp_a), _by_category(comp_b)),
        },
        "steps": None,
        "layout": layout_difference(a, b),
    }
    if comp_a and comp_b:
        composition = out["composition"]
        if "microbatch" in moved or _live_microbatches(comp_a) != _live_microbatches(comp_b):
            rows, moved_only = diff_compositions_over_microbatches(comp_a, comp_b)
            composition.update(
                rows=rows, over_microbatches=True, moved_between_microbatches=moved_only
            )
        else:
            composition["rows"] = diff_compositions(comp_a, comp_b)
    if stepped:
        row_a, row_b = _step_row(a, sa), _step_row(b, sb)
        out["steps"] = {
            "a_step": row_a.get("step"),
            "b_step": row_b.get("step"),
            "totals": _delta_maps(
                {k: row_a.get(k) for k in _STEP_TOTALS}, {k: row_b.get(k) for k in _STEP_TOTALS}
            ),
            "phase_peaks": _delta_maps(
                row_a.get("phase_peaks") or {}, row_b.get("phase_peaks") or {}
            ),
            "categories_end": _delta_maps(
                row_a.get("categories_end") or {}, row_b.get("categories_end") or {}
            ),
        }
    return out


def pair_ranks(
    a: Sequence[tuple[int, T]], b: Sequence[tuple[int, T]]
) -> tuple[list[tuple[int, T, T]], list[int]]:
    """The reports (or their paths) of two jobs paired by rank; and the ranks only one side
    has."""
    left, right = dict(a), dict(b)
    both = sorted(set(left) & set(right))
    return [(r, left[r], right[r]) for r in both], sorted(set(left) ^ set(right))
