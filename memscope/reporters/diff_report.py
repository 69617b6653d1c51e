"""``memscope diff`` output: Markdown of one or many rank differences (plain data in)."""

from __future__ import annotations

from typing import Any

from memscope.reporters.markdown import md_code, md_text
from memscope.units import format_bytes


def _moment(m: dict[str, Any]) -> str:
    parts = [f"step {md_text(m.get('step'))}", md_text(m.get("phase"))]
    if m.get("module"):
        parts.append(md_code(m["module"]))
    if m.get("microbatch") is not None:
        parts.append(f"microbatch {md_text(m['microbatch'])}")
    return ", ".join(parts)


def _microbatch(row: dict[str, Any]) -> str:
    """One microbatch, or A's → B's microbatches of a row summed over them."""
    if "microbatches_a" in row:
        a = ",".join(str(m) for m in row["microbatches_a"]) or "—"
        b = ",".join(str(m) for m in row["microbatches_b"]) or "—"
        return md_text(a if a == b else f"{a} → {b}")
    return "—" if row["microbatch"] is None else md_text(row["microbatch"])


def _deltas(title: str, rows: dict[str, dict[str, int]]) -> list[str]:
    if not rows:
        return []
    lines = [f"### {title}", "", "| | A | B | B − A |", "|---|---|---|---|"]
    for name, d in rows.items():
        lines.append(
            f"| {md_text(name)} | {format_bytes(d['a'])} | {format_bytes(d['b'])} | "
            f"{format_bytes(d['delta'], signed=True)} |"
        )
    return [*lines, ""]


def render_rank_diff(
    diff: dict[str, Any], a_name: str, b_name: str, max_rows: int = 30
) -> list[str]:
    """The lines for one rank's difference."""
    t, peak = md_text, diff["peak"]
    lines = [
        f"- A: {t(a_name)}",
        f"- B: {t(b_name)}",
        f"- peak: {format_bytes(peak['a_bytes'])} → {format_bytes(peak['b_bytes'])} "
        f"(**{format_bytes(peak['delta_bytes'], signed=True)}**)",
        f"- peak moment: {_moment(peak['a_moment'])} → {_moment(peak['b_moment'])}"
        + ("" if peak["moved"] else " (unchanged)"),
        "",
    ]
    grids = diff.get("layout") or {"same": True}
    if not grids["same"]:
        lines += [
            f"**Different parallel layouts**: A is {t(grids['a'])}, B is {t(grids['b'])}. "
            "The two ranks hold different shards, so their items are not like for like.",
            "",
        ]
    steps = diff.get("steps")
    if steps:
        lines += [f"Step {t(steps['a_step'])} (A) against step {t(steps['b_step'])} (B).", ""]
        lines += _deltas("Step totals", steps["totals"])
        lines += _deltas("Per-phase high-water marks", steps["phase_peaks"])
        lines += _deltas("Bytes per category at the step's end", steps["categories_end"])
    comp = diff["composition"]
    lines += _deltas("Live at the peak, per category", comp["by_category"])
    if not comp["available"]:
        lines += [f"No comparison of what was live: {md_text(comp['reason'])}.", ""]
    elif comp["rows"]:
        lines += ["### Live at the peak: what changed", ""]
        if comp.get("over_microbatches"):
            lines += [
                "The live microbatches differ between A and B, so items are compared per "
                "category and module, summed over microbatches (A's → B's microbatches)"
                + (
                    f"; {comp['moved_between_microbatches']} more only moved between "
                    "microbatches with the same bytes."
                    if comp.get("moved_between_microbatches")
                    else "."
                ),
                "",
            ]
        lines += ["| status | category | module | microbatch | A | B | B − A |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in comp["rows"][:max_rows]:
            lines.append(
                f"| {t(r['status'])} | {t(r['category'])} | "
                f"{md_code(r['module']) if r['module'] else '—'} | {_microbatch(r)} | "
                f"{format_bytes(r['a_bytes'])} | {format_bytes(r['b_bytes'])} | "
                f"{format_bytes(r['delta_bytes'], signed=True)} |"
            )
        lines.append("")
    return lines


def render_diff_markdown(doc: dict[str, Any]) -> str:
    """The whole ``diff.md``: one section per rank pair (a job) or one rank."""
    lines = ["# MemScope diff (B − A)", ""]
    for pair in doc["ranks"]:
        if len(doc["ranks"]) > 1:
            lines += [f"## Rank {md_text(pair['rank'])}", ""]
        lines += render_rank_diff(pair["diff"], pair["a"], pair["b"])
    if doc.get("unpaired"):
        ranks = ", ".join(str(r) for r in doc["unpaired"])
        lines += [f"Ranks in only one of the two jobs (not compared): {md_text(ranks)}.", ""]
    return "\n".join(lines)
