"""Renders ``static_report.md`` from a ``static_report.json`` dict."""

from __future__ import annotations

from typing import Any

from memscope.reporters.markdown import md_code, md_text
from memscope.units import format_bytes

_SUMMARY_ROWS = (
    ("weights", "weight_memory_bytes"),
    ("gradients", "grad_memory_bytes"),
    ("optimizer state", "optimizer_memory_bytes"),
    ("activations (in flight)", "activation_memory_bytes"),
    ("temporary (backward working set, buffers)", "temporary_memory_bytes"),
    ("persistent", "persistent_memory_bytes"),
    ("**peak**", "peak_memory_bytes"),
)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render_static_markdown(report: dict[str, Any]) -> str:
    """Summary of the selected rank, one line per estimated rank, then the operators."""
    s, meta = report["summary"], report["metadata"]
    lines = [
        "# MemScope static memory estimate",
        "",
        f"{md_text(meta['source'])}; dtype {md_code(meta['dtype'])}; world size "
        f"{md_text(meta['world_size'])}; rank position tp={md_text(s['tp_rank'])} "
        f"pp={md_text(s['pp_rank'])}; "
        f"{s['param_count']:,} parameters on this rank.",
        "",
        *_data_parallel_lines(report),
        _row(["term", "bytes", ""]),
        _row(["---", "---:", "---:"]),
    ]
    lines += [_row([label, str(s[key]), format_bytes(s[key])]) for label, key in _SUMMARY_ROWS]
    lines += ["", f"Peak stage: {md_code(s['peak_stage'])}.", "", "## Ranks", ""]
    lines.append(
        _row(
            [
                "tp",
                "pp",
                "global ranks",
                "params",
                "weights",
                "grads",
                "optimizer",
                "activations + temporary",
                "peak",
                "at",
            ]
        )
    )
    lines.append(_row(["---:"] * 9 + ["---"]))
    for r in report["ranks"]:
        c = r["components"]
        shown = ", ".join(str(g) for g in r["global_ranks"][:8])
        lines.append(
            _row(
                [str(r["tp_rank"]), str(r["pp_rank"]), shown, f"{r['param_count']:,}"]
                + [
                    format_bytes(c[k])
                    for k in ("parameters", "gradients", "optimizer_state", "activations")
                ]
                + [format_bytes(r["peak_memory_bytes"]), md_text(r["peak_stage"])]
            )
        )
    allowance = report.get("allowance") or {}
    lines += [
        "",
        "## Not in the estimate (GPU allowance)",
        "",
        f"- CUDA context: {format_bytes(allowance.get('cuda_context_bytes'))}",
        f"- NCCL buffers: {format_bytes(allowance.get('nccl_buffer_bytes'))}",
        f"- allocator fragmentation: {md_text(allowance.get('fragmentation', 'n/a'))}",
    ]
    lines += ["", "## Operators", "", _row(["name", "phase", "bytes", "formula", "notes"])]
    lines.append(_row(["---", "---", "---:", "---", "---"]))
    for op in report["operators"]:
        lines.append(
            _row(
                [
                    md_text(op["name"]),
                    md_text(op["phase"]),
                    format_bytes(op["memory_bytes"]),
                    md_code(op["formula"]),
                    md_text(op["notes"]),
                ]
            )
        )
    lines += ["", f"_Exact vs approximate: {md_text(meta['approximations'])}._", ""]
    return "\n".join(lines)


def _data_parallel_lines(report: dict[str, Any]) -> list[str]:
    """The selected rank and how the data-parallel size was found (assumed or given)."""
    out = []
    if "rank" in report:
        out.append(f"Detailed rank: {md_text(report['rank'])}.")
    dp = report.get("data_parallel")
    if isinstance(dp, dict):
        if dp.get("assumed"):
            out.append(f"**Data parallel assumed**: {md_text(dp.get('note', ''))}.")
        else:
            out.append(
                f"Data parallel: DP={md_text(dp.get('dp'))} from {md_text(dp.get('source'))}."
            )
    return [*out, ""] if out else []
