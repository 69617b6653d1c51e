"""``memscope demo``: train a tiny real megatron-core GPT on CPU in 2 processes, traced."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from memscope.cli.common import CliError, progress


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = sub.add_parser(
        "demo",
        help="train a tiny megatron-core GPT on CPU (2 processes) with tracing on",
        description=(
            "Train a tiny real megatron-core GPTModel on CPU in 2 processes (gloo) with "
            "tensor or pipeline parallel size 2, MemScope on, and leave per-rank reports."
        ),
    )
    p.add_argument("--outdir", default="memscope_demo", help="report directory")
    p.add_argument(
        "--parallel",
        choices=("tp", "pp"),
        default="pp",
        help="tp: tensor parallel 2; pp: pipeline parallel 2, 1F1B",
    )
    p.add_argument("--steps", type=int, default=4, help="training steps")
    p.add_argument("--microbatches", type=int, default=4, help="microbatches per step")
    p.set_defaults(run=run)


def _history_argv(steps: int) -> list[str]:
    """Record both ranks' allocation history over two steps after the first (the first only
    when there is no other), so the rank pages show memory through the peak step."""
    start = 1 if steps > 2 else 0
    return ["--memscope-enable-memory-snapshot", "--memscope-snapshot-ranks", "0", "1",
            "--memscope-snapshot-start-step", str(start), "--memscope-snapshot-steps",
            str(min(2, steps - start))]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Train, then write each rank's page and the job page; one line per rank."""
    if args.steps < 1 or args.microbatches < 1:
        raise CliError("--steps and --microbatches must be at least 1")
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        raise CliError("the demo needs megatron-core: pip install 'memscope[megatron]'") from None
    from memscope.analysis.job import RankEntry
    from memscope.cli import pages
    from memscope.demo.launcher import WorkerError, free_port, spawn
    from memscope.demo.tiny_gpt import TinyGPTConfig
    from memscope.demo.traced_training import traced_worker
    from memscope.events.schema import module_label
    from memscope.units import format_bytes, format_ratio, printable

    outdir = os.path.abspath(args.outdir)
    cfg = TinyGPTConfig(
        tp=2 if args.parallel == "tp" else 1,
        pp=2 if args.parallel == "pp" else 1,
        num_layers=4,
        hidden_size=128,
        num_attention_heads=8,
        vocab_size=1024,
        seq_length=128,
        num_microbatches=args.microbatches,
    )
    progress(
        f"training a tiny GPT ({cfg.num_layers} layers, hidden {cfg.hidden_size}) with "
        f"TP={cfg.tp} PP={cfg.pp} on 2 CPU processes for {args.steps} "
        f"step{'s' if args.steps != 1 else ''}"
    )
    argv = ["--memscope", "--memscope-outdir", outdir, *_history_argv(args.steps)]
    t0 = time.perf_counter()
    try:
        results = spawn(2, traced_worker, free_port(), cfg, args.steps, argv)
    except WorkerError as exc:
        raise CliError(f"demo training failed: {exc}") from None
    progress(f"trained in {time.perf_counter() - t0:.1f} s")
    entries = []
    for r in results:
        if r.report_path is None:
            raise CliError(f"rank {r.rank} wrote no report")
        html_path, report = pages.write_rank_page(
            r.report_path, job_page=pages.job_page_path(outdir)
        )
        page = os.path.relpath(html_path, outdir).replace(os.sep, "/")
        entries.append(RankEntry(r.rank, report, page=page))  # linked from the job page
        peak, comp = report["peak"], report["comparisons"]
        static = (
            f"static estimate {format_bytes(comp['static_peak_memory_bytes'])} "
            f"({format_ratio(comp['peak_diff_ratio'])})"
            if comp.get("status") == "ok"
            else "no static estimate"
        )
        print(
            printable(
                f"rank {r.rank}: peak {format_bytes(peak['memory_bytes'])} at step {peak['step']} "
                f"({peak['phase']}, {module_label(peak['module'])}); {static} -> {html_path}"
            )
        )
    job_html = pages.write_job_page(entries, pages.job_page_path(outdir), pages.job_inputs(outdir))
    print(printable(f"job page: {job_html}"))
    print(printable(f"reports: {outdir}"))
    return 0
