"""``memscope analyze-log`` output: the versioned ``log_report.json`` and its Markdown.

The Markdown iterates the document's ``sections`` index (declared in
:mod:`memscope.analysis.log_sections`) for each run, through the runtime report's generic
section renderer."""

from __future__ import annotations

from typing import Any

from memscope.events.sections import INDEX_KEY, SectionSpec, report_sections
from memscope.reporters.html_payload import page_sections
from memscope.reporters.markdown import generic_section_lines, md_code
from memscope.reporters.runtime_json import document_identity
from memscope.units import format_bytes

REPORT_TYPE_LOG = "log"


def log_report_document(body: dict[str, Any]) -> dict[str, Any]:
    """``log_report.json``: the identity keys (schema version, type, tool), then the body."""
    return {**document_identity(REPORT_TYPE_LOG), **body}


#: The log page's own section renderers (a partial ``templates/sections/<name>.html.j2`` and a
#: function of ``LOG_SECTIONS`` in ``templates/js/log_page.js``): only where a chart is drawn.
LOG_PAGE_RENDERERS = frozenset({"log_stages"})
#: Most rows of one section in the Markdown (a log prints one memory line per position).
MAX_ROWS = 1000


def run_sections(doc: dict[str, Any]) -> list[SectionSpec]:
    """The sections of every run, in page order, from the document's ``sections`` index (a
    document written before the index has none: its runs show their headings only)."""
    return report_sections({INDEX_KEY: doc.get(INDEX_KEY) or []})


def run_lines(run: dict[str, Any], specs: list[SectionSpec]) -> list[str]:
    """One run's Markdown: its heading, then each section of the index, drawn by its layout."""
    out = [f"## Run {run['index'] + 1}", ""]
    for spec in specs:
        out += generic_section_lines(spec, run.get(spec.name), MAX_ROWS, heading="###")
    return out


def log_payload(doc: dict[str, Any]) -> dict[str, Any]:
    """The log page's data: the document, plus per run its page sections (the runtime page's
    :func:`~memscope.reporters.html_payload.page_sections`, with the log page's renderers)."""
    index = doc.get(INDEX_KEY) or []
    pages = [
        page_sections({**run, INDEX_KEY: index}, MAX_ROWS, LOG_PAGE_RENDERERS)
        for run in doc["runs"]
    ]
    return {**doc, "run_sections": pages}


def render_log_markdown(doc: dict[str, Any]) -> str:
    """``log_report.md``: per run, the sections of the document's index in its order."""
    out = ["# MemScope: memory explained from a training log", ""]
    out.append("Logs: " + ", ".join(md_code(p) for p in doc["logs"]))
    out.append("")
    specs = run_sections(doc)
    for run in doc["runs"]:
        out += run_lines(run, specs)
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
                f"{format_bytes(s['predicted_max_allocated_bytes'])} ({s['status']}"
                + "".join(f"; within the band with {a}" for a in s.get("explained_if") or ())
                + ")"
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
