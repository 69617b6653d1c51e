"""``memscope summarize``: print a runtime report's Markdown summary, or a job's."""

from __future__ import annotations

import argparse
from typing import Any

from memscope.cli.common import MALFORMED, CliError, add_report_arguments


def register(sub: Any) -> None:
    """Add the ``summarize`` subcommand."""
    p = sub.add_parser(
        "summarize",
        help="print the Markdown summary of a runtime report, or of a whole job",
        description=(
            "Print the Markdown summary of a runtime report (or its rankNNNNN/ folder); of a "
            "job directory of rankNNNNN/ folders or a job_summary.json, the job's summary: "
            "per rank its status, peak and where, static − runtime, and the heaviest rank."
        ),
    )
    add_report_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read the report (or the job's) and print its Markdown."""
    from memscope.io.rank_folders import folder_file, is_job_directory

    if is_job_directory(args.report):
        return _job(args, args.report, None)
    path = folder_file(args.report)  # a rank folder is its report
    from memscope.io.report_reader import ReportError, load_report
    from memscope.reporters.job_summary_json import REPORT_TYPE_JOB_SUMMARY
    from memscope.reporters.markdown import render_runtime_markdown
    from memscope.reporters.runtime_json import REPORT_TYPE_RUNTIME

    try:
        report = load_report(path)
    except ReportError as exc:
        raise CliError(str(exc)) from None
    if report.get("report_type") == REPORT_TYPE_JOB_SUMMARY:
        return _job(args, path, report)
    if report.get("report_type") != REPORT_TYPE_RUNTIME:
        raise CliError(
            f"{path}: is a {report.get('report_type')!r:.40} report; summarize takes a runtime "
            "report, a job_summary.json or a job directory"
        )
    try:
        text = render_runtime_markdown(report)  # every string from the report is escaped
    except MALFORMED as exc:
        raise CliError(f"{path}: malformed runtime report ({type(exc).__name__}: {exc})") from None
    print(text)
    return 0


def _job(args: argparse.Namespace, path: str, doc: dict[str, Any] | None) -> int:
    """The job summary of a job directory (``doc`` None) or of a job_summary.json."""
    from memscope.analysis.job import summarize_job
    from memscope.cli import pages
    from memscope.reporters.job_markdown import render_job_markdown

    if doc is None:
        entries = pages.readable_job_entries(path)
    else:
        entries = pages.job_summary_entries(doc, path)
    entries = pages.one_launch(entries, path, args.run_id, args.allow_mixed_runs)
    print(render_job_markdown(summarize_job(entries)))
    return 0
