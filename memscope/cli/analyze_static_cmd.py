"""``memscope analyze-static``: static per-rank memory estimate from a training config."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any

from memscope.cli.common import (
    DEFAULT_OUTDIR,
    CliError,
    check_output,
    naming,
    progress,
    write_json_output,
    write_output,
    wrote,
)
from memscope.cli.hardware_args import add_gpu_arg, add_transformer_engine_arg, with_hardware
from memscope.cli.world_size_args import add_world_size_args, world_size_from_args


def register(sub: Any) -> None:
    """Add the ``analyze-static`` subcommand."""
    p = sub.add_parser(
        "analyze-static",
        help="estimate per-rank memory from a JSON or FlagScale YAML training config",
        description=(
            "Estimate weights, gradients, optimizer state and activations per rank from a "
            "config (original MemScope JSON, or a FlagScale YAML: the experiment YAML given "
            "to run.py, followed to its train config, or that train config), without running."
        ),
    )
    p.add_argument(
        "--config",
        required=True,
        help="config file: .json, or a FlagScale experiment YAML (its defaults: '- train: NAME' "
        "is read from train/NAME.yaml beside it, its experiment.runner gives the world size) "
        "or train YAML",
    )
    p.add_argument("--outdir", default=DEFAULT_OUTDIR, help="where static_report.json/.md go")
    p.add_argument(
        "--rank", type=int, default=None, help="global rank to detail (default: the worst rank)"
    )
    p.add_argument(
        "--all-ranks",
        action="store_true",
        help="also print one line per rank position; the detailed rank's line is marked",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where the tensors live (CPU dropout masks are not bool)",
    )
    add_gpu_arg(p)
    p.add_argument(
        "--cublas-workspace-config",
        default=None,
        metavar="CONFIG",
        help="the run's CUBLAS_WORKSPACE_CONFIG (e.g. :4096:8) (default: torch's default)",
    )
    add_transformer_engine_arg(p)
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="unpadded vocabulary size when the config leaves it to the tokenizer",
    )
    add_world_size_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Estimate every rank position, write the reports, print the detailed rank's peak."""
    from memscope.analysis.static.coverage import config_coverage, warning_lines
    from memscope.analysis.static.estimator import estimate_all_ranks, position_of_rank
    from memscope.analysis.static.report import build_static_report
    from memscope.analysis.static.spec_checks import validate_spec
    from memscope.analysis.static.validation import ConfigWarning, peak_warnings
    from memscope.events.file_names import STATIC_REPORT_MD_NAME, STATIC_REPORT_NAME
    from memscope.inputs.config_files import load_config
    from memscope.reporters.static_markdown import render_static_markdown
    from memscope.units import format_bytes, printable

    json_path = os.path.join(args.outdir, STATIC_REPORT_NAME)
    md_path = os.path.join(args.outdir, STATIC_REPORT_MD_NAME)
    for out in (json_path, md_path):  # before any work: regular files, never the config
        check_output(out, [args.config])
    world, world_source = world_size_from_args(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        try:
            spec, keys = load_config(args.config, args.vocab_size, world)
            spec = validate_spec(with_hardware(spec, args))
            estimates = estimate_all_ranks(spec)
            if args.rank is None:
                selected = max(estimates, key=lambda e: e.peak_memory_bytes)
            else:
                position = position_of_rank(spec, args.rank)
                selected = next(e for e in estimates if e.position == position)
            coverage = config_coverage(keys, spec, world_source)
        except ValueError as exc:
            raise CliError(naming(args.config, exc)) from None
    notes = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    for other in caught:  # anything else keeps its usual treatment
        if not issubclass(other.category, ConfigWarning):
            warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    rank = _first_rank(spec, selected) if args.rank is None else args.rank
    notes += peak_warnings(selected.peak_memory_bytes, rank)
    # one line each, in order, no repeats; the not-modelled keys are in report["coverage"]
    for note in dict.fromkeys(notes + warning_lines(coverage.not_modelled)):
        print(f"memscope analyze-static: warning: {args.config}: {note}", file=sys.stderr)
    _print_coverage(coverage)
    report = build_static_report(spec, estimates, selected, args.config, coverage.to_dict())
    report["warnings"] = list(dict.fromkeys(notes))
    report["rank"] = rank
    report["summary"]["rank"] = rank
    report["data_parallel"] = _data_parallel_note(spec, world_source)
    write_json_output(json_path, report, [args.config])
    write_output(md_path, render_static_markdown(report), [args.config])
    wrote((json_path, md_path), args.outdir, DEFAULT_OUTDIR)
    if args.all_ranks:
        for r in report["ranks"]:
            mark = f"  <- rank {rank}" if rank in r["global_ranks"] else ""
            print(
                printable(
                    f"tp={r['tp_rank']} pp={r['pp_rank']} ranks {_span(r['global_ranks'])}: "
                    f"peak {format_bytes(r['peak_memory_bytes'])} ({r['peak_stage']}){mark}"
                )
            )
    s = report["summary"]
    line = (
        f"peak {format_bytes(s['peak_memory_bytes'])} on rank {rank} "
        f"(tp={s['tp_rank']} pp={s['pp_rank']}, {s['peak_stage']}): {s['param_count']:,} "
        f"parameters, persistent {format_bytes(s['persistent_memory_bytes'])}, activations "
        f"{format_bytes(s['activation_memory_bytes'])}, temporary "
        f"{format_bytes(s['temporary_memory_bytes'])}, fixed workspaces and buffers "
        f"{format_bytes(s['workspace_memory_bytes'])}"
    )
    extra = report["allowance"]
    if extra["total_bytes"]:
        line += (
            f"; on the device {format_bytes(extra['device_total_bytes'])} with the CUDA "
            f"context ({format_bytes(extra['cuda_context_bytes'])}) and NCCL buffers "
            f"({format_bytes(extra['nccl_buffer_bytes'])}), before fragmentation"
        )
    dp = report["data_parallel"]
    if dp["assumed"]:
        line += f"; {dp['note']}"
    print(printable(line))
    return 0


def _print_coverage(coverage: Any, shown: int = 6) -> None:
    """``assumed: ...`` and ``not used: N keys (first few)`` on stderr."""
    progress("assumed: " + "; ".join(coverage.assumptions))
    unused = coverage.unused_keys
    few = ", ".join(unused[:shown]) + (", ..." if len(unused) > shown else "")
    progress(f"not used: {len(unused)} keys" + (f" ({few})" if unused else ""))


def _data_parallel_note(spec: Any, source: str) -> dict[str, Any]:
    """How the data-parallel size was found: given, or assumed when nothing said it."""
    p = spec.parallel
    out: dict[str, Any] = {"dp": p.dp, "world_size": p.world_size, "assumed": p.dp_assumed}
    if p.dp_assumed:
        out["source"] = "assumed"
        out["note"] = (
            f"world size not given: assumed DP={p.dp} (world size {p.world_size}, the least "
            "the grid allows); pass --world-size, --nnodes/--nproc-per-node, --experiment or "
            "--hostfile"
        )
    else:
        out["source"] = source or "config"
    return out


def _first_rank(spec: Any, estimate: Any) -> int:
    """The lowest global rank holding ``estimate``'s position."""
    from memscope.analysis.static.estimator import ranks_by_position

    return ranks_by_position(spec)[estimate.position][0]


def _span(ranks: list[int]) -> str:
    """``0,4,8`` or ``0..3`` style list of global ranks (first few)."""
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    shown = ",".join(str(r) for r in ranks[:6])
    return shown + (",..." if len(ranks) > 6 else "")
