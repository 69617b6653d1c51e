"""``memscope visualize-runtime``: one self-contained HTML page for a rank or a whole job."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from memscope.cli.common import add_report_arguments, check_output, progress
from memscope.events.file_names import JOB_PAGE_NAME
from memscope.io.rank_folders import ALL_RANK_PAGES_UP_TO


def register(sub: Any) -> None:
    """Add the ``visualize-runtime`` subcommand."""
    p = sub.add_parser(
        "visualize-runtime",
        help="make a self-contained HTML page from a runtime report or a job directory",
        description=(
            "Build one self-contained HTML page (works offline) from a runtime_report.json (or "
            "its rankNNNNN/ folder), or a whole-job view from job_summary.json (gathered "
            "in-run) or a directory of rankNNNNN/ folders; for a directory, every rank's page "
            "too, linked from the job page. Rank reports of another run, duplicate ranks or "
            "grid positions, or disagreeing world sizes are refused unless told otherwise."
        ),
    )
    add_report_arguments(p)
    p.add_argument(
        "--out",
        help="output .html (default: the report's path with .html, or job_report.html in "
        "the directory)",
    )
    p.add_argument(
        "--job-only",
        action="store_true",
        help="job directory: write the job page only, not each rank's page",
    )
    p.add_argument(
        "--all-rank-pages",
        action="store_true",
        help=f"job directory of more than {ALL_RANK_PAGES_UP_TO} ranks: write every rank's "
        "page, not only those of the ranks the job page plots",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Build the page for a rank report or a job directory; prints the output path."""
    from memscope.cli import pages  # jinja2 and the reporters: only when a page is made
    from memscope.io.rank_folders import folder_file, is_job_directory
    from memscope.units import printable

    t0 = time.perf_counter()
    if is_job_directory(args.report):
        directory = args.report
        out = args.out or pages.job_page_path(directory)
        inputs = pages.job_inputs(directory)
        check_output(out, inputs)  # before reading any rank: never a device, never an input
        entries = pages.readable_job_entries(directory)
        entries = pages.one_launch(entries, directory, args.run_id, args.allow_mixed_runs)
        if not args.job_only:
            written, reported = pages.write_rank_pages(
                entries, directory, out, every=args.all_rank_pages
            )
            progress(
                f"wrote {written} rank page(s), rankNNNNN/runtime_report.html "
                "(--job-only skips them)"
            )
            if reported > ALL_RANK_PAGES_UP_TO and not args.all_rank_pages:
                progress(
                    f"the other {reported - written} rank(s) have no page: over "
                    f"{ALL_RANK_PAGES_UP_TO} ranks only those the job page plots get "
                    "one (--all-rank-pages writes every one, ~5 MB each)"
                )
        progress(f"building the job page from {len(entries)} rank folder(s)")
        out = pages.write_job_page(entries, out, inputs)
    else:
        report_path = folder_file(args.report)  # a rank folder is its report
        doc = pages.load_page_input(report_path)
        if doc.get("report_type") == pages.REPORT_TYPE_JOB_SUMMARY:
            out = args.out or os.path.join(
                os.path.dirname(os.path.abspath(report_path)), JOB_PAGE_NAME
            )
            check_output(out, [report_path])
            entries = pages.job_summary_entries(doc, report_path)
            entries = pages.one_launch(entries, report_path, args.run_id, args.allow_mixed_runs)
            progress(f"building the job page from the summaries of {len(entries)} rank(s)")
            out = pages.write_job_page(entries, out, [report_path])
            print(printable(out))
            return 0
        out = args.out or pages.rank_page_path(report_path)
        check_output(out, [report_path])
        report = doc
        events = report.get("runtime_trace")
        if isinstance(events, list) and len(events) > 100_000:
            progress(f"downsampling {len(events)} events")
        job_page = pages.job_page_beside(report_path)
        out, _ = pages.write_rank_page(report_path, out, report=report, job_page=job_page)
    if time.perf_counter() - t0 > 2:
        size = os.path.getsize(out) / 2**20
        progress(f"wrote {size:.1f} MiB in {time.perf_counter() - t0:.1f} s")
    print(printable(out))
    return 0
