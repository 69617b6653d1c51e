"""``memscope analyze``: rebuild a runtime report's sections from a rank's trace.jsonl alone."""

from __future__ import annotations

import argparse
import os
from typing import Any

from memscope.cli.common import CliError, check_output, progress, write_json_output

DEFAULT_NAME = "replayed_report.json"


def register(sub: Any) -> None:
    """Add the ``analyze`` subcommand."""
    p = sub.add_parser(
        "analyze",
        help="rebuild a runtime report's analysis sections from a rank's trace.jsonl",
        description=(
            "Replay a rank's trace.jsonl through MemScope's analyzers and write a runtime "
            "report (peak, phases, hot spots, modules, steps, static comparison) rebuilt from "
            "the trace alone. Needs no torch."
        ),
    )
    p.add_argument("--trace", required=True, help="a rank's trace.jsonl (or its rankNNNNN/ folder)")
    p.add_argument(
        "--out", default=None, help=f"report to write (default: {DEFAULT_NAME} beside the trace)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Replay the trace, write the rebuilt report, print where it went and its peak."""
    from memscope.analysis.static_comparison import StaticEstimate
    from memscope.events.file_names import REPORT_NAME, TRACE_NAME
    from memscope.events.schema import module_label
    from memscope.events.trace_reader import TraceError, read_trace
    from memscope.report.builder import ReportSettings, RunFacts, RuntimeReportBuilder
    from memscope.units import format_bytes, printable

    path = args.trace
    if os.path.isdir(path):  # a rank folder is its trace
        path = os.path.join(path, TRACE_NAME)
    if not os.path.lexists(path):
        raise CliError(f"{path}: no such trace file")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(path)), DEFAULT_NAME)
    check_output(out, [path])  # before the replay: never the trace itself, never a device
    try:
        header, events = read_trace(path)
        fields = header.fields
        config = fields.get("config") or {}
        if not isinstance(config, dict):
            raise TypeError(f"config is {type(config).__name__}, not an object")
        builder = RuntimeReportBuilder(
            ReportSettings.from_header(config),
            StaticEstimate.from_dict(fields.get("static_estimate")),
        )
        recorded = 0
        for event in events:
            recorded += 1
            builder.consume(event)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise CliError(f"{path}: malformed trace header ({exc})") from None
    parallel = fields.get("parallel") or {}
    if not isinstance(parallel, dict):
        raise CliError(f"{path}: malformed trace header (parallel is not an object)")
    metadata = {**parallel, "rank": fields.get("rank"),
                "world_size": fields.get("world_size"), "backend": fields.get("backend"),
                "tool_version": fields.get("tool_version"), "config": config,
                "replayed_from": os.path.basename(path)}  # fmt: skip
    for key in ("run_id", "run_id_source", "start_time", "hostname"):
        metadata[key] = fields.get(key)
    training = fields.get("training")
    report = builder.build(
        RunFacts(
            metadata=metadata,
            status="incomplete",
            status_reason=(
                "rebuilt from the trace by `memscope analyze`; the run's own status is in its "
                f"{REPORT_NAME}"
            ),
            training=training if isinstance(training, dict) else None,
            events_recorded=recorded,
            jsonl=os.path.basename(path),
        )
    )
    try:
        write_json_output(out, report, [path])
    except ValueError as exc:  # a number JSON can't hold (the trace's bounds make it unlikely)
        raise CliError(f"{path}: cannot write the replayed report ({exc})") from None
    peak = report["peak"]
    progress(f"replayed {recorded} events from {path}")
    print(
        printable(
            f"peak {format_bytes(peak.get('memory_bytes'))} at step {peak.get('step')} "
            f"({peak.get('phase')}, {module_label(peak.get('module'))}) -> {out}"
        )
    )
    return 0
