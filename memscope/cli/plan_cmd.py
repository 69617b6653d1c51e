"""``memscope plan``: the Megatron settings that fit a GPU's memory, cheapest first."""

from __future__ import annotations

import argparse
import os
import re
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
from memscope.cli.hardware_args import add_gpu_arg, add_transformer_engine_arg, with_hardware
from memscope.cli.world_size_args import add_world_size_args, world_size_from_args

if TYPE_CHECKING:
    from memscope.inputs.log_spec import LogOptions

_UNITS = {"": None, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, option: str = "--gpu-memory") -> int:
    """``80GiB``, ``80 GB``, ``81920MiB`` -> bytes; a unit is required."""
    m = _SIZE.match(text)
    unit = _UNITS.get(m.group(2).lower(), 0) if m else 0
    if not m or not unit:
        raise CliError(f"{option} {text!r}: give a size with a unit, e.g. 80GiB or 80GB")
    return int(float(m.group(1)) * unit)


def parse_share(text: str) -> float:
    """``10%`` or ``0.1`` -> 0.1; must be in [0, 1)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise CliError(f"--headroom {text!r}: give a share such as 10% or 0.1") from None
    if not 0 <= value < 1:
        raise CliError(f"--headroom {text!r} must be at least 0% and below 100%")
    return value


def register(sub: Any) -> None:
    """Add the ``plan`` subcommand."""
    p = sub.add_parser(
        "plan",
        help="search Megatron parallel / batch / recompute settings that fit a memory budget",
        description=(
            "Search tensor, pipeline and virtual-pipeline parallel sizes, sequence parallelism, "
            "micro-batch size (same global batch), recompute and the distributed optimizer for "
            "a training config; keep the layouts whose every pipeline stage's estimated peak "
            "fits the budget, and rank them by a stated step-time model (docs/planner.md): "
            "bubble, recompute, TP/CP/EP/DP communication, activation offload and the CPU "
            "Adam step of optimizer offload, every term printed, your config as the baseline."
        ),
    )
    p.add_argument(
        "--config",
        required=True,
        help="config file (.json, or a FlagScale experiment or train .yaml, as analyze-static)",
    )
    p.add_argument("--gpu-memory", required=True, help="memory per GPU, e.g. 80GiB")
    p.add_argument("--headroom", default="10%", help="share of it kept free (default 10%%)")
    p.add_argument("--top", type=int, default=5, help="plans shown (default 5)")
    p.add_argument("--outdir", default=DEFAULT_OUTDIR, help="where plan.json and plan.md go")
    p.add_argument(
        "--calibrate",
        default=None,
        metavar="REPORT",
        help="a runtime_report.json (or its rank folder), job_summary.json or job directory "
        "of a real run of this model, or its Megatron training log: its measured / predicted "
        "bytes per term correct every plan",
    )
    p.add_argument(
        "--bf16-optimizer-state",
        action="store_true",
        help="also search the precision-aware optimizer with bf16 Adam moments and main "
        "gradients (less memory, different numerics); by default only its lossless fp32 state",
    )
    p.add_argument(
        "--host-memory",
        default=None,
        help="host memory per node that optimizer / activation offload may use, e.g. 1TiB; "
        "plans whose offload needs more are refused (default: no limit, the need is printed)",
    )
    p.add_argument(
        "--host-adam-rate",
        type=float,
        default=None,
        metavar="PARAMS_PER_S",
        help="one host core's fused CPU AdamW rate (what tools/bench_cpu_adam.py prints on "
        "the training host); default: the figure measured for MemScope "
        "(benchmarks/cpu_adam.txt)",
    )
    p.add_argument(
        "--host-cores-per-gpu",
        type=int,
        default=None,
        help="host cores each GPU's CPU optimizer may use (default 14: a DGX H100)",
    )
    p.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="price tensor-parallel communication as Transformer Engine's userbuffers overlap "
        "it with the GEMMs (and add --tp-comm-overlap to the plans with TP > 1); its buffers "
        "are not in the memory estimate",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where training runs: cpu plans a CPU (gloo) run, whose --gpu-memory is each "
        "rank's share of host memory; no CUDA-only savers (precision-aware optimizer, offload)",
    )
    add_gpu_arg(p)
    add_transformer_engine_arg(p)
    p.add_argument("--vocab-size", type=int, default=None, help="unpadded vocabulary size")
    add_world_size_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Plan, write plan.json and plan.md, print the user's layout and the best plans."""
    from memscope.analysis.static.planner import MAX_WORLD_SIZE, plan
    from memscope.analysis.static.spec_checks import validate_spec
    from memscope.inputs.config_files import load_config
    from memscope.reporters.plan_report import (
        flagscale_yaml,
        plan_document,
        plan_lines,
        render_plan_markdown,
    )
    from memscope.units import printable

    gpu_memory, headroom = parse_size(args.gpu_memory), parse_share(args.headroom)
    host = parse_size(args.host_memory, "--host-memory") if args.host_memory else None
    if args.top < 1:
        raise CliError(f"--top must be >= 1, got {args.top}")
    json_path = os.path.join(args.outdir, "plan.json")
    md_path = os.path.join(args.outdir, "plan.md")
    for out in (json_path, md_path):
        check_output(out, [args.config])
    world, _ = world_size_from_args(args)
    if world is not None and world > MAX_WORLD_SIZE:
        raise CliError(f"world size {world} is beyond the {MAX_WORLD_SIZE:,} ranks plan searches")
    calibrated = None
    if args.calibrate:
        from memscope.cli.analyze_log_cmd import log_options

        # a log is read on the plan's machine, at its own world size (the plans' differ)
        calibrated = _calibration(args.calibrate, log_options(args, with_world_size=False))
    cost_model = _cost_model(args)
    try:
        # the config's own layout (its world size may differ from the one planned for: the
        # global batch, micro-batch x microbatches x DP, is what carries over)
        spec, _keys = load_config(args.config, args.vocab_size, None)
        spec = validate_spec(with_hardware(spec, args))
        budget = int(gpu_memory * (1 - headroom))
        result = plan(
            spec,
            world or spec.parallel.world_size,
            budget,
            top=args.top,
            calibrated=calibrated,
            bf16_state=args.bf16_optimizer_state,
            host_memory_bytes=host,
            cost_model=cost_model,
        )
    except ValueError as exc:
        raise CliError(naming(args.config, exc)) from None
    doc = plan_document(result, args.config, gpu_memory, headroom)
    write_json_output(json_path, doc, [args.config])
    write_output(md_path, render_plan_markdown(doc), [args.config])
    wrote((json_path, md_path), args.outdir, DEFAULT_OUTDIR)
    for line in plan_lines(doc):
        print(printable(line))
    if not doc["plans"]:
        print(f"no layout of {doc['world_size']} ranks fits; see plan.md for your config's terms")
        return 1
    print("FlagScale YAML for plan 1:")
    for line in flagscale_yaml(doc["plans"][0]["flagscale_yaml"]).splitlines():
        print(printable(line))
    return 0


