"""``memscope diff``: what changed between two steps of a run, or two runs (or two jobs)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from memscope.cli.common import CliError, check_output, progress


def register(sub: Any) -> None:
    """Add the ``diff`` subcommand."""
    p = sub.add_parser(
        "diff",
        help="compare two steps of one run, or two runs, or two jobs",
        description=(
            "Compare B with A: the peak and whether its moment moved, what was live at the "
            "peak by category x module x microbatch (new, vanished, changed), and with "
            "--step-a/--step-b two steps' totals, per-phase peaks and bytes per category. "
            "A and B are runtime_report.json files, rank folders or job directories (ranks "
            "are paired by number); leave out B to compare two steps of A. Writes diff.json, "
            "diff.md and diff.html into --out. Needs no torch."
        ),
    )
    p.add_argument("a", help="report, rank folder or job directory (A)")
    p.add_argument("b", nargs="?", default=None, help="the same for B (default: A)")
    p.add_argument("--step-a", type=int, default=None, help="a step of A to compare")
    p.add_argument("--step-b", type=int, default=None, help="a step of B (default: --step-a)")
    p.add_argument("--out", default="memscope_diff", help="directory for diff.json/.md/.html")
    p.add_argument(
        "--allow-layout-mismatch",
        action="store_true",
        help="pair the ranks of two jobs with different parallel layouts anyway (refused by "
        "default: the same rank number holds a different shard); the output labels it",
    )
    p.set_defaults(run=run)


def _reports(path: str) -> list[tuple[int, str]]:
    """(rank, report path) of a report file, a rank folder or a job directory."""
    from memscope.io.rank_folders import rank_files
    from memscope.io.report_reader import ReportError

    try:
        return rank_files(path)
    except ReportError as exc:
        raise CliError(str(exc)) from None


def console_line(rank: Any, diff: dict[str, Any]) -> str:
    """``rank 0: peak +1.50 MiB (11.20 MiB -> 12.70 MiB; moved: step 1 -> 3)``."""
    from memscope.units import format_bytes

    peak = diff["peak"]
    moved = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in peak["moved"].items())
    line = (
        f"rank {rank}: peak {format_bytes(peak['delta_bytes'], signed=True)} "
        f"({format_bytes(peak['a_bytes'])} -> {format_bytes(peak['b_bytes'])}; "
        f"{'moved: ' + moved if moved else 'same moment'})"
    )
    if not diff["layout"]["same"]:
        line += f"; different layouts: A {diff['layout']['a']}, B {diff['layout']['b']}"
    return line


def run(args: argparse.Namespace) -> int:
    """Read both sides, diff each rank pair, write the three files."""
    from memscope.analysis.diff import diff_reports, pair_ranks
    from memscope.cli import pages
    from memscope.cli.common import write_json_output, write_output
    from memscope.events.file_names import DIFF_REPORT_NAMES
    from memscope.reporters.diff_report import render_diff_markdown
    from memscope.reporters.html import render_diff_html

    b_path = args.b if args.b is not None else args.a
    if args.b is None and (args.step_a is None or args.step_b is None):
        raise CliError("one report: give --step-a and --step-b to compare two of its steps")
    step_b = args.step_b if args.step_b is not None else args.step_a
    a_side, b_side = _reports(args.a), _reports(b_path)
    if (len(a_side) == 1) != (len(b_side) == 1):
        raise CliError("compare a report with a report, or a job directory with a job directory")
    inputs = [p for _, p in a_side + b_side]
    outs = [os.path.join(args.out, name) for name in DIFF_REPORT_NAMES]
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        raise CliError(f"--out {args.out}: exists and is not a directory")
    for out in outs:
        check_output(out, inputs)
    if len(a_side) == 1:
        pairs: list[tuple[int, str, str]] = [(0, a_side[0][1], b_side[0][1])]
        unpaired: list[int] = []
    else:
        matched, unpaired = pair_ranks(a_side, b_side)
        pairs = [(rank, str(a), str(b)) for rank, a, b in matched]
        if not pairs:
            raise CliError("the two jobs have no rank in common")
    ranks = []
    for rank, a, b in pairs:
        report_a = pages.load_runtime_report(a)
        report_b = report_a if b == a else pages.load_runtime_report(b)
        try:
            diff = diff_reports(report_a, report_b, args.step_a, step_b)
        except ValueError as exc:
            raise CliError(f"rank {rank}: {exc}") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise CliError(f"rank {rank}: malformed report ({type(exc).__name__}: {exc})") from None
        grids = diff["layout"]
        if not grids["same"] and len(a_side) > 1 and not args.allow_layout_mismatch:
            raise CliError(
                f"the jobs have different parallel layouts (A: {grids['a']}, B: {grids['b']}): "
                "the same rank number holds a different shard in each; pass "
                "--allow-layout-mismatch to pair them by rank anyway"
            )
        name_a = a + (f" step {args.step_a}" if args.step_a is not None else "")
        name_b = b + (f" step {step_b}" if step_b is not None else "")
        ranks.append({"rank": report_a.get("rank", rank), "a": name_a, "b": name_b, "diff": diff})
    doc = {"ranks": ranks, "unpaired": unpaired}
    os.makedirs(args.out, exist_ok=True)
    write_json_output(outs[0], doc, inputs)
    write_output(outs[1], render_diff_markdown(doc), inputs)
    write_output(outs[2], render_diff_html(doc), inputs)
    if unpaired:
        progress(f"ranks in only one job, not compared: {unpaired}")
    for r in ranks:
        print(console_line(r["rank"], r["diff"]))
    print(f"-> {outs[0]}, {outs[1]}, {outs[2]}")
    return 0
