"""Turns runtime reports into the compact plain data an HTML page plots.

Series are downsampled per bucket to their minimum and maximum, and the global maximum is
always kept, so a page stays small and fast for huge traces without ever losing the peak.
Tables are capped. Nothing here reads files or analyses: the job page takes the summary
of :mod:`memscope.analysis.job`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memscope.downsample import downsample_indices
from memscope.events.schema import HOOK_EVENTS
from memscope.events.sections import PRE_INDEX_SECTIONS, SectionSpec, report_sections
from memscope.reporters.layer_labels import label_modules
from memscope.reporters.section_views import section_view
from memscope.reporters.views import (
    GPU_STEP_COLUMNS,
    composition_note,
    gpu_signals_note,
    is_peak_row,
    module_kind,
    reserved_note,
)

MAX_POINTS = 2000  # per plotted series
MAX_ROWS = 500
MAX_DETAIL_STEPS = 10
#: Ranks whose step timeline the job page plots (a chart of thousands of lines helps nobody).
MAX_TIMELINES = 16
#: The renderers whose data :func:`runtime_payload` lays out itself: the built-in sections'.
BUILTIN_RENDERERS = frozenset(s.renderer for s in PRE_INDEX_SECTIONS if s.renderer)
#: The rank page's own section renderers, by name: each is a partial,
#: ``templates/sections/<name>.html.j2``, and (where it draws charts or tables) a function of
#: ``RANK_SECTIONS`` in ``templates/js/runtime_sections.js``. A section whose spec names one of
#: them is drawn by it; any other by its layout (:func:`page_sections`). A new renderer adds its
#: name here (``BUILTIN_RENDERERS | {"name"}``) and gets its section's value as ``value``.
PAGE_RENDERERS: frozenset[str] = BUILTIN_RENDERERS
#: The job page's sections, in page order: each a partial,
#: ``templates/sections/job/<name>.html.j2``, and a function of ``JOB_SECTIONS`` in
#: ``templates/js/job_page.js``; the page draws the ``sections`` index :func:`job_payload`
#: lists, so a new block is its name here and those two.
JOB_PAGE_SECTIONS = ("cards", "stages", "grid", "outliers", "ranks", "timelines")


def _pick(rows: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, list[Any]]:
    return {k: [r.get(k) for r in rows] for k in keys}


def _step_series(steps: list[dict[str, Any]], max_points: int) -> dict[str, list[Any]]:
    keep: set[int] = set()  # the plotted series share the budget; each keeps its own maximum
    plotted = ("peak_allocated", "allocated_end", "reserved_end", "device_used_end")
    for key in plotted:
        values = [s.get(key) or 0 for s in steps]
        keep.update(downsample_indices(values, max(4, max_points // len(plotted))))
    kept = [steps[i] for i in sorted(keep)]
    return _pick(
        kept,
        (
            "step",
            "allocated_start",
            "allocated_end",
            "reserved_end",
            "peak_allocated",
            "peak_reserved",
            "peak_phase",
            *(key for key, _ in GPU_STEP_COLUMNS),
        ),
    )


def choose_detail_steps(
    steps: Sequence[int], peak_step: int | None, limit: int = MAX_DETAIL_STEPS
) -> list[int]:
    """About ``limit`` steps: the first ones, the peak step, the last, the rest evenly spread."""
    ordered = sorted(set(steps))
    if len(ordered) <= limit:
        return ordered
    chosen = {ordered[0], ordered[-1]}
    if peak_step is not None and peak_step in ordered:
        chosen.add(peak_step)
    chosen.update(ordered[: max(0, (limit - len(chosen)) // 2)])
    spare = limit - len(chosen)
    if spare > 0:
        stride = len(ordered) / (spare + 1)
        chosen.update(ordered[int(stride * (i + 1))] for i in range(spare))
    return sorted(chosen)


def peak_marker(
    events: Sequence[Mapping[str, Any]], peak: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Where the run's attributed peak sits among a step's module/grad ``events`` (in order):
    the first event of the peak's step whose interval reached the peak (the peak happened
    inside it), labelled with the peak's own attribution (step, phase, module, microbatch),
    not with that event's module. None when the peak's step has no such event."""
    step, top = peak.get("step"), int(peak.get("memory_bytes") or 0)
    if step is None or not top:
        return None
    for order, e in enumerate(events):
        if int(e.get("max_mem_allocated") or 0) >= top:
            return {
                "step": str(step),
                "order": order,
                "bytes": top,
                **{k: peak.get(k) for k in ("phase", "module", "microbatch", "virtual_chunk")},
            }
    return None


