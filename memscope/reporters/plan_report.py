"""``memscope plan`` output: the plan document, its Markdown, and the FlagScale YAML snippet.

Plain data in (what :func:`memscope.analysis.static.planner.plan` returns), text out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memscope.reporters.runtime_json import document_identity
from memscope.units import format_bytes

REPORT_TYPE_PLAN = "plan"
#: Megatron argument -> the FlagScale training YAML section it goes in.
_MODEL_KEYS = frozenset({"micro_batch_size"})


def plan_document(result: Mapping[str, Any], config: str, gpu_memory: int, headroom: float) -> dict:
    """The ``plan.json`` document."""
    return {
        **document_identity(REPORT_TYPE_PLAN),
        "config": config,
        "gpu_memory_bytes": gpu_memory,
        "headroom": headroom,
        **result,
    }


def flagscale_yaml(args: Mapping[str, Any]) -> str:
    """The settings as a FlagScale training YAML snippet (``system:`` and ``model:``)."""
    sections: dict[str, list[str]] = {"system": [], "model": []}
    for key, value in args.items():
        text = "true" if value is True else "false" if value is False else str(value)
        sections["model" if key in _MODEL_KEYS else "system"].append(f"  {key}: {text}")
    return "\n".join(f"{name}:\n" + "\n".join(lines) for name, lines in sections.items() if lines)


def _terms(changes: Mapping[str, int]) -> str:
    ranked = sorted((k for k in changes if changes[k]), key=lambda k: -abs(changes[k]))
    return ", ".join(f"{k} {format_bytes(changes[k], signed=True)}" for k in ranked) or "none"


def _layout(layout: Mapping[str, Any]) -> str:
    parts = [f"TP {layout['tp']}", f"PP {layout['pp']}"]
    if layout.get("vpp"):
        parts.append(f"VPP {layout['vpp']}")
    if layout.get("last_stage_layers"):
        parts.append(f"last stage {layout['last_stage_layers']} layers")
    if (layout.get("cp") or 1) > 1:
        parts.append(f"CP {layout['cp']}")
    parts += [f"DP {layout['dp']}", f"micro-batch {layout['micro_batch_size']}",
              f"recompute {layout['recompute'] or 'none'}"]  # fmt: skip
    return ", ".join(parts)


def _range(plan: Mapping[str, Any]) -> str:
    lo, hi = plan["peak_range_bytes"]
    return f"{format_bytes(plan['peak_bytes'])} ({format_bytes(lo)}–{format_bytes(hi)})"


def plan_lines(doc: Mapping[str, Any]) -> list[str]:
    """What the command prints: :func:`plan_head`, then three lines per plan that fits."""
    out = plan_head(doc)
    for i, p in enumerate(doc["plans"], 1):
        c = p["cost"]
        out += [
            f"{i}. {p['flags']}",
            f"   peak {_range(p)} on stage {p['binding_stage']}, headroom "
            f"{format_bytes(p['headroom_bytes'])}; step time x{c['total']:.3f} (bubble "
            f"{c['bubble']:.1%}, recompute {c['recompute']:.1%}, TP comm {c['tp_comm']:.1%}, "
            f"CP comm {c['cp_comm']:.1%}, EP comm {c['ep_comm']:.1%})",
            f"   vs your config: {_terms(p['term_changes'])}",
        ]
    return out


def plan_head(doc: Mapping[str, Any]) -> list[str]:
    """The budget, the user's layout and whether it fits, and the calibration if any."""
    cur = doc["current"]
    verdict = "fits" if cur["fits"] else "does NOT fit"
    gpu = format_bytes(doc["gpu_memory_bytes"])
    out = [
        f"budget {format_bytes(doc['budget_bytes'])} per GPU ({gpu} less "
        f"{doc['headroom']:.0%} headroom), {doc['world_size']} ranks; searched "
        f"{doc['searched']} layouts, {doc['fitting']} fit",
        f"your config ({_layout(cur['layout'])}): peak {_range(cur)} on stage "
        f"{cur['binding_stage']} "
        f"(largest term: {cur['binding_term']}): {verdict}",
    ]
    cal = doc.get("calibration")
    if cal:
        factors = ", ".join(f"{k} x{v:.3f}" for k, v in cal["factors"].items())
        out.append(f"calibrated from {cal['ranks']} measured rank(s): {factors}")
    return out


def render_plan_markdown(doc: Mapping[str, Any]) -> str:
    """``plan.md``: the same as the terminal, with each plan's per-stage peaks and YAML."""
    lines = ["# MemScope plan", "", f"Config: `{doc['config']}`", ""]
    lines += [f"- {line}" for line in plan_head(doc)]
    lines += [
        "",
        "Peaks are MemScope's static estimate per pipeline stage; the range is its worst error "
        f"against NVIDIA's published GPU measurements (±{doc['uncertainty']:.1%}). Step time "
        "is relative to the same work with no bubble, recompute or TP/CP/EP communication "
        "(docs/planner.md).",
    ]
    for i, p in enumerate(doc["plans"], 1):
        c = p["cost"]
        lines += [
            "",
            f"## {i}. step time x{c['total']:.3f}, peak {_range(p)}",
            "",
            f"`{p['flags']}`",
            "",
            f"Why it fits, against your config's binding stage: {_terms(p['term_changes'])}.",
            "",
            "| stage | predicted peak | parameters | gradients | optimizer | activations |",
            "|---|---|---|---|---|---|",
        ]
        for s in p["stages"]:
            k = s["components"]
            lines.append(
                f"| {s['pp_rank']} | {format_bytes(s['peak_bytes'])} | "
                f"{format_bytes(k.get('parameters'))} | {format_bytes(k.get('gradients'))} | "
                f"{format_bytes(k.get('optimizer_state'))} | "
                f"{format_bytes(k.get('activations'))} |"
            )
        lines += ["", "```yaml", flagscale_yaml(p["flagscale_yaml"]), "```"]
    return "\n".join(lines) + "\n"