def _cost_model(args: argparse.Namespace) -> Any:
    """The planner's cost model with the command's settings (bad values: one line)."""
    from memscope.analysis.static.planner import CostModel

    settings: dict[str, Any] = {"tp_comm_overlap": args.tp_comm_overlap}
    if args.host_adam_rate is not None:
        if not args.host_adam_rate > 0:
            raise CliError(f"--host-adam-rate must be > 0, got {args.host_adam_rate}")
        settings["host_adam_params_per_s_per_core"] = args.host_adam_rate
    if args.host_cores_per_gpu is not None:
        if args.host_cores_per_gpu < 1:
            raise CliError(f"--host-cores-per-gpu must be >= 1, got {args.host_cores_per_gpu}")
        settings["host_cores_per_gpu"] = args.host_cores_per_gpu
    return CostModel(**settings)


def _calibration(path: str, log: LogOptions | None = None) -> dict[str, Any]:
    """Per-term factors from the static comparisons of a rank report, a job summary, every
    rank report of a job directory or a training log (read with ``log``); a path with none
    is a :class:`CliError`."""
    from memscope.analysis.job import RankEntry, job_mixups
    from memscope.analysis.static.planner import calibration
    from memscope.cli.pages import job_summary_entries
    from memscope.events.file_names import REPORT_NAME
    from memscope.io.rank_folders import folder_file, rank_folders
    from memscope.io.report_reader import ReportError, load_report

    comparisons = []
    path = folder_file(path)  # a rank folder is its report
    if os.path.isfile(path) and not path.endswith(".json"):  # a training log (analyze-log)
        from memscope.cli.analyze_log_cmd import log_comparisons

        comparisons = log_comparisons(path, log)
    try:
        if comparisons:
            return calibration(comparisons)
        entries: list[RankEntry] = []
        if os.path.isdir(path):
            for rank, folder in rank_folders(path):
                report_path = os.path.join(folder, REPORT_NAME)
                if os.path.isfile(report_path):
                    report = load_report(report_path, "runtime")
                    entries.append(RankEntry(rank, report, where=os.path.basename(folder)))
                    comparisons.append(report.get("comparisons") or {})
        else:
            doc = load_report(path)
            ranks = doc.get("ranks") if doc.get("report_type") == "job_summary" else [doc]
            comparisons = [r.get("comparisons") or {} for r in ranks or [] if isinstance(r, dict)]
            if doc.get("report_type") == "job_summary":
                entries = [e for e in job_summary_entries(doc, path) if e.report is not None]
        mixed = job_mixups(entries)  # the job view's check: one launch's ranks only
        if mixed:
            raise CliError(
                f"--calibrate {path}: {'; '.join(mixed.values())}; calibrate from one run's "
                "folder (memscope summarize shows which ranks belong to which run)"
            )
        return calibration(comparisons)
    except (ReportError, ValueError) as exc:
        raise CliError(f"--calibrate {naming(path, exc)}") from None
