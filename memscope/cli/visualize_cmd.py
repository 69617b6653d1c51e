"""``memscope visualize-runtime``: one self-contained HTML page for a rank or a whole job."""

from __future__ import annotations

import argparse
import os
import re
import time
from typing import Any

from memscope.cli.common import CliError, progress
from memscope.io.atomic import atomic_write_text
from memscope.io.report_reader import ReportError, load_report
from memscope.reporters.html import render_job_html, render_runtime_html
from memscope.reporters.html_payload import RankEntry, job_payload, runtime_payload
from memscope.reporters.runtime_json import REPORT_TYPE_RUNTIME

RANK_DIR = re.compile(r"^rank(\d+)$")
REPORT_NAME = "runtime_report.json"


def register(sub: Any) -> None:
    """Add the ``visualize-runtime`` subcommand."""
    p = sub.add_parser(
        "visualize-runtime",
        help="make a self-contained HTML page from a runtime report or a job directory",
        description=(
            "Build one self-contained HTML page (works offline) from a runtime_report.json, or "
            "from a directory of rankNNNNN/ folders for a whole-job view."
        ),
    )
    p.add_argument("--report", required=True, help="runtime_report.json or a job output directory")
    p.add_argument("--out", help="output .html (default: next to the report / in the directory)")
    p.set_defaults(run=run)


def _job_entries(directory: str) -> list[RankEntry]:
    entries = []
    for name in sorted(os.listdir(directory)):
        m = RANK_DIR.match(name)
        if not m or not os.path.isdir(os.path.join(directory, name)):
            continue
        rank = int(m.group(1))
        try:
            report = load_report(os.path.join(directory, name, REPORT_NAME), REPORT_TYPE_RUNTIME)
        except ReportError as exc:
            entries.append(RankEntry(rank, None, str(exc)))
            continue
        try:  # one malformed rank must not take the whole job page down
            job_payload([RankEntry(rank, report)], max_points=16)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            entries.append(RankEntry(rank, None, f"{name}/{REPORT_NAME}: malformed ({exc})"))
            continue
        entries.append(RankEntry(rank, report))
    return entries


def run(args: argparse.Namespace) -> int:
    """Build the page for a rank report or a job directory; prints the output path."""
    t0 = time.perf_counter()
    if os.path.isdir(args.report):
        entries = _job_entries(args.report)
        if not any(e.report is not None for e in entries):
            found = f"{len(entries)} rank folder(s), none readable" if entries else "no rankNNNNN/"
            raise CliError(f"{args.report}: no readable {REPORT_NAME} ({found})")
        progress(f"building the job page from {len(entries)} rank folder(s)")
        html = render_job_html(job_payload(entries))
        out = args.out or os.path.join(args.report, "job_report.html")
    else:
        try:
            report = load_report(args.report, REPORT_TYPE_RUNTIME)
        except ReportError as exc:
            raise CliError(str(exc)) from None
        events = len(report.get("runtime_trace") or [])
        if events > 100_000:
            progress(f"downsampling {events} events")
        try:
            html = render_runtime_html(runtime_payload(report))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CliError(f"{args.report}: malformed runtime report ({exc})") from None
        out = args.out or os.path.splitext(args.report)[0] + ".html"
    try:
        atomic_write_text(out, html)
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc}") from None
    if time.perf_counter() - t0 > 2:
        progress(f"wrote {len(html) / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s")
    print(out)
    return 0
