"""Renders a job summary (:func:`memscope.analysis.job.summarize_job`) as Markdown: one line
per rank (status, peak and where, static − runtime) and the job's heaviest rank.

Strings from the reports go through :func:`memscope.reporters.markdown.md_text`, as in the
rank summary.
"""

from __future__ import annotations

from typing import Any

from memscope.reporters.markdown import md_code, md_table, md_text
from memscope.units import format_bytes

#: Rank rows printed at most (a row per run of missing ranks; the rest are counted).
MAX_JOB_ROWS = 500


def _where(row: dict[str, Any]) -> str:
    if row.get("peak_step") is None:
        return "—"
    module = row.get("peak_module")
    return f"step {md_text(row['peak_step'])}, {md_text(row.get('peak_phase'))}" + (
        f", {md_code(module)}" if module else ""
    )


def _rank(row: dict[str, Any]) -> str:
    last = row.get("last_rank")
    return f"{row['rank']}–{last}" if last is not None else str(row["rank"])


def _status(row: dict[str, Any]) -> str:
    text = md_text(row.get("status"))
    if row.get("other_run"):
        text += f" (other run: {md_text(row.get('run_id'))})"
    problem = row.get("problem")
    return text + (f": {md_text(problem)}" if problem else "")


def render_job_markdown(summary: dict[str, Any], max_rows: int = MAX_JOB_ROWS) -> str:
    """The job's ranks as a table, then its heaviest rank and any mix-up of runs."""
    t = md_text
    runs = summary.get("runs") or []
    lines = [
        f"# MemScope job summary — {t(summary.get('world_size'))} ranks",
        "",
        f"- {t(summary.get('missing'))} missing, {t(summary.get('incomplete'))} not complete",
        "- run: " + (", ".join(md_code(r["run_id"]) for r in runs[:4]) or "—"),
    ]
    strays = summary.get("strays") or []
    if strays:
        names = ", ".join(md_text(x["where"]) for x in strays[:8])
        more = f" and {len(strays) - 8} more" if len(strays) > 8 else ""
        lines.append(
            f"- not counted: {names}{more}: folder(s) beyond the world size "
            f"{t(summary.get('world_size'))} the reports give, with no report"
        )
    if summary.get("runs_warning"):
        lines.append(f"- **mixed reports**: {t(summary['runs_warning'])}")
    heavy = summary.get("imbalance") or {}
    if heavy:
        lines.append(
            f"- heaviest rank: **{t(heavy['max_rank'])}** ({format_bytes(heavy['max_bytes'])}, "
            f"pp {t(heavy.get('max_pp_rank'))}, tp {t(heavy.get('max_tp_rank'))}); lightest "
            f"rank {t(heavy['min_rank'])} ({format_bytes(heavy['min_bytes'])}), "
            f"max / min {heavy['ratio']:.3f}"
        )
    lines.append("")
    rows = summary.get("ranks") or []
    lines += md_table(
        ["rank", "status", "pp", "tp", "dp", "peak allocated", "where", "static − runtime"],
        [
            [
                _rank(row),
                _status(row),
                t(row.get("pp_rank", "—")),
                t(row.get("tp_rank", "—")),
                t(row.get("dp_rank", "—")),
                format_bytes(row.get("peak_allocated")),
                _where(row),
                format_bytes(row.get("static_diff"), signed=True),
            ]
            for row in rows[:max_rows]
        ],
    )
    if len(rows) > max_rows:
        lines += [f"_{len(rows) - max_rows} more rows not shown_", ""]
    return "\n".join(lines)
