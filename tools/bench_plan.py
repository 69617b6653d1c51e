"""How long ``memscope plan`` takes for a 70B Llama-style model on 1,024 GPUs.

Builds the model from the repository's Llama-3-8B config scaled to 70B (80 layers, hidden
8192, 64 heads, 8 query groups, FFN 28672, sequence 8192, global batch 512), plans it for
1,024 GPUs of 80 GiB with 10% headroom, and prints the layouts searched, how many fit, the
time (wall clock, and this process's CPU time, which other jobs on a shared machine do not
inflate), and the top plan. Target: a few seconds. Last line:
``plan: 70B on 1024 GPUs -> N layouts in T s (C s of CPU: ...)``.

Usage::

    python tools/bench_plan.py [--world-size 1024] [--gpu-memory-gib 80]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from memscope.analysis.static.planner import plan
from memscope.analysis.static.spec_checks import validate_spec
from memscope.inputs.config_files import load_config
from memscope.units import format_bytes

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "static" / "llama3_8b_tp4_pp2.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=1024)
    parser.add_argument("--gpu-memory-gib", type=float, default=80.0)
    ns = parser.parse_args(argv)
    spec, _ = load_config(str(CONFIG), None, None)
    model = dataclasses.replace(spec.model, num_layers=80, hidden_size=8192,
                                num_attention_heads=64, ffn_hidden_size=28672)  # fmt: skip
    spec = validate_spec(dataclasses.replace(spec, model=model))
    budget = int(ns.gpu_memory_gib * 2**30 * 0.9)
    t0, c0 = time.perf_counter(), time.process_time()
    result = plan(spec, ns.world_size, budget)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"budget {format_bytes(budget)}; searched {result['searched']} layouts, "
          f"{result['fitting']} fit")  # fmt: skip
    if result["plans"]:
        top = result["plans"][0]
        print(f"top: {top['flags']}; peak {format_bytes(top['peak_bytes'])}, "
              f"step time x{top['cost']['total']:.3f}")  # fmt: skip
    print(f"plan: 70B on {ns.world_size} GPUs -> {result['searched']} layouts in {took:.2f} s "
          f"({cpu:.2f} s of CPU: the machine's other jobs do not count)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
