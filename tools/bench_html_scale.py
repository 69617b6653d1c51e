"""How fast and how big the HTML page is for a huge trace.

Writes a synthetic ``runtime_report.json`` with N events (default 1,000,000: many steps,
modules and microbatches, one sharp peak), then runs the same code path as
``memscope visualize-runtime`` (read, payload, render, atomic write) and prints the time and
the page size, and checks that the peak value and its step survived downsampling.

Targets: under 30 s and under 20 MB for 1,000,000 events. Last line:
``html: N events -> X MB in Y s``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

from memscope.cli import main as cli_main
from memscope.events.file_names import REPORT_NAME
from memscope.events.schema import SCHEMA_VERSION

MODULES = [f"decoder.layers.{i}.{part}" for i in range(32) for part in
           ("input_layernorm", "self_attention", "self_attention.linear_qkv",
            "self_attention.core_attention", "self_attention.linear_proj",
            "pre_mlp_layernorm", "mlp", "mlp.linear_fc1", "mlp.linear_fc2")]  # fmt: skip


def synthetic_report(events: int, steps: int, seed: int = 0) -> tuple[dict, int, int]:
    """A report shaped like a real one; returns (report, peak bytes, peak step)."""
    rng = random.Random(seed)
    per_step = max(1, events // steps)
    peak_at = rng.randrange(events)
    peak_bytes = 80 * 2**30
    trace = []
    for i in range(events):
        step, k = divmod(i, per_step)
        after = 20 * 2**30 + (k % 977) * 2**24 + rng.randrange(2**20)
        high = peak_bytes if i == peak_at else after + 2**22
        trace.append({
            "seq": i, "event_type": "module_forward" if k % 3 else "output_grad",
            "module": MODULES[k % len(MODULES)], "phase": "forward" if k % 3 else "backward",
            "step": step, "microbatch": k % 8, "pipeline_stage": 0,
            "mem_allocated_after": after, "max_mem_allocated": high,
            "delta_allocated": rng.randrange(-2**24, 2**24),
        })  # fmt: skip
    peak_step = peak_at // per_step
    step_rows = [
        {"step": s, "allocated_start": 20 * 2**30, "allocated_end": 20 * 2**30,
         "reserved_end": 30 * 2**30, "peak_allocated": peak_bytes if s == peak_step else 40 * 2**30,
         "peak_reserved": 82 * 2**30, "peak_phase": "forward_backward"}
        for s in range(steps)
    ]  # fmt: skip
    report = {
        "schema_version": SCHEMA_VERSION, "report_type": "runtime", "tool": {"version": "bench"},
        "rank": 0, "world_size": 1, "status": "complete", "status_reason": "",
        "metadata": {"backend": "cuda", "device_name": "synthetic"},
        "peak": {"memory_bytes": peak_bytes, "reserved_bytes": 82 * 2**30, "step": peak_step,
                 "phase": "forward", "module": trace[peak_at]["module"], "attribution": "interval"},
        "comparisons": {"status": "missing", "reason": "synthetic"},
        "top_events": [], "phase_summary": [], "module_summary": [], "steps": step_rows,
        "runtime_trace": trace, "errors": [], "warnings": [], "trace": {},
    }  # fmt: skip
    return report, peak_bytes, peak_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (report + page)")
    ns = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="memscope-html-scale-")
    try:
        return _run(ns, workdir)
    finally:
        if ns.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(ns: argparse.Namespace, workdir: str) -> int:
    """Write the report, build the page like the CLI does, check it and print the figures."""
    report, peak_bytes, peak_step = synthetic_report(ns.events, ns.steps)
    path = os.path.join(workdir, REPORT_NAME)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, separators=(",", ":"))
    del report
    print(
        f"report: {ns.events} events, {ns.steps} steps, {os.path.getsize(path) / 1e6:.0f} MB json"
    )
    t0 = time.perf_counter()
    rc = cli_main(["visualize-runtime", "--report", path])
    elapsed = time.perf_counter() - t0
    out = os.path.join(workdir, REPORT_NAME.replace(".json", ".html"))
    with open(out, encoding="utf-8") as f:
        html = f.read()
    data = json.loads(html.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    kept_peak = (
        max(max(w["max_mem_allocated"]) for w in data["within_step"].values())
        if data["within_step"]
        else None
    )
    step_ok = peak_step in data["steps"]["step"]
    within_ok = kept_peak == peak_bytes and str(peak_step) in data["within_step"]
    print(
        f"exit code {rc}; peak step {peak_step} kept in the timeline: {step_ok}; "
        f"peak event kept in the within-step view: {within_ok}"
    )
    size_mb = os.path.getsize(out) / 1e6
    print(f"html: {ns.events} events -> {size_mb:.1f} MB in {elapsed:.1f} s")
    return 0 if rc == 0 and step_ok and within_ok else 1


if __name__ == "__main__":
    sys.exit(main())
