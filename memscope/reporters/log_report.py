"""``memscope analyze-log`` output: the versioned ``log_report.json`` and its Markdown."""

from __future__ import annotations

from typing import Any

from memscope.reporters.markdown import md_code, md_table, md_text
from memscope.reporters.runtime_json import document_identity
from memscope.units import format_bytes, format_percent

REPORT_TYPE_LOG = "log"


def log_report_document(body: dict[str, Any]) -> dict[str, Any]:
    """``log_report.json``: the identity keys (schema version, type, tool), then the body."""
    return {**document_identity(REPORT_TYPE_LOG), **body}


def _grid(grid: dict[str, int] | None) -> str:
    if not grid:
        return "unknown"
    return " ".join(f"{k}{v}" for k, v in grid.items())


def _verdict(v: dict[str, Any]) -> str:
    if v["status"] == "within_band":
        return f"within ±{format_percent(v['band'])}"
    text = f"{v['status']} by {format_bytes(v['error_bytes'], signed=True)}"
    if v["error_ratio"] is not None:
        text += f" ({format_percent(v['error_ratio'])})"
    if v["cannot_explain"]:
        text += "; too small alone: " + ", ".join(v["cannot_explain"])
    return text


def run_lines(run: dict[str, Any]) -> list[str]:
    """One run's Markdown section."""
    out = [f"## Run {run['index'] + 1}", ""]
    out.append("Logs: " + ", ".join(md_code(s) for s in run["sources"]))
    out.append("")
    if run.get("config"):
        c = run["config"]
        lay = c["layout"]
        out.append(
            f"Configuration from the {md_text(c['origin'])} ({md_code(c['where'])}); world size "
            f"{c['world_size']} ({md_text(c['world_origin'])}); rank order "
            f"{md_code(c['rank_order'])}."
        )
        out.append("")
        out.append(", ".join(f"{k} {md_text(v)}" for k, v in lay.items() if v not in (None, False)))
        out.append("")
    if run.get("error"):
        out += [f"**Not explained:** {md_text(run['error'])}", ""]
    if run["stages"]:
        out += ["### Per pipeline stage: measured vs predicted max allocated", ""]
        out += md_table(
            ["stage", "rank", "iteration", "measured", "predicted", "verdict"],
            [[str(s["pp_rank"]), str(s["rank"]), str(s["iteration"]),
              format_bytes(s["measured_max_allocated_bytes"]),
              format_bytes(s["predicted_max_allocated_bytes"]), md_text(s["status"])]
             for s in run["stages"]],
        )  # fmt: skip
    if run["ranks"]:
        out += ["### Ranks that printed memory", ""]
        rows = []
        for r in run["ranks"]:
            m, e = r["measured"], r["estimate"]
            rows.append([
                str(r["rank"]), md_text(_grid(r["grid"])), str(r["iteration"]),
                str(r["optimizer_steps"]), format_bytes(m["allocated"]),
                format_bytes(m["max_allocated"]), format_bytes(m["reserved"]),
                format_bytes(m["max_reserved"]),
                format_bytes(e["allocated_bytes"]) if e else "n/a",
                format_bytes(e["max_allocated_bytes"]) if e else "n/a",
                md_text(_verdict(r["verdict"])) if r["verdict"] else "not estimated",
            ])  # fmt: skip
        out += md_table(
            ["rank", "grid", "after iter", "real steps", "allocated", "max allocated",
             "reserved", "max reserved", "estimate (allocated)", "estimate (max allocated)",
             "verdict (max allocated)"], rows,
        )  # fmt: skip
        first = run["ranks"][0]
        if first["estimate"]:
            out += [f"Estimate of rank {first['rank']} by term ({md_text(first['moment'])}):", ""]
            out += md_table(
                ["term", "bytes"],
                [[md_text(k), format_bytes(v)] for k, v in first["estimate"]["terms"].items()],
            )
        if first.get("megatron_theoretical_mb"):
            t = first["megatron_theoretical_mb"]
            out += [
                f"Megatron's theoretical figure (first stage): weight and optimizer "
                f"{t['weight_and_optimizer_mb']:.2f} MB"
                + (f", total {t['total_mb']:.2f} MB" if t.get("total_mb") else "")
                + ".",
                "",
            ]
    for oom in run["ooms"]:
        out += _oom_lines(oom)
    if run["notes"]:
        out += ["### Notes", ""] + [f"- {md_text(n)}" for n in run["notes"]] + [""]
    return out


def _oom_lines(oom: dict[str, Any]) -> list[str]:
    s = oom["sizes"]
    rank = "unknown rank" if oom["rank"] is None else f"rank {oom['rank']}"
    out = [f"### Out of memory on {rank} ({md_code(oom['where'])})", ""]
    out.append(
        f"Tried to allocate {format_bytes(s['requested'])} of {format_bytes(s['total'])}; free "
        f"{format_bytes(s['free'])}; allocated by PyTorch {format_bytes(s['allocated'])}; "
        f"reserved but unallocated {format_bytes(s['reserved_unallocated'])}."
    )
    frag = oom["fragmentation"]
    if frag["could_have_served_the_request"]:
        advice = md_text(frag["advice"])
        out.append(f"Fragmentation: the cached free bytes exceed the request; {advice}.")
    out += [
        "",
        f"Estimate for the rank ({md_text(oom['moment'])}): "
        f"{format_bytes(oom['estimate']['peak_bytes'])}; "
        f"need at least {format_bytes(oom['need_bytes'])} against "
        f"{format_bytes(oom['capacity_bytes'])} PyTorch could hold.",
        "",
    ]
    out += md_table(
        ["remedy", "flags", "saving", "projected need", "fits"],
        [[md_text(r["name"]), md_code(r["flags"]), format_bytes(r["saving_bytes"]),
          format_bytes(r["projected_need_bytes"]), "yes" if r["fits"] else "no"]
         for r in oom["remedies"]],
    )  # fmt: skip
    return out


def render_log_markdown(doc: dict[str, Any]) -> str:
    """``log_report.md``."""
    out = ["# MemScope: memory explained from a training log", ""]
    out.append("Logs: " + ", ".join(md_code(p) for p in doc["logs"]))
    out.append("")
    for run in doc["runs"]:
        out += run_lines(run)
    return "\n".join(out).rstrip() + "\n"


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """What the command prints: one line per stage and per out-of-memory message."""
    out = []
    for run in doc["runs"]:
        head = f"run {run['index'] + 1}:"
        if run.get("error"):
            out.append(f"{head} not explained: {run['error']}")
            if run["ranks"]:
                out.append(f"{head} {len(run['ranks'])} memory lines reported as measured")
        for s in run["stages"]:
            out.append(
                f"{head} stage {s['pp_rank']} (rank {s['rank']}, after {s['iteration']} "
                "iterations): "
                f"measured {format_bytes(s['measured_max_allocated_bytes'])}, predicted "
                f"{format_bytes(s['predicted_max_allocated_bytes'])} ({s['status']})"
            )
        for o in run["ooms"]:
            fits = [r["name"] for r in o["remedies"] if r["fits"]]
            rank = "?" if o["rank"] is None else o["rank"]
            out.append(
                f"{head} out of memory on rank {rank}: tried "
                f"{format_bytes(o['sizes']['requested'])}, "
                f"free {format_bytes(o['sizes']['free'])}; remedies that fit: "
                + (", ".join(fits) or "none")
            )
    return out
