"""Show that MemScope's host memory stays bounded over a long run.

Trains the tiny real megatron-core GPT in this process (world size 1, gloo, CPU) for many
steps with tracing on, and prints at checkpoints: host RSS, events recorded, events held in
memory for the report, per-step summaries held, module/hot-spot table sizes and the JSONL
trace size on disk. The in-memory columns must stop growing after the detail steps; RSS must
stay flat (the JSONL trace grows on disk by design).

Usage::

    python tools/bench_trace_memory.py              # 2000 steps, ~2-4 minutes on 2 cores
    python tools/bench_trace_memory.py --steps 300  # quicker

The last line is ``rss growth after warmup: X MiB`` (RSS at the end minus RSS at the first
checkpoint after warmup).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

import torch

from memscope.capture.backends.host import host_rss_bytes
from memscope.demo.launcher import free_port
from memscope.demo.tiny_gpt import (
    TinyGPTConfig,
    build_model,
    build_optimizer,
    destroy_process,
    init_process,
)
from memscope.demo.tiny_gpt_training import make_data_iterators, train_step
from memscope.demo.traced_training import megatron_like_args
from memscope.events.file_names import TRACE_NAME
from memscope.integrations.megatron import MemScopeMegatronRuntime

MIB = 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50, help="steps before the RSS baseline")
    parser.add_argument("--checkpoints", type=int, default=8, help="rows printed")
    parser.add_argument("--off", action="store_true", help="baseline: same training, untraced")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")

    cfg = TinyGPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_microbatches=1)
    outdir = tempfile.mkdtemp(prefix="memscope-bench-mem-")
    init_process(0, 1, free_port(), cfg)
    try:
        chunks = build_model(cfg)
        optimizer = build_optimizer(chunks, cfg)
        argv = [] if args.off else ["--memscope"]
        runtime = MemScopeMegatronRuntime.from_megatron_args(
            megatron_like_args(cfg, [*argv, "--memscope-outdir", outdir])
        )
        runtime.attach_model(chunks)
        runtime.attach_optimizer(optimizer)
        runtime.start()
        session = runtime.session
        iterators = make_data_iterators(cfg)
        marks = {args.warmup} | {
            args.warmup + (args.steps - args.warmup) * i // args.checkpoints
            for i in range(1, args.checkpoints + 1)
        }
        mode = "untraced baseline" if args.off else "storage backend, default settings"
        print(f"tiny GPT, 1 rank, {mode}, {args.steps} steps (torch {torch.__version__})")
        header = (
            f"{'step':>6} {'rss MiB':>8} {'events':>9} {'in memory':>9} {'steps held':>10} "
            f"{'hot spots':>9} {'modules':>7} {'jsonl MiB':>9} {'s/step':>7}"
        )
        print(header)
        print("-" * len(header))
        baseline = None
        t_last, s_last = time.perf_counter(), 0
        for step in range(args.steps):
            train_step(chunks, optimizer, cfg, step, iterators, runtime)
            done = step + 1
            if done in marks:
                gc.collect()
                rss = host_rss_bytes()
                if done == args.warmup:
                    baseline = rss
                jsonl = os.path.join(runtime.report_dir, TRACE_NAME)
                now = time.perf_counter()
                recording = session.recording
                if recording is None or recording.tracer is None:
                    counts = ["-"] * 5 + ["-"]
                else:
                    by_type = {type(a).__name__: a for a in recording.analyzers}
                    counts = [
                        recording.tracer.events_emitted,
                        len(recording.store.events),
                        len(by_type["StepAnalyzer"].steps),
                        len(by_type["HotSpotAnalyzer"].hot_spots),
                        len(by_type["ModuleAnalyzer"].modules),
                        f"{os.path.getsize(jsonl) / MIB:.1f}",
                    ]
                print(
                    f"{done:>6} {rss / MIB:>8.1f} {counts[0]:>9} {counts[1]:>9} {counts[2]:>10} "
                    f"{counts[3]:>9} {counts[4]:>7} {counts[5]:>9} "
                    f"{(now - t_last) / max(done - s_last, 1):>7.3f}",
                    flush=True,
                )
                t_last, s_last = now, done
        runtime.finalize()
        end_rss = host_rss_bytes()
    finally:
        destroy_process()
    assert baseline is not None
    print(f"rss growth after warmup: {(end_rss - baseline) / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
