"""``memscope analyze-snapshot``: what was live at the true peak of a CUDA allocator snapshot."""

from __future__ import annotations

import argparse
import os
from typing import Any

from memscope.cli.common import CliError, check_output, progress, write_json_output

DEFAULT_SUFFIX = ".peak.json"


def register(sub: Any) -> None:
    """Add the ``analyze-snapshot`` subcommand."""
    p = sub.add_parser(
        "analyze-snapshot",
        help="what was live at the true peak of a CUDA allocator snapshot, by owner and module",
        description=(
            "Replay a CUDA caching-allocator snapshot with history (torch.cuda.memory."
            "_dump_snapshot, or MemScope's --memscope-enable-memory-snapshot) to its allocated "
            "peak and split what was live there by owner (parameters, main params, gradients, "
            "optimizer state, buffers) and by the module, phase, microbatch and chunk that "
            "allocated it. MemScope's side files beside the snapshot (*.owners.json, "
            "*.markers.jsonl) are used when present. Needs no torch; the pickle is read as "
            "plain data only."
        ),
    )
    p.add_argument("--snapshot", required=True, help="the snapshot pickle")
    p.add_argument(
        "--owners", default=None, help="ownership ranges (default: <snapshot>.owners.json)"
    )
    p.add_argument(
        "--markers", default=None, help="context markers (default: <snapshot>.markers.jsonl)"
    )
    p.add_argument("--device", type=int, default=0, help="device index in the snapshot")
    p.add_argument("--top", type=int, default=15, help="items printed")
    p.add_argument(
        "--out", default=None, help=f"JSON to write (default: <snapshot>{DEFAULT_SUFFIX})"
    )
    p.set_defaults(run=run)


def _side_file(given: str | None, default: str, what: str) -> str | None:
    if given is not None:
        if not os.path.exists(given):
            raise CliError(f"{given}: no such {what} file")
        return given
    return default if os.path.exists(default) else None


def run(args: argparse.Namespace) -> int:
    """Replay, attribute, print the largest items and write the JSON."""
    from memscope.analysis.allocator_timeline import attribute_peak, replay
    from memscope.analysis.peak import SOURCE_HISTORY, composition_section
    from memscope.io.snapshot_reader import read_snapshot_bundle, side_files
    from memscope.units import format_bytes, printable

    path = args.snapshot
    if not os.path.lexists(path):
        raise CliError(f"{path}: no such snapshot file")
    if args.device < 0 or args.top < 1:
        raise CliError("--device must be >= 0 and --top >= 1")
    default_owners, default_markers = side_files(path)
    owners_path = _side_file(args.owners, default_owners, "ownership")
    markers_path = _side_file(args.markers, default_markers, "markers")
    out = args.out or os.path.splitext(path)[0] + DEFAULT_SUFFIX
    check_output(out, [p for p in (path, owners_path, markers_path) if p])
    try:
        bundle = read_snapshot_bundle(path, owners_path, markers_path)
        peak = replay(bundle.snapshot, args.device)
        items = attribute_peak(peak, bundle.owners, bundle.markers)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise CliError(f"{path}: malformed snapshot ({type(exc).__name__}: {exc})") from None
    result = {
        "snapshot": os.path.basename(path),
        "device": args.device,
        "peak_allocated_bytes": peak.allocated_bytes,
        "peak_time_us": peak.time_us,
        "peak_event_index": peak.index,
        "window_start_bytes": peak.start_bytes,
        "events": peak.events,
        "coverage": round(peak.coverage, 6),
        "inconsistencies": peak.inconsistencies,
        "owners_file": os.path.basename(owners_path) if owners_path else None,
        "markers_file": os.path.basename(markers_path) if markers_path else None,
        "composition": composition_section(items, peak.allocated_bytes, SOURCE_HISTORY),
    }
    write_json_output(out, result, [path])
    progress(
        f"{peak.events} events; {peak.coverage:.1%} of the peak's bytes allocated inside the "
        f"recorded window"
        + (f"; {peak.inconsistencies} unpaired events" if peak.inconsistencies else "")
    )
    print(printable(f"peak allocated {format_bytes(peak.allocated_bytes)} -> {out}"))
    for item in items[: args.top]:
        where = " · ".join(
            str(x)
            for x in (
                item.module or "—",
                item.phase or None,
                None if item.microbatch is None else f"microbatch {item.microbatch}",
                None if item.virtual_chunk is None else f"chunk {item.virtual_chunk}",
            )
            if x
        )
        print(printable(f"  {format_bytes(item.nbytes):>12}  {item.category:<16} {where}"))
    return 0
