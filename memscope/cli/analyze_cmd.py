"""``memscope analyze``: rebuild a runtime report's sections from a rank's trace.jsonl alone."""

from __future__ import annotations

import argparse
import os
from typing import Any

from memscope.cli.common import CliError, check_output, progress, write_json_output

DEFAULT_NAME = "replayed_report.json"
#: Bounds on the settings a trace header may carry (the replay's memory follows them).
_HEADER_COUNTS = {"detail_steps": (0, 10**6), "max_trace_events": (1, 10**8), "top_k": (1, 10**6)}


def _header_count(config: dict[str, Any], key: str, default: int) -> int:
    """A count from the trace header's settings, within :data:`_HEADER_COUNTS`."""
    value = config.get(key, default)
    lo, hi = _HEADER_COUNTS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"config.{key} must be an integer in [{lo}, {hi}], not {value!r:.40}")
    return value


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
    from memscope.analysis.base import replay
    from memscope.analysis.runtime_sections import runtime_analyzers
    from memscope.analysis.static_comparison import StaticEstimate
    from memscope.analysis.steps import StepAnalyzer
    from memscope.events.trace_reader import TraceError, read_trace
    from memscope.events.trace_store import BoundedTraceStore
    from memscope.io.rank_folders import TRACE_NAME
    from memscope.reporters.runtime_json import RuntimeReportInputs, build_runtime_report
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
        store = BoundedTraceStore(
            _header_count(config, "detail_steps", 2),
            _header_count(config, "max_trace_events", 200_000),
        )
        analyzers = runtime_analyzers(
            _header_count(config, "top_k", 20),
            StaticEstimate.from_dict(fields.get("static_estimate")),
        )
        steps = next(a for a in analyzers if isinstance(a, StepAnalyzer))
        recorded = 0

        def counted() -> Any:
            nonlocal recorded
            for event in events:
                recorded += 1
                store.consume(event)
                yield event

        sections = replay(counted(), analyzers)
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
    report = build_runtime_report(
        RuntimeReportInputs(
            metadata=metadata,
            status="incomplete",
            status_reason=(
                "rebuilt from the trace by `memscope analyze`; the run's own status is in its "
                "runtime_report.json"
            ),
            sections=sections,
            events=store.events,
            training=training if isinstance(training, dict) else None,
            trace_info={
                "events_recorded": recorded,
                "events_in_report": len(store.events),
                "events_not_in_report": store.dropped,
                "step_summaries_thinned": steps.thinned,
                "jsonl": os.path.basename(path),
            },
        )
    )
    try:
        write_json_output(out, report, [path])
    except ValueError as exc:  # a number JSON can't hold (the trace's bounds make it unlikely)
        raise CliError(f"{path}: cannot write the replayed report ({exc})") from None
    peak = sections["peak"]
    progress(f"replayed {recorded} events from {path}")
    print(
        printable(
            f"peak {format_bytes(peak.get('memory_bytes'))} at step {peak.get('step')} "
            f"({peak.get('phase')}, {peak.get('module') or 'step boundary'}) -> {out}"
        )
    )
    return 0
