"""``memscope plan`` output: the plan document, its Markdown, and the FlagScale YAML snippet.

Plain data in (what :func:`memscope.analysis.static.planner.plan` returns), text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    if layout.get("pipeline_layout"):  # the user's own split: shown as Megatron reads it
        parts.append(f"pipeline layout {layout['pipeline_layout']}")
    if layout.get("first_stage_layers"):
        parts.append(f"first stage {layout['first_stage_layers']} layers")
    if layout.get("last_stage_layers"):
        parts.append(f"last stage {layout['last_stage_layers']} layers")
    if (layout.get("cp") or 1) > 1:
        parts.append(f"CP {layout['cp']}")
    if (layout.get("ep") or 1) > 1:
        parts.append(f"EP {layout['ep']}")
    parts += [f"DP {layout['dp']}", f"micro-batch {layout['micro_batch_size']}",
              f"recompute {layout['recompute'] or 'none'}"]  # fmt: skip
    return ", ".join(parts)


def _range(plan: Mapping[str, Any]) -> str:
    lo, hi = plan["peak_range_bytes"]
    return f"{format_bytes(plan['peak_bytes'])} ({format_bytes(lo)}–{format_bytes(hi)})"


#: How each cost term is printed.
TERM_NAMES = {"bubble": "bubble", "recompute": "recompute", "tp_comm": "TP comm",
               "cp_comm": "CP comm", "ep_comm": "EP comm", "dp_comm": "DP comm",
               "offload": "activation offload", "cpu_adam": "CPU Adam"}  # fmt: skip


def cost_text(cost: Mapping[str, float], terms: Sequence[str]) -> str:
    """``step time x1.190 (bubble 5.5%, ...)``: the factor and every term of the model."""
    parts = ", ".join(f"{TERM_NAMES.get(k, k)} {cost[k]:.1%}" for k in terms)
    return f"step time x{cost['total']:.3f} ({parts})"


def versus_text(changes: Mapping[str, float], terms: Sequence[str]) -> str:
    """By which terms a plan's step time differs from the baseline's, largest first."""
    moved = sorted((k for k in terms if abs(changes[k]) >= 5e-4), key=lambda k: -abs(changes[k]))
    parts = ", ".join(f"{TERM_NAMES.get(k, k)} {changes[k]:+.1%}" for k in moved)
    return f"step time {changes['total']:+.1%} vs your config" + (f" ({parts})" if parts else "")


def _host(plan: Mapping[str, Any]) -> str:
    host = plan.get("host_bytes_per_node") or 0
    return f"; host memory for offload {format_bytes(host)} per node" if host else ""


def plan_lines(doc: Mapping[str, Any]) -> list[str]:
    """What the command prints: :func:`plan_head`, then four lines per plan that fits."""
    out = plan_head(doc)
    terms = doc["cost_terms"]
    for i, p in enumerate(doc["plans"], 1):
        out += [
            f"{i}. {p['flags']}",
            f"   peak {_range(p)} on stage {p['binding_stage']}, headroom "
            f"{format_bytes(p['headroom_bytes'])}{_host(p)}",
            f"   {cost_text(p['cost'], terms)}",
            f"   {versus_text(p['vs_current'], terms)}; memory vs your config: "
            f"{_terms(p['term_changes'])}",
        ]
    return out


def plan_head(doc: Mapping[str, Any]) -> list[str]:
    """The budget, the user's layout (the baseline): its peak, whether it fits, its cost
    and its rank among the layouts that fit; and the calibration if any."""
    cur = doc["current"]
    gpu = format_bytes(doc["gpu_memory_bytes"])
    host = doc.get("host_memory_bytes")
    budget = (
        f"budget {format_bytes(doc['budget_bytes'])} per GPU ({gpu} less "
        f"{doc['headroom']:.0%} headroom)"
        + (f", {format_bytes(host)} host memory per node" if host else "")
        + f", {doc['world_size']} ranks; searched {doc['searched']} layouts, "
        f"{doc['fitting']} fit"
    )
    if doc.get("truncated"):
        budget += " (search cut at its layout limit)"
    if cur.get("world_size") != doc["world_size"]:
        verdict = f"not a layout of {doc['world_size']} ranks: {cur['note']}"
    elif not cur["fits"]:
        verdict = "does NOT fit" if cur["peak_bytes"] > doc["budget_bytes"] else (
            "does NOT fit the host memory")  # fmt: skip
    else:
        verdict = (
            f"fits; ranks #{cur['rank']} of {doc['fitting']} by step time (plans within "
            f"{doc['cost_resolution']:.1%} of it count as ties)"
        )
    note = (
        f" [{cur['note']}]"
        if cur.get("note") and cur.get("world_size") == doc["world_size"]
        else ""
    )
    out = [
        budget,
        f"your config{note} ({_layout(cur['layout'])}): peak {_range(cur)} on stage "
        f"{cur['binding_stage']} (largest term: {cur['binding_term']}){_host(cur)}: {verdict}",
        f"   baseline {cost_text(cur['cost'], doc['cost_terms'])}",
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
        "is relative to the same work with no bubble, recompute, communication or offload "
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
            f"{cost_text(c, doc['cost_terms'])}{_host(p)}; "
            f"{versus_text(p['vs_current'], doc['cost_terms'])}.",
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
