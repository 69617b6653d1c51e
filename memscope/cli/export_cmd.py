"""``memscope export``: a rank's (or a job's) trace as Chrome-trace / Perfetto JSON."""

from __future__ import annotations

import argparse
import glob
import os
from typing import Any

from memscope.cli.common import CliError, check_output, progress, write_json_output


def register(sub: Any) -> None:
    """Add the ``export`` subcommand."""
    p = sub.add_parser(
        "export",
        help="a rank's or a job's trace as Chrome-trace / Perfetto JSON",
        description=(
            "Write the events of a rank's trace.jsonl (or of every rankNNNNN/ folder of a job "
            "directory) as Chrome-trace JSON that ui.perfetto.dev and chrome://tracing open: "
            "memory counter tracks per rank (and per category where recorded), step-phase and "
            "module-forward slices, gradient instants and the peak. --steps keeps a window of "
            "steps so a long run's file stays small. Needs no torch."
        ),
    )
    p.add_argument("--trace", required=True, help="trace.jsonl, a rank folder or a job directory")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--steps", default=None, help="A:B keeps steps A to B-1 (default: all)")
    p.set_defaults(run=run)


def _traces(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    own = os.path.join(path, "trace.jsonl")
    if os.path.isfile(own):
        return [own]
    found = sorted(glob.glob(os.path.join(path, "rank[0-9]*", "trace.jsonl")))
    if not found:
        raise CliError(f"{path}: no trace.jsonl here or in rankNNNNN/ folders")
    return found


def _window(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        lo, hi = (int(v) for v in text.split(":"))
    except ValueError:
        raise CliError(f"--steps {text!r}: expected A:B with integers A < B") from None
    if lo >= hi:
        raise CliError(f"--steps {text!r}: expected A:B with integers A < B")
    return lo, hi


def run(args: argparse.Namespace) -> int:
    """Read each trace, keep the step window, write one JSON file."""
    from memscope.events.trace_reader import TraceError, read_trace
    from memscope.reporters.perfetto import chrome_trace, rank_trace_events

    if not os.path.lexists(args.trace):
        raise CliError(f"{args.trace}: no such trace file or directory")
    window = _window(args.steps)
    paths = _traces(args.trace)
    check_output(args.out, paths)
    ranks: dict[int, list[dict[str, Any]]] = {}
    for path in paths:
        try:
            header, events = read_trace(path)
            kept = [
                e.to_dict() for e in events if window is None or window[0] <= e.step < window[1]
            ]
        except TraceError as exc:
            raise CliError(str(exc)) from None
        rank = header.fields.get("rank")
        rank = rank if isinstance(rank, int) and rank not in ranks else len(ranks)
        ranks[rank] = rank_trace_events(rank, kept)
        progress(f"rank {rank}: {len(kept)} events from {path}")
    write_json_output(args.out, chrome_trace(ranks), paths)
    print(f"{sum(len(v) for v in ranks.values())} trace events -> {args.out}")
    return 0
