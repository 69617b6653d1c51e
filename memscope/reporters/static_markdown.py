"""Renders ``static_report.md`` from a ``static_report.json`` dict."""

from __future__ import annotations

from typing import Any

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
    return "| " + " | ".join(cells) + " |"


def render_static_markdown(report: dict[str, Any]) -> str:
    """Summary of the selected rank, one line per estimated rank, then the operators."""
    s, meta = report["summary"], report["metadata"]
    lines = [
        "# MemScope static memory estimate",
        "",
        f"{meta['source']}; dtype `{meta['dtype']}`; world size {meta['world_size']}; "
        f"rank position tp={s['tp_rank']} pp={s['pp_rank']}; "
        f"{s['param_count']:,} parameters on this rank.",
        "",
        _row(["term", "bytes", ""]),
        _row(["---", "---:", "---:"]),
    ]
    lines += [_row([label, str(s[key]), format_bytes(s[key])]) for label, key in _SUMMARY_ROWS]
    lines += ["", f"Peak stage: `{s['peak_stage']}`.", "", "## Ranks", ""]
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
                + [format_bytes(r["peak_memory_bytes"]), r["peak_stage"]]
            )
        )
    allowance = report.get("allowance") or {}
    lines += [
        "",
        "## Not in the estimate (GPU allowance)",
        "",
        f"- CUDA context: {format_bytes(allowance.get('cuda_context_bytes'))}",
        f"- NCCL buffers: {format_bytes(allowance.get('nccl_buffer_bytes'))}",
        f"- allocator fragmentation: {allowance.get('fragmentation', 'n/a')}",
    ]
    lines += ["", "## Operators", "", _row(["name", "phase", "bytes", "formula", "notes"])]
    lines.append(_row(["---", "---", "---:", "---", "---"]))
    for op in report["operators"]:
        lines.append(
            _row(
                [
                    op["name"],
                    op["phase"],
                    format_bytes(op["memory_bytes"]),
                    f"`{op['formula']}`",
                    op["notes"],
                ]
            )
        )
    lines += ["", f"_Exact vs approximate: {meta['approximations']}._", ""]
    return "\n".join(lines)
