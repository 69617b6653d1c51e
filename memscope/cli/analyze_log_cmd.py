"""``memscope analyze-log``: a past Megatron-LM / FlagScale run's memory, explained from its log."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from memscope.cli.common import (
    DEFAULT_OUTDIR,
    CliError,
    check_output,
    naming,
    write_json_output,
    write_output,
    wrote,
)
from memscope.cli.hardware_args import add_gpu_arg, add_transformer_engine_arg

if TYPE_CHECKING:
    from memscope.inputs.log_spec import LogOptions


def register(sub: Any) -> None:
    """Add the ``analyze-log`` subcommand."""
    p = sub.add_parser(
        "analyze-log",
        help="explain each rank's printed memory (and any out-of-memory) from a training log",
        description=(
            "Read Megatron-LM / FlagScale training logs (one per node, a FlagScale logs/ "
            "folder, gzip), take the configuration from the arguments block or the launch "
            "command line, and compare every '[Rank N] (after K iterations) memory (MB)' line "
            "with the static estimate for that rank at that moment; explain out-of-memory "
            "messages with remedies. Writes log_report.json, log_report.md, log_report.html."
        ),
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="log file(s) or a FlagScale logs/ folder")
    p.add_argument("--outdir", default=DEFAULT_OUTDIR, help="where log_report.* go")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="unpadded vocabulary size when the log has neither vocab_size nor Megatron's "
        "'padded vocab' line (a tokenizer-defined vocabulary)",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="number of ranks, when the log does not say it (it must agree when it does)",
    )
    add_gpu_arg(p)
    add_transformer_engine_arg(p)
    p.set_defaults(run=run)


def analyze_logs(paths: list[str], options: LogOptions | None = None) -> dict[str, Any]:
    """The ``log_report.json`` document of ``paths`` (``options``: what the command line adds
    to the logs); bad input is a :class:`CliError`."""
    from memscope.events.bounded_input import InputRefused
    from memscope.inputs.log_document import log_document
    from memscope.inputs.log_spec import NO_OPTIONS
    from memscope.inputs.training_log import read_runs
    from memscope.reporters.log_report import log_report_document

    try:
        runs = read_runs(paths)
    except InputRefused as exc:
        raise CliError(naming(paths[0], exc) if len(paths) == 1 else str(exc)) from None
    if not runs:
        raise CliError(
            f"{', '.join(paths)}: no Megatron training run found (no arguments block, launch "
            "command line, memory, iteration or out-of-memory line)"
        )
    doc = log_report_document(log_document(paths, runs, options or NO_OPTIONS))
    if not any(r["ranks"] or r["ooms"] for r in doc["runs"]):
        reason = next(r["error"] for r in doc["runs"] if r["error"])
        raise CliError(f"{', '.join(paths)}: {reason}")
    # a run whose configuration the estimator refuses still reports what it measured
    return doc


def log_comparisons(path: str, options: LogOptions | None = None) -> list[dict[str, Any]]:
    """``plan --calibrate LOG``: the log's steady-state lines as per-term comparisons."""
    from memscope.inputs.log_document import calibration_comparisons

    comparisons = calibration_comparisons(analyze_logs([path], options))
    if not comparisons:
        raise CliError(
            f"--calibrate {path}: no memory line printed after two real optimizer steps "
            "(before that the optimizer state does not exist yet)"
        )
    return comparisons


def log_options(args: argparse.Namespace, with_world_size: bool = True) -> LogOptions:
    """The command's :class:`~memscope.inputs.log_spec.LogOptions` (``with_world_size``
    False: the log's own world size, whatever ``args`` say); a bad value is a
    :class:`CliError`."""
    from memscope.inputs.log_spec import LogOptions

    try:
        return LogOptions(
            vocab_size=args.vocab_size,
            world_size=args.world_size if with_world_size else None,
            gpu=args.gpu,
            transformer_engine_version=args.transformer_engine_version,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Explain the logs, write the three files, print one line per stage and OOM."""
    from memscope.events.file_names import LOG_REPORT_NAMES
    from memscope.reporters.html import render_log_html
    from memscope.reporters.log_report import render_log_markdown, summary_lines
    from memscope.units import printable

    outs = [os.path.join(args.outdir, name) for name in LOG_REPORT_NAMES]
    for out in outs:
        check_output(out, args.logs)
    doc = analyze_logs(args.logs, log_options(args))
    write_json_output(outs[0], doc, args.logs)
    write_output(outs[1], render_log_markdown(doc), args.logs)
    write_output(outs[2], render_log_html(doc), args.logs)
    wrote(outs, args.outdir, DEFAULT_OUTDIR)
    for line in summary_lines(doc):
        print(printable(line))
    return 0
