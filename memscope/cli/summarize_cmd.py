"""``memscope summarize``: print a runtime report's Markdown summary."""

from __future__ import annotations

import argparse
from typing import Any

from memscope.cli.common import CliError


def register(sub: Any) -> None:
    """Add the ``summarize`` subcommand."""
    p = sub.add_parser(
        "summarize",
        help="print the Markdown summary of a runtime_report.json",
        description="Print the Markdown summary of a runtime report.",
    )
    p.add_argument("--report", required=True, help="path to runtime_report.json")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read the report and print its Markdown."""
    from memscope.io.report_reader import ReportError, load_report
    from memscope.reporters.markdown import render_runtime_markdown
    from memscope.reporters.runtime_json import REPORT_TYPE_RUNTIME

    try:
        report = load_report(args.report, expected_type=REPORT_TYPE_RUNTIME)
    except ReportError as exc:
        raise CliError(str(exc)) from None
    try:
        text = render_runtime_markdown(report)  # every string from the report is escaped
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        raise CliError(
            f"{args.report}: malformed runtime report ({type(exc).__name__}: {exc})"
        ) from None
    print(text)
    return 0
