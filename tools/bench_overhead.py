"""Measure MemScope's step-time overhead on the tiny real megatron-core GPT.

The same short training runs with MemScope off and on, alternating (off, on, off, on, ...) so
that slow drift of the machine affects both sides alike.  Every "on" configuration is paired with
the "off" run done just before it; its ratio is the median over repeats of
``median step time (on) / median step time (off)`` of each pair.

The "on" configurations, chosen with ``--modes`` (default: all of them):

* ``hooks``: the hook families switched on one after the other with ``--backend`` (step
  callbacks only, + module hooks, + output-grad hooks, + param-grad hooks = the defaults),
  then all hooks timed after their recording window (``--memscope-hook-steps`` set to the
  warm-up steps): what every step after the first 20 costs by default.
  The last of these rows is always run: it is the figure of the last line.
* ``always-on``: the GPU's default mode, backend ``cuda`` (allocator counters and context
  markers, no per-op dispatch, no stacks); skipped on a machine without CUDA.
* ``storage``: the composition mode, backend ``storage`` (exact per-storage ledger).
* ``deep``: backend ``storage`` recording the allocation history on every rank over the timed
  steps (``--memscope-enable-memory-snapshot``; the history is dumped in the last timed step).
* ``deep-stacks``: ``deep`` with each storage's Python creation stack recorded
  (``--memscope-snapshot-stacks python``), which names leak suspects' code.

Each mode keeps every other setting at its default.  A mode whose backend is not available
on this machine is skipped with a note (an error when named in ``--modes``).

The model size is set with ``--hidden``, ``--layers``, ``--seq-length`` and ``--heads``.  At
the tiny default every op takes microseconds, so fixed per-op costs weigh far more than on a
real model; measure a larger size too to see what a user would pay.

All runs execute inside one set of worker processes (one per rank): starting fresh processes
costs ~20 s of imports each, far more than the runs themselves.  Each run still builds its own
process group, model, optimizer and MemScope runtime (``traced_worker`` of ``memscope demo``,
through the test suite's ``instrumented_worker`` in ``tests/harness/``, which only measures
before and after the timed steps).

Usage::

    python tools/bench_overhead.py                 # PP=2, 2 processes, ~1-2 minutes on 2 cores
    python tools/bench_overhead.py --quick         # smoke run
    python tools/bench_overhead.py --hidden 256 --seq-length 128   # ops that are not tiny
    python tools/bench_overhead.py --modes storage deep --json out.json
    python tools/bench_overhead.py --parallel none --backend storage --modes hooks

The last line printed is ``overhead: R`` with R the ratio at default settings (all hooks on)
with ``--backend``.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import torch

# The test suite's instrumented worker (tests/harness/); spawned workers inherit sys.path.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

from harness import instrumented_worker

from memscope.capture.backends import available_backend_names, backend_choices
from memscope.demo.launcher import WorkerError, free_ports, spawn
from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.events.file_names import TRACE_NAME

OFF = "off"
_HOOK_FLAGS = (
    "--memscope-hook-modules",
    "--memscope-hook-output-grads",
    "--memscope-hook-param-grads",
)

# (name, hook switches on) - cumulative; the last one passes no switches at all (true defaults).
HOOK_ROWS: list[tuple[str, tuple[bool, bool, bool] | None]] = [
    ("step callbacks only", (False, False, False)),
    ("+ module hooks", (True, False, False)),
    ("+ output-grad hooks", (True, True, False)),
    ("+ param-grad hooks (all, default)", None),
]
DEFAULT_CONFIG = HOOK_ROWS[-1][0]
#: With the ``hooks`` rows: all hooks at their defaults, timed after the hook window closed
#: (``--memscope-hook-steps`` = the warm-up steps), what a long run pays on every later step.
AFTER_WINDOW = "all hooks, after the hook window"

HOOKS = "hooks"
# mode -> (row name, backend); the "hooks" rows use --backend.
MODES: dict[str, tuple[str, str]] = {
    "always-on": ("cuda (always-on)", "cuda"),
    "storage": ("storage (composition)", "storage"),
    "deep": ("storage + allocation history (deep)", "storage"),
    "deep-stacks": ("deep + Python creation stacks", "storage"),
}
MODE_CHOICES = (HOOKS, *MODES)


@dataclass(frozen=True)
class Config:
    """One "on" configuration: its table row, the mode it belongs to, its MemScope flags."""

    name: str
    mode: str
    backend: str  # --memscope-backend
    argv: tuple[str, ...]  # flags besides --memscope, the backend and the outdir


@dataclass
class RunSpec:
    """One training run of the plan: which configuration, which repeat, which MemScope argv."""

    index: int
    config: str
    repeat: int
    argv: list[str] | None  # None: untraced
    mode: str = OFF


@dataclass
class RunResult:
    """What one run measured, merged over ranks."""

    spec: RunSpec
    step_times: list[float]  # per step, slowest rank (seconds)
    median_s: float  # median over timed steps
    events_per_step: dict[int, int] = field(default_factory=dict)  # summed over ranks
    backend: str | None = None
    snapshots: int = 0  # allocator snapshot files written, summed over ranks


def hook_argv(switches: tuple[bool, bool, bool] | None) -> list[str]:
    """MemScope argv for the given hook switches (None: default settings, no switches)."""
    if switches is None:
        return []
    argv: list[str] = []
    for flag, on in zip(_HOOK_FLAGS, switches, strict=True):
        argv += [flag, "true" if on else "false"]
    return argv


def history_argv(first_step: int, steps: int, world_size: int) -> list[str]:
    """MemScope argv recording the allocation history on every rank over ``steps`` steps."""
    return [
        "--memscope-enable-memory-snapshot",
        "true",
        "--memscope-snapshot-start-step",
        str(first_step),
        "--memscope-snapshot-steps",
        str(steps),
        "--memscope-snapshot-ranks",
        *(str(rank) for rank in range(world_size)),
    ]


def build_configs(
    modes: list[str], backend: str, warmup: int, steps: int, world_size: int
) -> list[Config]:
    """The "on" configurations of ``modes``, in table order (the default row always first
    among them or alone: it is the figure of the last line)."""
    hook_rows = HOOK_ROWS if HOOKS in modes else HOOK_ROWS[-1:]
    configs = [
        Config(name, HOOKS, backend, tuple(hook_argv(switches))) for name, switches in hook_rows
    ]
    if HOOKS in modes and warmup > 0:
        configs.append(Config(AFTER_WINDOW, HOOKS, backend, ("--memscope-hook-steps", str(warmup))))
    for mode, (name, mode_backend) in MODES.items():
        if mode in modes:
            extra = history_argv(warmup, steps, world_size) if mode.startswith("deep") else []
            if mode == "deep-stacks":
                extra += ["--memscope-snapshot-stacks", "python"]
            configs.append(Config(name, mode, mode_backend, tuple(extra)))
    return configs


def build_plan(repeats: int, configs: list[Config], outdir: str) -> list[RunSpec]:
    """Alternating plan: for each repeat, for each configuration, an off run then an on run."""
    plan: list[RunSpec] = []
    for repeat in range(repeats):
        for config in configs:
            plan.append(RunSpec(len(plan), OFF, repeat, None))
            index = len(plan)
            argv = ["--memscope", *config.argv, "--memscope-backend", config.backend]
            argv += ["--memscope-outdir", os.path.join(outdir, f"run{index:03d}")]
            plan.append(RunSpec(index, config.name, repeat, argv, config.mode))
    return plan


def model_config(args: argparse.Namespace) -> tuple[TinyGPTConfig, int]:
    """The GPT config (size from the options) and world size for ``--parallel``."""
    size: dict[str, Any] = {
        "num_layers": args.layers,
        "hidden_size": args.hidden,
        "num_attention_heads": args.heads,
        "seq_length": args.seq_length,
    }
    if args.parallel == "tp":
        return TinyGPTConfig(tp=2, **size), 2
    if args.parallel == "pp":
        return TinyGPTConfig(pp=2, **size), 2
    return TinyGPTConfig(**size), 1


def model_size(cfg: TinyGPTConfig) -> dict[str, int]:
    """The size options of ``cfg``, as the JSON output names them."""
    return {
        "hidden": cfg.hidden_size,
        "layers": cfg.num_layers,
        "heads": cfg.num_attention_heads,
        "seq_length": cfg.seq_length,
    }


def _events_per_step(report_path: str | None) -> tuple[dict[int, int], str | None]:
    """Events per step from this rank's ``trace.jsonl`` (or the report) and the backend used."""
    if report_path is None:
        return {}, None
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    backend = report.get("metadata", {}).get("backend")
    counts: dict[int, int] = {}
    trace = os.path.join(os.path.dirname(report_path), TRACE_NAME)
    if os.path.exists(trace):
        with open(trace, encoding="utf-8") as f:
            for line in f:
                step = json.loads(line).get("step")
                if isinstance(step, int):
                    counts[step] = counts.get(step, 0) + 1
    else:
        steps = int(report.get("metadata", {}).get("steps_completed") or 0)
        total = int(report.get("trace", {}).get("events_recorded") or 0)
        counts = {s: total // steps for s in range(steps)} if steps else {}
    return counts, backend


def _snapshot_count(report_path: str | None) -> int:
    """Allocator snapshot files beside this rank's report."""
    if report_path is None:
        return 0
    return len(glob.glob(os.path.join(os.path.dirname(report_path), "memory_snapshot*.pickle")))


def bench_worker(
    rank: int,
    world_size: int,
    ports: list[int],
    cfg: TinyGPTConfig,
    steps: int,
    plan: list[RunSpec],
    warmup: int,
    verbose: bool,
) -> list[dict[str, Any]]:
    """Run every run of ``plan`` in this process; per run: step times, events, backend."""
    out: list[dict[str, Any]] = []
    for spec, port in zip(plan, ports, strict=True):
        gc.collect()
        result = instrumented_worker(rank, world_size, port, cfg, steps, spec.argv)
        events, backend = _events_per_step(result.report_path)
        snapshots = _snapshot_count(result.report_path)
        if result.report_path is not None:
            shutil.rmtree(os.path.dirname(result.report_path), ignore_errors=True)
        out.append(
            {
                "step_times": list(result.step_times),
                "events": events,
                "backend": backend,
                "snapshots": snapshots,
                "param_bytes": result.param_bytes,
            }
        )
        if verbose and rank == 0:
            ms = statistics.median(result.step_times[warmup:]) * 1e3
            print(
                f"[bench] run {spec.index + 1}/{len(plan)} {spec.config}: {ms:.1f} ms/step",
                file=sys.stderr,
                flush=True,
            )
    return out


def merge_ranks(
    plan: list[RunSpec], per_rank: list[list[dict[str, Any]]], warmup: int
) -> list[RunResult]:
    """Combine the ranks' measurements run by run (a step lasts as long as its slowest rank)."""
    results: list[RunResult] = []
    for i, spec in enumerate(plan):
        runs = [rank_runs[i] for rank_runs in per_rank]
        step_times = [max(ts) for ts in zip(*(r["step_times"] for r in runs), strict=True)]
        events: dict[int, int] = {}
        for r in runs:
            for step, n in r["events"].items():
                events[int(step)] = events.get(int(step), 0) + n
        results.append(
            RunResult(
                spec=spec,
                step_times=step_times,
                median_s=statistics.median(step_times[warmup:]),
                events_per_step=events,
                backend=next((r["backend"] for r in runs if r["backend"]), None),
                snapshots=sum(r["snapshots"] for r in runs),
            )
        )
    return results


def summarize(
    results: list[RunResult], configs: list[Config], warmup: int, size: dict[str, int]
) -> list[dict[str, Any]]:
    """One row per configuration: median step time, pair ratios, events per timed step."""
    by_index = {r.spec.index: r for r in results}
    off_runs = [r for r in results if r.spec.config == OFF]
    rows: list[dict[str, Any]] = [
        {
            "name": OFF,
            "mode": OFF,
            "size": size,
            "backend": None,
            "backend_used": None,
            "median_step_ms": statistics.median(r.median_s for r in off_runs) * 1e3,
            "run_medians_ms": [r.median_s * 1e3 for r in off_runs],
            "ratio": 1.0,
            "pair_ratios": [],
            "events_per_step": None,
            "events_first_last": None,
            "snapshots": 0,
        }
    ]
    for config in configs:
        on_runs = [r for r in results if r.spec.config == config.name]
        ratios = [r.median_s / by_index[r.spec.index - 1].median_s for r in on_runs]
        timed_events = [
            [r.events_per_step.get(s, 0) for s in range(warmup, len(r.step_times))]
            for r in on_runs
            if r.events_per_step
        ]
        row: dict[str, Any] = {
            "name": config.name,
            "mode": config.mode,
            "size": size,
            "backend": config.backend,
            "backend_used": sorted({r.backend for r in on_runs if r.backend}),
            "argv": on_runs[0].spec.argv if on_runs else None,
            "median_step_ms": statistics.median(r.median_s for r in on_runs) * 1e3,
            "run_medians_ms": [r.median_s * 1e3 for r in on_runs],
            "ratio": statistics.median(ratios),
            "pair_ratios": ratios,
            "events_per_step": None,
            "events_first_last": None,
            "snapshots": min(r.snapshots for r in on_runs),
        }
        if timed_events:
            row["events_per_step"] = statistics.mean(statistics.mean(e) for e in timed_events)
            row["events_first_last"] = (timed_events[0][0], timed_events[0][-1])
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> list[str]:
    """The result table as text lines."""
    header = ["configuration", "median step (ms)", "ratio to off", "pair ratios", "events/step"]
    table = [header]
    for row in rows:
        ratios = row["pair_ratios"]
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
        events = row["events_per_step"]
        table.append(
            [
                row["name"],
                f"{row['median_step_ms']:.1f}",
                f"{row['ratio']:.3f}",
                spread,
                "-" if events is None else f"{events:.0f}",
            ]
        )
    widths = [max(len(r[c]) for r in table) for c in range(len(header))]
    lines = []
    for n, r in enumerate(table):
        cells = [r[0].ljust(widths[0])] + [
            v.rjust(w) for v, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def row_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Warnings about rows: growing event counts, a backend other than asked, no snapshot."""
    notes: list[str] = []
    for row in rows:
        first_last = row["events_first_last"]
        if first_last and first_last[1] > first_last[0] * 1.1:
            notes.append(
                f"note: '{row['name']}' events/step grew from {first_last[0]} to {first_last[1]} "
                "over the timed steps (overhead rises with training length)"
            )
        used = row["backend_used"]
        if row["mode"] not in (OFF, HOOKS) and used != [row["backend"]]:
            notes.append(f"note: '{row['name']}' asked for backend {row['backend']}, ran {used}")
        if row["mode"].startswith("deep") and not row["snapshots"]:
            notes.append(f"note: '{row['name']}' wrote no allocator snapshot")
    return notes


def device_name() -> str:
    """The accelerator if any (training itself always runs on CPU with gloo)."""
    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``args.modes`` comes back expanded and checked."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default 6)")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed first steps (default 2)")
    p.add_argument("--repeats", type=int, default=None, help="off/on pairs per config (default 3)")
    p.add_argument("--parallel", choices=("tp", "pp", "none"), default="pp")
    p.add_argument(
        "--backend", choices=backend_choices(), default="auto", help="--memscope-backend"
    )
    p.add_argument(
        "--modes",
        nargs="+",
        choices=("all", *MODE_CHOICES),
        default=["all"],
        help="row groups to run (default all; the default-settings row always runs)",
    )
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    p.add_argument("--seq-length", type=int, default=32, help="sequence length (default 32)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 repeat, 3 timed steps")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no per-run progress on stderr")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 3 if args.quick else 6
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.steps < 1 or args.repeats < 1 or args.warmup_steps < 0:
        p.error("--steps and --repeats must be >= 1, --warmup-steps >= 0")
    if min(args.hidden, args.layers, args.seq_length, args.heads) < 1:
        p.error("--hidden, --layers, --seq-length and --heads must be >= 1")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")
    cfg, world_size = model_config(args)
    try:
        cfg.validate(world_size)
    except ValueError as exc:
        p.error(str(exc))
    registered = available_backend_names()
    if "all" in args.modes:
        args.skipped = [m for m in MODES if MODES[m][1] not in registered]
        args.modes = [m for m in MODE_CHOICES if m not in args.skipped]
    else:
        missing = [m for m in args.modes if m in MODES and MODES[m][1] not in registered]
        if missing:
            p.error(f"--modes {' '.join(missing)}: not available here ({', '.join(registered)} is)")
        args.skipped = []
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the header, the table and ``overhead: R``; return exit code."""
    args = parse_args(argv)
    cfg, world_size = model_config(args)
    configs = build_configs(args.modes, args.backend, args.warmup_steps, args.steps, world_size)
    total_steps = args.warmup_steps + args.steps
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memscope_bench_") as outdir:
        plan = build_plan(args.repeats, configs, outdir)
        ports = free_ports(len(plan))  # one gloo rendezvous per run
        try:
            per_rank = spawn(
                world_size,
                bench_worker,
                ports,
                cfg,
                total_steps,
                plan,
                args.warmup_steps,
                not args.quiet,
                timeout=3600.0,
            )
        except WorkerError as exc:
            print(f"bench_overhead: training failed:\n{exc}", file=sys.stderr)
            return 1
    elapsed = time.perf_counter() - started
    results = merge_ranks(plan, per_rank, args.warmup_steps)
    size = model_size(cfg)
    rows = summarize(results, configs, args.warmup_steps, size)
    used = sorted({r.backend for r in results if r.backend and r.spec.mode == HOOKS})
    backend = args.backend + (f" -> {'/'.join(used)}" if used else "")
    params = sum(run[0]["param_bytes"] for run in per_rank) // 4  # fp32 parameters
    print(
        f"memscope overhead: tiny GPT {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads} heads, vocab {cfg.vocab_size}, seq {cfg.seq_length}, "
        f"mbs {cfg.micro_batch_size} x {cfg.num_microbatches} microbatches, {params} params | "
        f"TP={cfg.tp} PP={cfg.pp} ({world_size} proc, gloo on cpu) | steps {args.steps} "
        f"(+{args.warmup_steps} warmup) | repeats {args.repeats} | backend {backend} | "
        f"device {device_name()} | torch {torch.__version__} | {elapsed:.0f} s"
    )
    for line in format_table(rows):
        print(line)
    for line in row_notes(rows):
        print(line)
    for mode in args.skipped:
        name, mode_backend = MODES[mode]
        print(f"note: '{name}' skipped: backend {mode_backend} is not available here")
    overhead = next(row["ratio"] for row in rows if row["name"] == DEFAULT_CONFIG)
    if args.json:
        payload = {
            "setup": {
                "model": cfg.to_dict(),
                "size": size,
                "world_size": world_size,
                "parallel": args.parallel,
                "params": params,
                "steps": args.steps,
                "warmup_steps": args.warmup_steps,
                "repeats": args.repeats,
                "backend": args.backend,
                "backend_used": used,
                "modes": args.modes,
                "modes_skipped": args.skipped,
                "device": device_name(),
                "torch": torch.__version__,
                "elapsed_s": elapsed,
            },
            "configs": rows,
            "runs": [
                {
                    "index": r.spec.index,
                    "config": r.spec.config,
                    "mode": r.spec.mode,
                    "repeat": r.spec.repeat,
                    "argv": r.spec.argv,
                    "backend_used": r.backend,
                    "step_times_ms": [t * 1e3 for t in r.step_times],
                    "median_ms": r.median_s * 1e3,
                    "events_per_step": {str(k): v for k, v in sorted(r.events_per_step.items())},
                    "snapshots": r.snapshots,
                }
                for r in results
            ],
            "overhead": overhead,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    print(f"overhead: {overhead:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
