"""Renders a runtime report dict as a readable Markdown summary."""

from __future__ import annotations

from typing import Any

from memscope.units import format_bytes, format_ratio


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["_none_", ""]
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return [*out, ""]


def _where(d: dict[str, Any]) -> str:
    parts = [f"step {d.get('step')}", f"phase `{d.get('phase')}`"]
    if d.get("module"):
        parts.append(f"module `{d['module']}`")
    if d.get("microbatch") is not None:
        parts.append(f"microbatch {d['microbatch']}")
    return ", ".join(parts)


def render_runtime_markdown(report: dict[str, Any], max_rows: int = 20) -> str:
    """Peak and where, comparisons, per-phase maxima, top events, modules, steps."""
    meta = report.get("metadata", {})
    peak = report.get("peak", {})
    lines = [
        f"# MemScope runtime report — rank {report.get('rank')} of {report.get('world_size')}",
        "",
        f"- status: **{report.get('status')}**"
        + (f" ({report['status_reason']})" if report.get("status_reason") else ""),
        f"- backend: `{meta.get('backend')}` on {meta.get('device_name')}; "
        f"TP={meta.get('tp_size')} PP={meta.get('pp_size')} DP={meta.get('dp_size')} "
        f"CP={meta.get('cp_size')} EP={meta.get('ep_size')} VPP={meta.get('vpp_size')}",
        f"- steps traced: {meta.get('steps_completed')}; schema {report.get('schema_version')}, "
        f"memscope {report.get('tool', {}).get('version')}",
        "",
        "## Peak",
        "",
        f"- allocated peak: **{format_bytes(peak.get('memory_bytes'))}** at {_where(peak)} "
        f"(attribution: {peak.get('attribution')})",
        f"- reserved peak: {format_bytes(peak.get('reserved_bytes'))}",
    ]
    if peak.get("categories"):
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in peak["categories"].items())
        lines.append(f"- live at the peak: {parts}")
    lines.append("")

    comp = report.get("comparisons", {})
    lines += ["## Static estimate vs runtime", ""]
    if comp.get("status") != "ok":
        lines += [f"Static estimate missing: {comp.get('reason', 'unknown reason')}.", ""]
    else:
        lines += [
            f"- static peak {format_bytes(comp.get('static_peak_memory_bytes'))}, runtime peak "
            f"{format_bytes(comp.get('runtime_peak_memory_bytes'))}, difference "
            f"{format_bytes(comp.get('peak_diff_bytes'), signed=True)} "
            f"({format_ratio(comp.get('peak_diff_ratio'))})",
            "",
        ]
        lines += _table(
            ["component", "static", "runtime", "static − runtime", "ratio"],
            [
                [
                    c["component"],
                    format_bytes(c.get("static_bytes")),
                    format_bytes(c.get("runtime_bytes")),
                    format_bytes(c.get("diff_bytes"), signed=True),
                    format_ratio(c.get("diff_ratio")),
                ]
                for c in comp.get("components", [])
            ],
        )

    lines += ["## Per-phase maxima", ""]
    lines += _table(
        ["phase", "events", "max allocated (high-water)", "max allocated after", "max Δ", "min Δ"],
        [
            [
                p["phase"],
                str(p["count"]),
                format_bytes(p["max_mem_allocated"]),
                format_bytes(p["max_mem_allocated_after"]),
                format_bytes(p["max_delta_allocated"], signed=True),
                format_bytes(p["min_delta_allocated"], signed=True),
            ]
            for p in report.get("phase_summary", [])
        ],
    )
    lines += ["## Top events (deduplicated)", ""]
    lines += _table(
        ["event", "module", "phase", "count", "allocated after", "max Δ", "min Δ", "worst step"],
        [
            [
                t["event_type"],
                f"`{t['module']}`" if t["module"] else "—",
                t["phase"],
                str(t["count"]),
                format_bytes(t["mem_allocated_after"]),
                format_bytes(t["max_delta_allocated"], signed=True),
                format_bytes(t["min_delta_allocated"], signed=True),
                str(t["worst_step"]),
            ]
            for t in report.get("top_events", [])[:max_rows]
        ],
    )
    lines += ["## Modules by largest allocation increase", ""]
    lines += _table(
        ["module", "class", "events", "max allocated after", "max Δ", "min Δ"],
        [
            [
                f"`{m['module']}`",
                m["module_class"],
                str(m["count"]),
                format_bytes(m["max_allocated_after"]),
                format_bytes(m["max_delta_allocated"], signed=True),
                format_bytes(m["min_delta_allocated"], signed=True),
            ]
            for m in report.get("module_summary", [])[:max_rows]
        ],
    )
    lines += ["## Steps", ""]
    lines += _table(
        ["step", "start", "end", "peak", "peak phase", "reserved peak", "host RSS"],
        [
            [
                str(st["step"]),
                format_bytes(st["allocated_start"]),
                format_bytes(st["allocated_end"]),
                format_bytes(st["peak_allocated"]),
                st["peak_phase"],
                format_bytes(st["peak_reserved"]),
                format_bytes(st.get("host_rss_end")),
            ]
            for st in report.get("steps", [])[:max_rows]
        ],
    )
    if report.get("errors"):
        lines += ["## Tracing errors (training was not affected)", ""]
        lines += _table(
            ["site", "count", "first error"],
            [[e["site"], str(e["count"]), e["first_error"]] for e in report["errors"]],
        )
    trace = report.get("trace", {})
    lines += [
        "## Trace",
        "",
        f"{trace.get('events_recorded')} events recorded, {trace.get('events_in_report')} kept "
        f"in this report (detail steps {trace.get('detail_steps')}); full trace: "
        f"`{trace.get('jsonl') or 'disabled'}`.",
        "",
    ]
    return "\n".join(lines)
