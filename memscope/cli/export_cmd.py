"""``memscope export``: a rank's (or a job's) trace as Chrome-trace / Perfetto JSON, or an
allocator snapshot labelled by MemScope category for pytorch.org/memory_viz."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from memscope.cli.common import (
    CliError,
    check_output,
    progress,
    write_json_output,
    write_pickle_output,
)

#: The default size limit of one exported trace file (ui.perfetto.dev loads JSON traces into
#: browser memory; files of a few hundred MB are where it starts to fail).
DEFAULT_MAX_FILE_MB = 250.0


def register(sub: Any) -> None:
    """Add the ``export`` subcommand."""
    p = sub.add_parser(
        "export",
        help="a trace as Perfetto JSON, or a snapshot labelled for memory_viz",
        description=(
            "--trace: write the events of a rank's trace.jsonl (or of every rankNNNNN/ folder "
            "of a job directory) as Chrome-trace JSON that ui.perfetto.dev and chrome://tracing "
            "open: memory counter tracks per rank (and per category where recorded), step-phase "
            "and module-forward slices, gradient instants, the peak and where training died (OOM "
            "or crash). --steps keeps a window of steps; a larger export is split into files of "
            "whole steps of at most --max-file-mb each. "
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
    p.add_argument(
        "--max-file-mb",
        type=float,
        default=DEFAULT_MAX_FILE_MB,
        help="--trace: a larger export is split into files of whole steps, each at most this "
        "size (OUT.stepsA-B.json), so that the Perfetto UI can open every one; --snapshot: "
        "warn above it",
    )
    p.add_argument("--device", type=int, default=0, help="--snapshot: device index")
    p.set_defaults(run=run)


def _traces(path: str) -> list[str]:
    """The trace file, a rank folder's, or every rank folder's of a job directory."""
    from memscope.events.file_names import TRACE_NAME
    from memscope.io.rank_folders import rank_files
    from memscope.io.report_reader import ReportError

    try:
        return [file for _, file in rank_files(path, TRACE_NAME)]
    except ReportError as exc:
        raise CliError(str(exc)) from None


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
    size_mb = os.path.getsize(args.out) / 2**20
    if size_mb > args.max_file_mb:
        progress(f"warning: {args.out} is {size_mb:.0f} MB, above --max-file-mb "
                 f"{args.max_file_mb:g}; a snapshot is one recorded window and is not split: "
                 "record fewer steps (--memscope-snapshot-steps) or entries "
                 "(--memscope-snapshot-max-entries), or without stacks, for one that opens "
                 "in memory_viz")  # fmt: skip
    print(
        f"{len(events)} allocations and {len(blocks)} live blocks labelled; peak "
        f"{format_bytes(peak.allocated_bytes)} -> {args.out} (opens in pytorch.org/memory_viz)"
    )
    return 0


def _window_path(out: str, window: tuple[int, int]) -> str:
    stem, ext = os.path.splitext(out)
    return f"{stem}.steps{window[0]}-{window[1]}{ext or '.json'}"


def _json_size(data: object) -> int:
    return len(json.dumps(data, separators=(",", ":")))


def _run_trace(args: argparse.Namespace) -> int:
    """Read each trace, keep the step window, write one JSON file per window of whole steps
    that fits ``--max-file-mb``."""
    from memscope.analysis.runtime_sections import attributed_peak
    from memscope.events.trace_reader import TraceError, read_trace
    from memscope.reporters.perfetto import chrome_trace, rank_trace_events, step_windows

    if not os.path.lexists(args.trace):
        raise CliError(f"{args.trace}: no such trace file or directory")
    if not args.max_file_mb > 0:
        raise CliError(f"--max-file-mb {args.max_file_mb}: expected a size in MB above 0")
    window = _window(args.steps)
    paths = _traces(args.trace)
    check_output(args.out, paths)
    ranks: dict[int, dict[int, list[dict[str, Any]]]] = {}  # rank -> step -> events
    peaks: dict[int, dict[str, Any]] = {}  # rank -> its report's attributed peak
    for path in paths:
        by_step: dict[int, list[dict[str, Any]]] = {}

        def windowed(events: Any, by_step: dict[int, list[dict[str, Any]]] = by_step) -> Any:
            for e in events:  # every event builds the peak; the window's are exported
                if window is None or window[0] <= e.step < window[1]:
                    by_step.setdefault(e.step, []).append(e.to_dict())
                yield e

        try:
            header, events = read_trace(path)
            peak = attributed_peak(windowed(events))
        except TraceError as exc:
            raise CliError(str(exc)) from None
        rank = header.fields.get("rank")
        rank = rank if isinstance(rank, int) and rank not in ranks else len(ranks)
        ranks[rank] = by_step
        peaks[rank] = peak
        progress(f"rank {rank}: {sum(map(len, by_step.values()))} events from {path}")
    steps = sorted({step for by_step in ranks.values() for step in by_step})
    sizes = [
        (step, sum(_json_size(rank_trace_events(r, s.get(step, []))) for r, s in ranks.items()))
        for step in steps
    ]
    windows = step_windows(sizes, int(args.max_file_mb * 2**20)) or [(0, -1)]
    outputs = [args.out] if len(windows) == 1 else [_window_path(args.out, w) for w in windows]
    for out in outputs[1:]:
        check_output(out, paths)
    if len(windows) > 1:
        progress(f"{len(steps)} steps exceed --max-file-mb {args.max_file_mb:g}: "
                 f"{len(windows)} files of whole steps")  # fmt: skip
    for out, (first, last) in zip(outputs, windows, strict=True):
        kept = [step for step in steps if first <= step <= last]
        trace = chrome_trace(
            {r: rank_trace_events(r, [e for step in kept for e in s.get(step, [])], peaks[r])
             for r, s in sorted(ranks.items())}
        )  # fmt: skip
        write_json_output(out, trace, paths)
        what = f"steps {first}-{last}" if kept else "no events"
        print(f"{len(trace['traceEvents'])} trace events ({what}) -> {out}")
    return 0
