"""``memscope visualize-runtime``: one self-contained HTML page for a rank or a whole job."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from memscope.cli.common import check_output, progress


def register(sub: Any) -> None:
    """Add the ``visualize-runtime`` subcommand."""
    p = sub.add_parser(
        "visualize-runtime",
        help="make a self-contained HTML page from a runtime report or a job directory",
        description=(
            "Build one self-contained HTML page (works offline) from a runtime_report.json, or "
            "a whole-job view from job_summary.json (gathered in-run) or a directory of "
            "rankNNNNN/ folders."
        ),
    )
    p.add_argument(
        "--report",
        required=True,
        help="runtime_report.json, job_summary.json, or a job output directory",
    )
    p.add_argument(
        "--out",
        help="output .html (default: the report's path with .html, or job_report.html in "
        "the directory)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Build the page for a rank report or a job directory; prints the output path."""
    from memscope.cli import pages  # jinja2 and the reporters: only when a page is made
    from memscope.units import printable

    t0 = time.perf_counter()
    if os.path.isdir(args.report):
        out = args.out or pages.job_page_path(args.report)
        inputs = pages.job_inputs(args.report)
        check_output(out, inputs)  # before reading any rank: never a device, never an input
        entries = pages.readable_job_entries(args.report)
        progress(f"building the job page from {len(entries)} rank folder(s)")
        out = pages.write_job_page(entries, out, inputs)
    else:
        doc = pages.load_page_input(args.report)
        if doc.get("report_type") == pages.REPORT_TYPE_JOB_SUMMARY:
            out = args.out or os.path.join(
                os.path.dirname(os.path.abspath(args.report)), pages.JOB_PAGE_NAME
            )
            check_output(out, [args.report])
            entries = pages.job_summary_entries(doc, args.report)
            progress(f"building the job page from the summaries of {len(entries)} rank(s)")
            out = pages.write_job_page(entries, out, [args.report])
            print(printable(out))
            return 0
        out = args.out or pages.rank_page_path(args.report)
        check_output(out, [args.report])
        report = doc
        events = report.get("runtime_trace")
        if isinstance(events, list) and len(events) > 100_000:
            progress(f"downsampling {len(events)} events")
        out, _ = pages.write_rank_page(args.report, out, report=report)
    if time.perf_counter() - t0 > 2:
        size = os.path.getsize(out) / 2**20
        progress(f"wrote {size:.1f} MiB in {time.perf_counter() - t0:.1f} s")
    print(printable(out))
    return 0
