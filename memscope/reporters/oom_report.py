"""The OOM report of a rank: ``oom_report.json`` and its Markdown (plain data in, text out).

Built from a runtime report whose ``oom`` section is set (see :mod:`memscope.analysis.oom`):
the same identity keys as the runtime report, the rank's parallel coordinates, and the
section itself.
"""

from __future__ import annotations

from typing import Any

from memscope.events.schema import module_label
from memscope.reporters.markdown import md_code, md_text
from memscope.reporters.runtime_json import document_identity
from memscope.units import format_bytes

REPORT_TYPE_OOM = "oom"
COORDINATES = ("tp_rank", "pp_rank", "dp_rank", "cp_rank", "ep_rank", "vpp_size")


def oom_document(report: dict[str, Any]) -> dict[str, Any]:
    """``oom_report.json`` from a runtime report that has an ``oom`` section."""
    oom = report.get("oom")
    assert oom, "oom_document needs a report with an oom section"
    meta = report.get("metadata") or {}
    return {
        **document_identity(REPORT_TYPE_OOM),
        "run_id": meta.get("run_id"),
        "rank": report.get("rank"),
        "world_size": report.get("world_size"),
        "coordinates": {k: meta.get(k) for k in COORDINATES},
        **oom,
    }


def _leak_lines(leak: dict[str, Any] | None) -> list[str]:
    """The cause line when a leak with suspects was found before the failure."""
    if not leak:
        return []
    suspect = leak["suspect"]
    shape = suspect.get("shape")
    what = f" {md_code(str(shape))} {md_text(suspect.get('dtype', ''))}" if shape else ""
    line = f" at {md_code(suspect['line'])}" if suspect.get("line") else ""
    return [
        f"- cause: **a leak**: allocated grew {format_bytes(leak['bytes_per_step'])} per step "
        f"since step {md_text(leak['first_step'])}, kept by "
        f"{md_code(module_label(suspect.get('module')))} ({md_text(suspect.get('phase'))})"
        f"{what}{line}; fix it first (see the first remedy)"
    ]


def render_oom_markdown(doc: dict[str, Any], max_rows: int = 15) -> str:
    """The OOM report as Markdown: where, the verdict, what was live, remedies."""
    t, where = md_text, doc.get("where") or {}
    known = [(k, v) for k, v in (doc.get("coordinates") or {}).items() if v is not None]
    coords = ", ".join(f"{k.removesuffix('_rank').upper()}={t(v)}" for k, v in known)
    lines = [
        f"# Out of memory — rank {t(doc.get('rank'))} of {t(doc.get('world_size'))}",
        "",
        f"- coordinates: {coords or 'n/a'}",
        f"- failed in step {t(where.get('step'))}, phase {md_code(where.get('phase'))}, "
        f"module {md_code(module_label(where.get('module')))}, microbatch "
        f"{t(where.get('microbatch'))}, chunk {t(where.get('virtual_chunk'))}"
        + (f", op {md_code(doc['op'])}" if doc.get("op") else ""),
        f"- requested {format_bytes(doc.get('requested_bytes'))}, free "
        f"{format_bytes(doc.get('free_bytes'))}; allocated "
        f"{format_bytes(doc.get('allocated_bytes'))}, reserved "
        f"{format_bytes(doc.get('reserved_bytes'))} (cached free "
        f"{format_bytes(doc.get('cached_free_bytes'))}); outside PyTorch "
        f"{format_bytes(doc.get('outside_pytorch_bytes'))}",
        f"- verdict: **{t(doc.get('verdict'))} OOM**: {t(doc.get('verdict_reason'))}",
        f"- trend: **{t(doc.get('trend'))}**: {t(doc.get('trend_reason'))}",
        *_leak_lines(doc.get("leak")),
        "",
        "## Remedies (predicted by the static estimator for this rank)",
        "",
    ]
    capacity = doc.get("remedy_capacity_bytes")
    dropped = doc.get("remedies_dropped") or []
    if capacity is not None:
        lines += [
            f"Only changes whose predicted peak, plus the estimator's band, fits the "
            f"{format_bytes(capacity)} that ran out (PyTorch's allocated and cached memory and "
            "what was free); cheapest step time first.",
            "",
        ]
    remedies = doc.get("remedies") or []
    if remedies:
        lines += ["| # | change | flags | predicted peak | saving | step time |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for i, r in enumerate(remedies[:max_rows], 1):
            step = r.get("step_time")
            lines.append(
                f"| {i} | {t(r['name'])}{' (' + t(r['note']) + ')' if r.get('note') else ''} | "
                f"{md_code(r['flags'])} | {format_bytes(r.get('predicted_peak_bytes'))} | "
                f"{format_bytes(r.get('saving_bytes'))} | "
                f"{'x' + format(step, '.3f') if isinstance(step, float) else '—'} |"
            )
    elif dropped:
        lines.append(
            "None fits: every setting the estimator knows still predicts a peak above the "
            "capacity (see below); try `memscope plan` for combined changes."
        )
    else:
        lines.append("None: no static estimate for this run, or no setting the estimator "
                     "knows would lower this rank's peak.")  # fmt: skip
    if dropped:
        left = ", ".join(f"{t(r['name'])} ({format_bytes(r.get('predicted_peak_bytes'))})"
                         for r in dropped)  # fmt: skip
        lines += ["", f"Left out, predicted peak too high for the capacity: {left}."]
    lines += ["", "## Live when it failed", ""]
    items = doc.get("composition") or []
    if items:
        lines += ["| category | created in module | phase | microbatch | bytes |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for i in items[:max_rows]:
            lines.append(
                f"| {t(i['category'])} | {md_code(i['module']) if i['module'] else '—'} | "
                f"{t(i['phase']) or '—'} | "
                f"{'—' if i['microbatch'] is None else t(i['microbatch'])} | "
                f"{format_bytes(i['bytes'])} |"
            )
    else:
        lines.append("Not recorded by this backend (the storage backend records it).")
    lines += ["", "## Last steps", "", "| step | peak allocated | allocated at end |",
              "|---|---|---|"]  # fmt: skip
    for s in doc.get("recent_steps") or []:
        lines.append(f"| {t(s['step'])} | {format_bytes(s.get('peak_allocated'))} | "
                     f"{format_bytes(s.get('allocated_end'))} |")  # fmt: skip
    lines += ["", f"Message: {t(doc.get('message'))}", ""]
    return "\n".join(lines)
