"""``memscope export``: a rank's (or a job's) trace as Chrome-trace / Perfetto JSON, or an
allocator snapshot labelled by MemScope category for pytorch.org/memory_viz."""

from __future__ import annotations

import argparse
import glob
import os
from typing import Any

from memscope.cli.common import (
    CliError,
    check_output,
    progress,
    write_json_output,
    write_pickle_output,
)


def register(sub: Any) -> None:
    """Add the ``export`` subcommand."""
    p = sub.add_parser(
        "export",
        help="a trace as Perfetto JSON, or a snapshot labelled for memory_viz",
        description=(
            "--trace: write the events of a rank's trace.jsonl (or of every rankNNNNN/ folder "
            "of a job directory) as Chrome-trace JSON that ui.perfetto.dev and chrome://tracing "
            "open: memory counter tracks per rank (and per category where recorded), step-phase "
            "and module-forward slices, gradient instants and the peak. --steps keeps a window "
            "of steps so a long run's file stays small. "
            "--snapshot: write a copy of an allocator snapshot whose allocations carry "
            "MemScope's category (memory_viz colours by it) and a first stack frame naming "
            "their owner or module, phase, microbatch and chunk, from the side files beside it. "
            "Needs no torch."
        ),
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="trace.jsonl, a rank folder or a job directory")
    source.add_argument("--snapshot", help="an allocator snapshot pickle (with its side files)")
    p.add_argument("--out", required=True, help="file to write (JSON, or a pickle)")
    p.add_argument("--steps", default=None, help="A:B keeps steps A to B-1 (default: all)")
    p.add_argument("--device", type=int, default=0, help="--snapshot: device index")
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
    """Export a trace (Perfetto) or a snapshot (memory_viz)."""
    if args.snapshot is not None:
        return _run_snapshot(args)
    return _run_trace(args)


def _run_snapshot(args: argparse.Namespace) -> int:
    from memscope.analysis.allocator_timeline import allocation_labels, replay
    from memscope.io.snapshot_reader import read_snapshot_bundle, side_files
    from memscope.reporters.memory_viz import memory_viz_snapshot
    from memscope.units import format_bytes

    path = args.snapshot
    if not os.path.lexists(path):
        raise CliError(f"{path}: no such snapshot file")
    if args.steps is not None:
        raise CliError("--steps applies to --trace; a snapshot covers the steps it recorded")
    if args.device < 0:
        raise CliError("--device must be >= 0")
    owners_path, markers_path = (p if os.path.exists(p) else None for p in side_files(path))
    found = [p for p in (owners_path, markers_path) if p]
    check_output(args.out, [path, *found])
    try:
        bundle = read_snapshot_bundle(path, owners_path, markers_path)
        events, blocks = allocation_labels(
            bundle.snapshot, args.device, bundle.owners, bundle.markers
        )
        labelled = memory_viz_snapshot(bundle.snapshot, args.device, events, blocks)
        peak = replay(labelled, args.device)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise CliError(f"{path}: malformed snapshot ({type(exc).__name__}: {exc})") from None
    progress("side files: " + (", ".join(os.path.basename(p) for p in found) or "none found"))
    write_pickle_output(args.out, labelled, [path])
    print(
        f"{len(events)} allocations and {len(blocks)} live blocks labelled; peak "
        f"{format_bytes(peak.allocated_bytes)} -> {args.out} (opens in pytorch.org/memory_viz)"
    )
    return 0


def _run_trace(args: argparse.Namespace) -> int:
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
