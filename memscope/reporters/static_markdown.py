"""Renders ``static_report.md`` from a ``static_report.json`` dict."""

from __future__ import annotations

import textwrap
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
    (
        "fixed workspaces and buffers (cuBLAS, TE, its placeholder gradients; an RL KV cache)",
        "workspace_memory_bytes",
    ),
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
    lines += [
        _row([label, str(s.get(key, 0)), format_bytes(s.get(key, 0))])
        for label, key in _SUMMARY_ROWS
    ]
    lines += ["", f"Peak stage: {md_code(s['peak_stage'])}.", ""]
    extra = report.get("allowance") or {}
    if extra.get("total_bytes"):
        lines += [
            f"On the device: **{format_bytes(extra.get('device_total_bytes'))}** = the PyTorch "
            f"peak {format_bytes(s['peak_memory_bytes'])} + CUDA context "
            f"{format_bytes(extra.get('cuda_context_bytes'))} + NCCL buffers "
            f"{format_bytes(extra.get('nccl_buffer_bytes'))} (allocator fragmentation comes "
            "on top; see the GPU allowance).",
            "",
        ]
    lines += _coverage_lines(report.get("coverage"))
    lines += ["## Ranks", ""]
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
    lines += ["", _footer(report), ""]
    return "\n".join(lines)


def _coverage_lines(coverage: Any) -> list[str]:
    """The "Assumptions and coverage" section: assumptions, keys set but not modelled (with
    the memory effect missed), every config key the estimator does not read."""
    if not isinstance(coverage, dict):
        return []
    lines = ["## Assumptions and coverage", ""]
    lines += [f"- {md_text(a)}" for a in coverage.get("assumptions", [])]
    missing = coverage.get("not_modelled", [])
    lines += ["", f"Set in the config but not modelled ({len(missing)}):", ""]
    groups: dict[str, list[str]] = {}  # keys that share a reason share a line
    for n in missing:
        groups.setdefault(n["reason"], []).append(f"{md_code(n['key'])} = {md_code(n['value'])}")
    lines += [f"- {', '.join(keys)}: {md_text(reason)}" for reason, keys in groups.items()]
    if not missing:
        lines.append("- none")
    unused = coverage.get("unused_keys", [])
    lines += ["", f"Config keys the estimator does not use ({len(unused)}):", ""]
    text = ", ".join(md_code(k) for k in unused) if unused else "none"
    lines += textwrap.wrap(text, 100, break_long_words=False, break_on_hyphens=False)
    return [*lines, ""]


def _footer(report: dict[str, Any]) -> str:
    """What is modelled, approximated and not modelled for this config (the fixed
    approximations text for a report without a coverage block)."""
    coverage = report.get("coverage")
    if not isinstance(coverage, dict):
        return f"_Exact vs approximate: {md_text(report['metadata']['approximations'])}._"
    parts = [
        ("Modelled for this config", "modelled"),
        ("approximated", "approximated"),
        ("not modelled", "not_modelled_features"),
    ]
    shown = [f"{name}: {', '.join(md_text(x) for x in coverage.get(key) or []) or 'nothing'}"
             for name, key in parts]  # fmt: skip
    return "_" + "; ".join(shown) + "._"


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
