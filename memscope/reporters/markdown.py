"""Renders a runtime report dict as a readable Markdown summary.

Every string that comes from the report goes through :func:`md_text` (plain text) or
:func:`md_code` (a code span): control characters and lone surrogates are escaped (see
:func:`memscope.units.printable`), and nothing in a module name or a reason can become HTML,
a link, or break a table or a code span.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from memscope.events.schema import module_label
from memscope.events.sections import ColumnKind, SectionLayout, SectionSpec, report_sections
from memscope.reporters.layer_labels import label_modules
from memscope.reporters.section_views import section_view
from memscope.reporters.views import (
    GPU_STEP_COLUMNS,
    composition_note,
    gpu_signals_note,
    is_lower_bound,
    is_peak_row,
    module_kind,
    reserved_note,
)
from memscope.units import (
    fixed,
    format_bytes,
    format_duration,
    format_percent,
    format_ratio,
    printable,
)

_MD_SPECIAL = re.compile(r"([\\`*\[\]<>&])")
# Frames of a leak suspect's creation stack listed (innermost first; the JSON has them all).
SHOWN_FRAMES = 4


def md_text(value: object) -> str:
    """``value`` as inline Markdown text: printable, with ``\\ ` * [ ] < > &`` backslash-escaped
    (no raw HTML, entity, link or code span can start in it)."""
    return printable(_MD_SPECIAL.sub(r"\\\1", value if isinstance(value, str) else str(value)))


def md_code(value: object) -> str:
    """``value`` as a Markdown code span (contents shown literally), fenced with more backticks
    than it holds in a row."""
    text = printable(value)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table of already-escaped cells (``_none_`` when there are no rows)."""
    if not rows:
        return ["_none_", ""]
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return [*out, ""]


def _where(d: dict[str, Any]) -> str:
    parts = [f"step {md_text(d.get('step'))}", f"phase {md_code(d.get('phase'))}"]
    if d.get("module"):
        parts.append(f"module {md_code(d['module'])}")
    if d.get("microbatch") is not None:
        parts.append(f"microbatch {md_text(d['microbatch'])}")
    return ", ".join(parts)


def _beside_lines(peak: dict[str, Any]) -> list[str]:
    """Memory beside the composition: the allocator's cache and what PyTorch does not hold."""
    beside = peak.get("beside")
    if not beside:
        return []
    return [
        f"Beside it (step {md_text(beside.get('step'))}): allocator cached but free "
        f"{format_bytes(beside['allocator_cached_free_bytes'])}; device memory outside PyTorch "
        f"(NCCL, CUDA context) {format_bytes(beside['outside_pytorch_bytes'])}.",
        "",
    ]


def _composition_lines(
    composition: dict[str, Any] | None, max_rows: int, missing: str, note: str | None = None
) -> list[str]:
    """The "Live at the peak" table: category x where it was created, largest first
    (``missing``: what to say when there is none and no ``note`` says why)."""
    t, code = md_text, md_code
    if not composition:
        return ["### Live at the peak", "", t(note or missing), ""]
    kinds = {True: " (saved)", False: " (temporary)"}
    rows = [
        [
            t(item["category"] + kinds.get(item.get("saved"), "")),
            code(item["module"]) if item["module"] else "—",
            t(item["phase"]) if item["phase"] else "—",
            t(item["microbatch"]) if item["microbatch"] is not None else "—",
            t(item["virtual_chunk"]) if item["virtual_chunk"] is not None else "—",
            format_bytes(item["bytes"]),
        ]
        for item in composition["items"][:max_rows]
    ]
    shown = sum(item["bytes"] for item in composition["items"][:max_rows])
    more = composition["total_bytes"] - shown
    lines = ["### Live at the peak", ""]
    headers = ["category", "created in module", "phase", "microbatch", "chunk", "bytes"]
    lines += md_table(headers, rows)
    if more:
        lines[-1:-1] = [f"| (further items) | | | | | {format_bytes(more)} |"]
    lines.append(
        f"Sum {format_bytes(composition['total_bytes'])}; unattributed "
        f"{format_bytes(composition['unattributed_bytes'])}. Activations are *saved* when "
        "autograd kept them for backward, else *temporary*. Parameters, gradients and "
        "optimizer state carry the phase they were created in (empty: before tracing)."
        + (
            " From the replayed allocator history."
            if composition.get("source") == "allocator_history"
            else ""
        )
    )
    lines.append("")
    return lines


def _in_phase(row: dict[str, Any]) -> str:
    """A phase's maximum, marked ``≥`` when it is its highest reading, not a high-water mark."""
    value = format_bytes(row["max_mem_allocated"])
    return f"≥ {value}" if is_lower_bound(row) else value


def _history_lines(history: dict[str, Any] | None, max_rows: int) -> list[str]:
    """The replayed allocator history: window, coverage, true per-step peaks, its cost, and
    who held the most at the peak of the timeline's step."""
    if not history:
        return []
    t, code = md_text, md_code
    ctx = history.get("peak_context")
    lines = [
        "## Allocator history (replayed)",
        "",
        f"- {t(len(history.get('snapshots') or []))} snapshot(s) from "
        f"{code(history.get('source'))}, highest {code(history.get('snapshot'))}: "
        f"{t(history.get('events'))} events, window peak "
        f"**{format_bytes(history.get('peak_bytes'))}**" + (f" at {_where(ctx)}" if ctx else ""),
        f"- coverage {format_percent(history.get('coverage'))} of the peak's bytes "
        "allocated inside the window (the rest was live when it began); "
        f"{t(history.get('inconsistencies'))} unpaired events",
    ]
    cost = history.get("recording_cost")
    if cost:
        lines.append(
            f"- recording cost: median step {format_duration(cost['recorded_median_s'])} with "
            f"history, {format_duration(cost['other_median_s'])} without"
            + (f" (×{fixed(cost['ratio'], 2)})" if cost.get("ratio") is not None else "")
        )
    peaks = history.get("step_peaks") or {}
    lines += ["", "True peak of each recorded step:", ""]
    lines += md_table(
        ["step", "allocated high-water mark"],
        [[t(k), format_bytes(v)] for k, v in list(peaks.items())[:max_rows]],
    )
    idle = history.get("idle_at_peak") or []
    if history.get("idle_at_peak_bytes") is not None:
        lines += [
            f"Idle at the peak: {format_bytes(history['idle_at_peak_bytes'])} live there had "
            "not been used since earlier; freeing each holder's memory right after its last "
            "use would lower the window's peak by:",
            "",
        ]
        lines += md_table(
            ["holder", "category", "idle bytes at the peak", "blocks", "idle for",
             "peak drop", "pattern"],
            [
                [code(f["label"]), t(f["category"]), format_bytes(f["bytes"]), t(f["count"]),
                 f"{f['idle_us'] / 1000:.1f} ms", format_bytes(f["peak_drop"]),
                 t(f["pattern"]) or "—"]
                for f in idle[:max_rows]
            ],
        )  # fmt: skip
    active = history.get("active_memory")
    if active and active.get("bands"):
        at = int(active["peak_index"])
        bands = sorted(active["bands"], key=lambda b: -b["bytes"][at])
        lines += [
            f"Active memory through step {t(active.get('step'))} (plotted on the HTML rank "
            f"page, {t(len(active['time_us']))} samples of {t(active.get('events'))} "
            "allocator events); held at its peak:",
            "",
        ]
        lines += md_table(
            ["category", "holder", "bytes at the peak", "most in the step"],
            [
                [t(b["category"]), code(b["label"]), format_bytes(b["bytes"][at]),
                 format_bytes(max(b["bytes"]))]
                for b in bands[:max_rows]
            ],
        )  # fmt: skip
    return lines


def _transition_lines(
    section: dict[str, Any] | None, max_rows: int, reserved: bool = True
) -> list[str]:
    """Why memory changed between steps: the counts, leak candidates, the other changes."""
    if not section:
        return []
    t, counts = md_text, section.get("counts") or {}
    lines = [
        "## Step to step",
        "",
        ", ".join(f"{t(k).replace('_', ' ')}: {t(v)}" for k, v in counts.items()) + ".",
        "",
    ]
    for leak in section.get("leaks") or []:
        lines.append(
            f"- **leak candidate**, steps {t(leak['first_step'])}–{t(leak['last_step'])}: "
            f"allocated grew {format_bytes(leak['bytes_per_step'])} per step "
            f"({format_bytes(leak['bytes_added'])} in all"
            + (f"; {t(leak['rate_basis'])}" if leak.get("rate_basis") else "")
            + ")"
        )
        for s in leak.get("suspects") or []:
            mb = "" if s["microbatch"] is None else f", microbatch {t(s['microbatch'])}"
            what = ""
            if s.get("shape") is not None:
                what = f" {md_code('[' + ', '.join(str(n) for n in s['shape']) + ']')}"
                what += f" {t(s.get('dtype', ''))}"
            lines.append(
                f"  - suspect {md_code(module_label(s['module']))} ({t(s['phase'])}{mb}):"
                f"{what} {format_bytes(s['bytes_per_step'])} per step born in steps "
                f"{t(', '.join(str(b) for b in s['birth_steps']))}, still live"
            )
            frames = (s.get("stack") or [])[:SHOWN_FRAMES]
            lines += [f"    - at {md_code(frame)}" for frame in frames]
    if section.get("leaks"):
        lines.append("")
    header = ["step", "kind", "allocated Δ", "reserved Δ", "outside PyTorch Δ", "cause"]
    rows = [
        [
            t(x["step"]),
            t(x["kind"].replace("_", " ")),
            format_bytes(x["allocated_delta"], signed=True),
            format_bytes(x["reserved_delta"], signed=True),
            format_bytes(x.get("outside_pytorch_delta"), signed=True),
            t(x["cause"]),
        ]
        for x in (section.get("transitions") or [])[:max_rows]
    ]
    lines += md_table(*_without_reserved(header, rows, reserved, 3))
    return lines


def _share(part: Any, whole: Any) -> float | None:
    """``part`` over ``whole``: a component's difference weighed against the runtime peak
    (a few bytes of a near-empty category are -100% of it but nothing of the peak)."""
    if isinstance(part, int | float) and isinstance(whole, int | float) and whole:
        return part / whole
    return None


def _without_reserved(
    header: list[str], rows: list[list[str]], reserved: bool, column: int
) -> tuple[list[str], list[list[str]]]:
    """The table as is where the backend has a reserved figure; else without its reserved
    column (a backend with no caching allocator has none to show)."""
    if reserved:
        return header, rows
    keep = [i for i in range(len(header)) if i != column]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


def _gpu_lines(meta: dict[str, Any], steps: list[dict[str, Any]], max_rows: int) -> list[str]:
    """Per step, what the device and the caching allocator said at its end (or why not)."""
    lines = ["## GPU signals per step", ""]
    note = gpu_signals_note(meta, steps)
    if note:
        return [*lines, md_text(note), ""]
    rows = [row for row in steps if "device_used_end" in row][-max_rows:]
    counts = ("alloc_retries", "ooms")
    cells = [
        [md_text(row["step"])]
        + [
            (md_text(row.get(key, "n/a")) if key in counts else format_bytes(row.get(key)))
            for key, _ in GPU_STEP_COLUMNS
        ]
        for row in rows
    ]
    lines += md_table(["step", *(title for _, title in GPU_STEP_COLUMNS)], cells)
    last = rows[-1]
    lines += [
        "At each step's end: device used is `cudaMemGetInfo`'s, outside PyTorch is device used "
        "minus reserved (NCCL buffers, the CUDA context, other libraries), reserved − allocated "
        "is cached by the allocator but free; retries and OOMs count since the step listed "
        f"before (in all: {md_text(last.get('alloc_retries_total', 'n/a'))} allocation "
        f"retries, {md_text(last.get('ooms_total', 'n/a'))} OOMs).",
        "",
    ]
    return lines


def _run_lines(meta: dict[str, Any], training: Any) -> list[str]:
    """The header's run line (id, where it came from, start, host) and training line."""
    t = md_text
    lines = [
        f"- run: {md_code(meta.get('run_id'))} ({t(meta.get('run_id_source'))}), started "
        f"{t(meta.get('start_time'))} on {t(meta.get('hostname'))}"
    ]
    if isinstance(training, dict):

        def v(key: str) -> str:
            return "—" if training.get(key) is None else t(training[key])

        recompute = training.get("recompute_granularity")
        if recompute:
            recompute = f"{recompute} ({training.get('recompute_method')}, "
            recompute += f"{training.get('recompute_num_layers')} layers)"
        lines.append(
            f"- training: sequence length {v('seq_length')}, micro-batch "
            f"{v('micro_batch_size')}, global batch {v('global_batch_size')}, "
            f"{v('num_microbatches')} microbatches per step, recompute "
            f"{t(recompute or 'off')}; static spec from "
            f"{t(training.get('static_spec') or 'none (no static comparison)')}"
        )
    return lines


def _disagreement_lines(comp: dict[str, Any]) -> list[str]:
    """Where the run's args and its model disagree (the static spec used the model's
    value), and what reading the model could not settle."""
    rows = comp.get("spec_disagreements") or []
    lines: list[str] = []
    if rows:
        lines += ["", "Static spec: the model and the args disagree (the model's value is used):"]
        table = [
            [md_code(d.get("key")), md_text(d.get("model")), md_text(d.get("args"))] for d in rows
        ]
        lines += ["", *md_table(["setting", "model", "args"], table)]
    notes = comp.get("spec_notes") or []
    lines += ([""] if notes else []) + [f"- static spec: {md_text(n)}" for n in notes]
    return lines


def _has_reserved(meta: dict[str, Any]) -> bool:
    """Whether tables show a reserved column: only where the report names a backend that has
    one."""
    return not (meta.get("backend") and reserved_note(meta))


def _oom_lines(report: dict[str, Any], oom: Any, max_rows: int) -> list[str]:
    """An OOM in one line; its forensics and remedies are ``oom_report.md``'s."""
    if not oom:
        return []
    where = oom.get("where") or {}
    return [
        "## Out of memory",
        "",
        f"A {md_text(oom.get('verdict'))} OOM at {_where(where)}: requested "
        f"{format_bytes(oom.get('requested_bytes'))} with "
        f"{format_bytes(oom.get('allocated_bytes'))} allocated. The remedies are in "
        "`oom_report.md` beside this report.",
        "",
    ]


def _peak_lines(report: dict[str, Any], peak: Any, max_rows: int) -> list[str]:
    """The peak and where, what was live there and what was beside it."""
    t, meta, peak = md_text, report.get("metadata", {}), peak or {}
    lines = [
        "## Peak",
        "",
        f"- allocated peak: **{format_bytes(peak.get('memory_bytes'))}** at {_where(peak)} "
        f"(attribution: {t(peak.get('attribution'))})",
        f"- reserved peak: {format_bytes(peak.get('reserved_bytes'))}"
        if not reserved_note(meta)
        else f"- reserved peak: n/a ({t(reserved_note(meta))})",
    ]
    if peak.get("categories"):
        parts = ", ".join(f"{t(k)} {format_bytes(v)}" for k, v in peak["categories"].items())
        lines.append(f"- live at the peak: {parts}")
    lines.append("")
    lines += _composition_lines(
        peak.get("composition"), max_rows, composition_note(meta), peak.get("composition_note")
    )
    return lines + _beside_lines(peak)


def _comparison_lines(report: dict[str, Any], comp: Any, max_rows: int) -> list[str]:
    """The static estimate against the runtime peak, per component."""
    t, comp = md_text, comp or {}
    lines = ["## Static estimate vs runtime", ""]
    if comp.get("status") != "ok":
        return [*lines, f"Static estimate missing: {t(comp.get('reason', 'unknown reason'))}.", ""]
    lines += [
        f"- static peak {format_bytes(comp.get('static_peak_memory_bytes'))}, runtime peak "
        f"{format_bytes(comp.get('runtime_peak_memory_bytes'))}, difference "
        f"{format_bytes(comp.get('peak_diff_bytes'), signed=True)} "
        f"({format_ratio(comp.get('peak_diff_ratio'))})",
        "",
    ]
    lines += md_table(
        ["component", "static", "runtime", "static − runtime", "of the runtime peak"],
        [
            [
                t(c["component"]),
                format_bytes(c.get("static_bytes")),
                format_bytes(c.get("runtime_bytes")),
                format_bytes(c.get("diff_bytes"), signed=True),
                format_ratio(_share(c.get("diff_bytes"), comp.get("runtime_peak_memory_bytes"))),
            ]
            for c in comp.get("components", [])[:max_rows]
        ],
    )
    return lines + _disagreement_lines(comp)


def _phase_lines(report: dict[str, Any], phases: Any, max_rows: int) -> list[str]:
    """Per phase: events, its maximum (``≥`` where a lower bound) and delta range."""
    t, phases = md_text, phases or []
    lines = ["## Per-phase maxima", ""]
    lines += md_table(
        ["phase", "events", "max allocated in the phase", "max allocated after", "max Δ", "min Δ"],
        [
            [
                t(p["phase"]),
                t(p["count"]),
                _in_phase(p),
                format_bytes(p["max_mem_allocated_after"]),
                format_bytes(p["max_delta_allocated"], signed=True),
                format_bytes(p["min_delta_allocated"], signed=True),
            ]
            for p in phases[:max_rows]
        ],
    )
    if phases:
        bounded = any(is_lower_bound(p) for p in phases)
        lines[-1:-1] = [
            "",
            "A phase's maximum is its own running peak where the backend sees every "
            "allocation (storage), else the step's high-water mark where the phase set it"
            + (
                "; ≥ marks a phase that stayed below the mark set elsewhere in its step: its "
                "highest reading (a lower bound)."
                if bounded
                else "."
            ),
        ]
    return lines


def _top_event_lines(report: dict[str, Any], top: Any, max_rows: int) -> list[str]:
    """The deduplicated hot spots, the peak's row marked."""
    t, code, top, peak = md_text, md_code, top or [], report.get("peak", {})
    lines = ["## Top events (deduplicated)", ""]
    lines += md_table(
        ["event", "module", "kind", "phase", "count", "allocated after", "max Δ", "min Δ",
         "worst step"],
        [
            [
                t(e["event_type"]),
                (code(e["module"]) if e["module"] else "—")
                + (" **← peak**" if is_peak_row(e, peak) else ""),
                module_kind(e) or "—",
                t(e["phase"]),
                t(e["count"]),
                format_bytes(e["mem_allocated_after"]),
                format_bytes(e["max_delta_allocated"], signed=True),
                format_bytes(e["min_delta_allocated"], signed=True),
                t(e["worst_step"]),
            ]
            for e in top[:max_rows]
        ],
    )  # fmt: skip
    if top:
        lines[-1:-1] = [
            "",
            "A container's forward includes what its children allocated (inclusive); a leaf's "
            "is its own. **← peak** marks where the run's peak was attributed.",
        ]
    return lines


def _module_lines(report: dict[str, Any], modules: Any, max_rows: int) -> list[str]:
    lines = ["## Modules by largest allocation increase", ""]
    return lines + md_table(
        ["module", "class", "events", "max allocated after", "max Δ", "min Δ"],
        [
            [
                md_code(m["module"]),
                md_text(m["module_class"]),
                md_text(m["count"]),
                format_bytes(m["max_allocated_after"]),
                format_bytes(m["max_delta_allocated"], signed=True),
                format_bytes(m["min_delta_allocated"], signed=True),
            ]
            for m in (modules or [])[:max_rows]
        ],
    )


def _step_lines(report: dict[str, Any], steps: Any, max_rows: int) -> list[str]:
    """The GPU signals per step, then each step's start, end and peak."""
    t, meta, steps = md_text, report.get("metadata", {}), steps or []
    lines = _gpu_lines(meta, steps, max_rows)
    lines += ["## Steps", ""]
    header = ["step", "start", "end", "peak", "peak phase", "reserved peak", "host RSS"]
    rows = [
        [
            t(st["step"]),
            format_bytes(st["allocated_start"]),
            format_bytes(st["allocated_end"]),
            format_bytes(st["peak_allocated"]),
            t(st["peak_phase"]),
            format_bytes(st["peak_reserved"]),
            format_bytes(st.get("host_rss_end")),
        ]
        for st in steps[:max_rows]
    ]
    return lines + md_table(*_without_reserved(header, rows, _has_reserved(meta), 5))


#: The sections this reporter draws by hand, by renderer name; any other is drawn by
#: :func:`generic_section_lines` from its layout.
RENDERERS: dict[str, Callable[[dict[str, Any], Any, int], list[str]]] = {
    "oom": _oom_lines,
    "peak": _peak_lines,
    "allocator_timeline": lambda report, value, max_rows: _history_lines(value, max_rows),
    "comparisons": _comparison_lines,
    "phase_summary": _phase_lines,
    "top_events": _top_event_lines,
    "module_summary": _module_lines,
    "step_transitions": lambda report, value, max_rows: _transition_lines(
        value, max_rows, _has_reserved(report.get("metadata", {}))
    ),
    "steps": _step_lines,
}


def generic_section_lines(
    spec: SectionSpec, value: Any, max_rows: int, heading: str = "##"
) -> list[str]:
    """A section no renderer here knows, drawn from its layout (see
    :mod:`memscope.reporters.section_views`) under a ``heading`` (Markdown's ``#`` marks)."""
    view = section_view(spec, value, max_rows)
    if view is None:
        return []
    lines = [f"{heading} {md_text(view.title)}", ""]
    if view.layout is SectionLayout.KEY_VALUES:
        lines += [f"- {md_text(key)}: {md_text(text)}" for key, text in view.rows]
        lines += [""] if view.rows else []
    elif view.headers:
        escape = {ColumnKind.CODE: md_code, ColumnKind.TEXT: md_text}
        cells = [
            [escape.get(kind, str)(text) for kind, text in zip(view.kinds, row, strict=True)]
            for row in view.rows
        ]
        lines += md_table([md_text(h) for h in view.headers], cells)
    return lines + ([md_text(view.note), ""] if view.note else [])


def render_runtime_markdown(report: dict[str, Any], max_rows: int = 20) -> str:
    """The run, then every section of the report's index in its order (each table at most
    ``max_rows`` rows), then tracing errors and the trace."""
    t, code = md_text, md_code
    report = label_modules(report, (report.get("metadata") or {}).get("layer_numbers"))
    meta = report.get("metadata", {})
    lines = [
        f"# MemScope runtime report — rank {t(report.get('rank'))} of "
        f"{t(report.get('world_size'))}",
        "",
        f"- status: **{t(report.get('status'))}**"
        + (f" ({t(report['status_reason'])})" if report.get("status_reason") else ""),
        f"- backend: {code(meta.get('backend'))} on {t(meta.get('device_name'))}; "
        f"TP={t(meta.get('tp_size'))} PP={t(meta.get('pp_size'))} DP={t(meta.get('dp_size'))} "
        f"CP={t(meta.get('cp_size'))} EP={t(meta.get('ep_size'))}"
        + (f" VPP={t(meta['vpp_size'])}" if meta.get("vpp_size") else ""),
        f"- steps traced: {t(meta.get('steps_completed'))}; schema "
        f"{t(report.get('schema_version'))}, memscope {t(report.get('tool', {}).get('version'))}",
        *_run_lines(meta, report.get("training")),
        "",
    ]
    for spec in report_sections(report):
        value = report.get(spec.name)
        renderer = RENDERERS.get(spec.renderer)
        if renderer is not None:
            lines += renderer(report, value, max_rows)
        else:
            lines += generic_section_lines(spec, value, max_rows)
    if report.get("errors"):
        lines += ["## Tracing errors (training was not affected)", ""]
        lines += md_table(
            ["site", "count", "first error"],
            [
                [t(e["site"]), t(e["count"]), t(e["first_error"])]
                for e in report["errors"][:max_rows]
            ],
        )
    trace = report.get("trace", {})
    lines += [
        "## Trace",
        "",
        f"{t(trace.get('events_recorded'))} events recorded, {t(trace.get('events_in_report'))} "
        f"kept in this report (detail steps {t(trace.get('detail_steps'))}); full trace: "
        f"{code(trace.get('jsonl') or 'disabled')}.",
        "",
    ]
    return "\n".join(lines)
