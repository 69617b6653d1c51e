"""How fast ``memscope analyze-log``'s reader streams a large log, and in how much memory.

Writes a log of ``--gib`` GiB (default 1) under a temporary folder: the arguments block of
the Qwen2 fixture (tests/data/logs/qwen2_0.5b_bf16_dp2.log), then iteration lines and
other ranks' chatter, as 8 torchrun ranks (``[default0]:`` ... ``[default7]:``) print them
interleaved, with the memory lines after the first interval. Then reads it in a fresh
process and prints the seconds, MB/s and the reader process's peak resident memory.

    python tools/bench_log_reader.py [--gib 1] > benchmarks/log_reader_speed.txt
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "data", "logs", "qwen2_0.5b_bf16_dp2.log")
ITERATION = (
    " [2024-07-15 15:26:21] iteration {it:8d}/ 9999999 | consumed samples: {s:12d} | elapsed "
    "time per iteration (ms): 786.2 | learning rate: 2.000000E-06 | global batch size:     8 | "
    "lm loss: 8.724027E+00 | loss scale: 1.0 | grad norm: 84.046 | number of skipped "
    "iterations:   0 | number of nan iterations:   0 |"
)
CHATTER = (
    "[default{r}]:WARNING:megatron.core.utils:fused_indices_to_multihot has reached end of life."
)
MEMORY = (
    "[default{r}]:[Rank {r}] (after 10 iterations) memory (MB) | allocated: 7253.681640625 | "
    "max allocated: 7959.9697265625 | reserved: 8266.0 | max reserved: 8266.0"
)

READER = """
import resource, sys, time
sys.path.insert(0, {root!r})
from memscope.inputs.training_log import read_runs
t = time.perf_counter()
runs = read_runs([{path!r}])
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(dt, rss, len(runs), len(runs[0].memory), len(runs[0].iterations), runs[0].dropped)
"""


def write_log(path: str, gib: float) -> int:
    """The synthetic log; returns its size in bytes."""
    with open(FIXTURE, encoding="utf-8") as f:
        block = [ln for ln in f.read().splitlines() if not ln.startswith("#")]
    start = block.index(next(ln for ln in block if "end of arguments" in ln)) + 1
    target = int(gib * 2**30)
    with open(path, "w", encoding="utf-8") as out:
        out.write("\n".join(f"[default0]:{ln}" for ln in block[:start]) + "\n")
        it = 0
        while out.tell() < target:
            it += 1
            chunk = [CHATTER.format(r=r) for r in range(8)]
            chunk.append("[default7]:" + ITERATION.format(it=it, s=8 * it))
            if it == 10:
                chunk += [MEMORY.format(r=r) for r in range(8)]
            out.write("\n".join(chunk) + "\n")
        return out.tell()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the log (GiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.log")
        size = write_log(path, args.gib)
        code = READER.format(root=ROOT, path=path)
        t = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        wall = time.perf_counter() - t
        if res.returncode:
            sys.stderr.write(res.stderr)
            return 1
        seconds, rss_kib, runs, memory, iterations, dropped = res.stdout.split()
    mib = size / 2**20
    print(f"log: {mib:.0f} MiB, 8 torchrun ranks interleaved, {int(iterations) + int(dropped)} "
          "iteration lines")  # fmt: skip
    print(f"read: {float(seconds):.1f} s ({mib / float(seconds):.0f} MiB/s), process wall "
          f"{wall:.1f} s")  # fmt: skip
    print(f"peak resident memory of the reading process: {int(rss_kib) / 1024:.0f} MiB")
    print(f"kept: {runs} run, {memory} memory lines, {iterations} iteration lines "
          f"({dropped} more counted, not kept)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