def _within_step(
    events: list[dict[str, Any]], max_points: int, peak: Mapping[str, Any]
) -> tuple[dict[str, dict[str, list[Any]]], int, dict[str, Any] | None]:
    """Per chosen step, the downsampled module/grad events; how many steps had any; and the
    run's peak among them (:func:`peak_marker`)."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("event_type") in HOOK_EVENTS:
            by_step.setdefault(int(e.get("step", -1)), []).append(e)
    out: dict[str, dict[str, list[Any]]] = {}
    peak_step = peak.get("step")
    if peak_step not in by_step and by_step:  # the highest high-water mark's step, else
        peak_step = max(
            by_step, key=lambda st: max(e.get("max_mem_allocated") or 0 for e in by_step[st])
        )
    marker = peak_marker(by_step.get(peak.get("step"), []), peak)  # type: ignore[arg-type]
    chosen = choose_detail_steps(list(by_step), peak_step)
    for step in chosen:
        evs = by_step[step]
        highs = [e.get("max_mem_allocated") or 0 for e in evs]
        afters = [e.get("mem_allocated_after") or 0 for e in evs]
        kept = set(downsample_indices(highs, max_points)) | set(
            downsample_indices(afters, max_points)
        )
        if marker is not None and marker["step"] == str(step):
            kept.add(marker["order"])  # the peak's event is always drawn
        idx = sorted(kept)
        rows = [evs[i] | {"order": i} for i in idx]
        out[str(step)] = _pick(
            rows,
            ("order", "mem_allocated_after", "max_mem_allocated", "phase", "module",
             "microbatch", "event_type", "delta_allocated"),
        )  # fmt: skip
    return out, len(by_step), marker


def _transitions(section: dict[str, Any] | None, max_rows: int) -> dict[str, Any] | None:
    """The step-transition section with its list of changes capped."""
    if not section:
        return None
    rows = section.get("transitions") or []
    return {**section, "transitions": rows[:max_rows], "transitions_total": len(rows)}


def page_sections(
    report: Mapping[str, Any], max_rows: int, renderers: frozenset[str] = PAGE_RENDERERS
) -> list[dict[str, Any]]:
    """The rank page's sections, in the order of the report's index: ``{name, title,
    renderer}`` for a section the page has the renderer of (plus ``value`` where
    :func:`runtime_payload` does not lay its data out), else its generic view
    (:func:`memscope.reporters.section_views.section_view`, module names labelled as everywhere
    on the page); sections with nothing to show on a page are left out. A built-in renderer
    draws what :func:`runtime_payload` laid out for its own section, so it draws only the
    section of its own name, once (an index naming it elsewhere gets the generic view)."""
    layers = (report.get("metadata") or {}).get("layer_numbers")
    out: list[dict[str, Any]] = []
    drawn: set[str] = set()
    for spec in report_sections(report):
        value = report.get(spec.name)
        if _page_draws(spec, renderers, drawn):
            entry: dict[str, Any] = {
                "name": spec.name,
                "title": spec.title,
                "renderer": spec.renderer,
            }
            if spec.renderer not in BUILTIN_RENDERERS:
                entry["value"] = value  # labelled with the whole payload
            drawn.add(spec.name)
            out.append(entry)
            continue
        view = section_view(spec, label_modules(value, layers), max_rows)
        if view is not None:
            out.append(view.to_dict())
    return out


def _page_draws(spec: SectionSpec, renderers: frozenset[str], drawn: set[str]) -> bool:
    """Whether the page's own renderer draws ``spec``: one it has, and for a built-in one,
    the section of its own name, not yet drawn."""
    if spec.renderer not in renderers:
        return False
    return spec.renderer not in BUILTIN_RENDERERS or (
        spec.name == spec.renderer and spec.name not in drawn
    )


#: The parallel dimensions of a rank's grid position, in Megatron's order of the title.
GRID_DIMENSIONS = (("tp", "TP"), ("pp", "PP"), ("dp", "DP"), ("cp", "CP"), ("ep", "EP"))


def grid_position(meta: Mapping[str, Any]) -> str:
    """``TP 0/2 · PP 1/2 · DP 0/1 · CP 0/1 · EP 0/1`` (rank / size of each dimension the
    metadata gives; VPP as the number of chunks). Empty when it gives none."""
    parts = []
    for key, label in GRID_DIMENSIONS:
        rank, size = meta.get(f"{key}_rank"), meta.get(f"{key}_size")
        if isinstance(rank, int) and isinstance(size, int):
            parts.append(f"{label} {rank}/{size}")
    vpp = meta.get("vpp_size")
    if isinstance(vpp, int) and vpp > 1:
        parts.append(f"VPP {vpp} chunks")
    return " · ".join(parts)


def runtime_payload(
    report: dict[str, Any],
    max_points: int = MAX_POINTS,
    max_rows: int = MAX_ROWS,
    job_page: str | None = None,
) -> dict[str, Any]:
    """Everything the rank page shows, bounded in size. ``job_page``: the job page's URL
    relative to the rank page, linked from it."""
    meta = dict(report.get("metadata") or {})
    config = meta.pop("config", None)
    events = report.get("runtime_trace") or []
    steps = report.get("steps") or []
    within, within_total, within_peak = _within_step(events, max_points, report.get("peak") or {})
    payload = {
        "kind": "rank",
        "rank": report.get("rank"),
        "world_size": report.get("world_size"),
        "grid": grid_position(meta),
        "job_page": job_page,
        "status": report.get("status"),
        "status_reason": report.get("status_reason", ""),
        "schema_version": report.get("schema_version"),
        "tool_version": (report.get("tool") or {}).get("version"),
        "metadata": meta,
        "config": config or {},
        "oom": report.get("oom"),
        "peak": report.get("peak") or {},
        "within_peak": within_peak,
        "active_memory": (report.get("allocator_timeline") or {}).get("active_memory"),
        "idle_at_peak": (report.get("allocator_timeline") or {}).get("idle_at_peak") or [],
        "comparisons": report.get("comparisons") or {},
        "phase_summary": (report.get("phase_summary") or [])[:max_rows],
        "top_events": [
            {**row, "kind": module_kind(row), "is_peak": is_peak_row(row, report.get("peak") or {})}
            for row in (report.get("top_events") or [])[:max_rows]
        ],
        "module_summary": (report.get("module_summary") or [])[:max_rows],
        "modules_total": len(report.get("module_summary") or []),
        "step_transitions": _transitions(report.get("step_transitions"), max_rows),
        "steps": _step_series(steps, max_points),
        "steps_total": len(steps),
        "gpu_totals": {
            key: steps[-1][key]
            for key in ("alloc_retries_total", "ooms_total")
            if steps and key in steps[-1]
        },
        "notes": {
            "reserved": reserved_note(meta),
            "gpu_signals": gpu_signals_note(meta, steps),
            "composition": composition_note(meta),
        },
        "within_step": within,
        "within_steps_total": within_total,
        "errors": (report.get("errors") or [])[:max_rows],
        "warnings": (report.get("warnings") or [])[:max_rows],
        "trace": report.get("trace") or {},
        "sections": page_sections(report, max_rows),
    }
    return label_modules(payload, meta.get("layer_numbers"))


def job_payload(
    summary: dict[str, Any],
    steps_by_rank: Mapping[int, list[dict[str, Any]]],
    max_points: int = MAX_POINTS,
) -> dict[str, Any]:
    """The job page from :func:`memscope.analysis.job.summarize_job` and each rank's step rows
    (:func:`memscope.analysis.job.rank_steps`): the summary as is, plus downsampled step
    timelines of at most :data:`MAX_TIMELINES` ranks (see :func:`timeline_ranks`)."""
    plotted = timeline_ranks(summary["ranks"])
    return {
        "kind": "job",
        "sections": [{"name": name, "renderer": name} for name in JOB_PAGE_SECTIONS],
        "world_size": summary["world_size"],
        "ranks": summary["ranks"],
        "missing": summary["missing"],
        "incomplete": summary["incomplete"],
        "imbalance": summary["imbalance"],
        "oom": summary.get("oom") or {},
        "stages": summary.get("stages") or [],
        "imbalance_by_term": summary.get("imbalance_by_term") or {},
        "outliers": summary.get("outliers") or [],
        "grid": summary.get("grid") or {},
        "runs_warning": summary.get("runs_warning", ""),
        "strays": (summary.get("strays") or [])[:MAX_ROWS],
        "timelines": {
            str(rank): _step_series(steps, max_points)
            for rank, steps in sorted(steps_by_rank.items())
            if rank in plotted
        },
        "timelines_total": sum(row["status"] != "missing" for row in summary["ranks"]),
    }


def timeline_ranks(rows: Sequence[Mapping[str, Any]], limit: int = MAX_TIMELINES) -> set[int]:
    """The ranks worth a line: every rank with a report when they are few; else those that
    failed, then the highest peak of each pipeline stage, then the highest peaks overall."""
    reported = [r for r in rows if r.get("status") != "missing"]
    if len(reported) <= limit:
        return {int(r["rank"]) for r in reported}

    def peak(row: Mapping[str, Any]) -> float:
        value = row.get("peak_allocated")
        return float(value) if isinstance(value, int | float) else -1.0

    by_peak = sorted(reported, key=lambda r: (-peak(r), r["rank"]))
    failed = [r for r in by_peak if r.get("status") in ("oom", "crashed")]
    stage_max: dict[Any, Mapping[str, Any]] = {}
    for row in by_peak:
        stage_max.setdefault(row.get("pp_rank"), row)
    chosen: list[int] = []
    for row in (*failed, *stage_max.values(), *by_peak):
        if len(chosen) == limit:
            break
        if row["rank"] not in chosen:
            chosen.append(int(row["rank"]))
    return set(chosen)
