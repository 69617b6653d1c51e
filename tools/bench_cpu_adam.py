"""One host core's throughput of torch's fused CPU AdamW, the optimizer megatron-core's
``HybridDeviceOptimizer`` steps offloaded parameters with (``optimizer/__init__.py`` builds it
from ``torch.optim.AdamW`` with ``fused=True``).

Steps an fp32 parameter of ``--numel`` elements (default 16 Mi: 64 MiB, so parameter,
gradient and both moments are beyond the last-level cache, as a real shard is) with one
thread, best of ``--repeats`` rounds of 10 steps. The planner's default
(``HOST_ADAM_PARAMS_PER_S_PER_CORE`` in ``memscope/analysis/static/planner.py``) is this
figure to two significant digits; ``benchmarks/cpu_adam.txt`` holds the run it came from.
Last line: ``cpu adam: N params/s per core``.

Usage::

    python tools/bench_cpu_adam.py [--numel 16777216] [--repeats 10]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time


def measure(numel: int, repeats: int) -> float:
    """Parameters per second one thread's fused AdamW steps."""
    import torch

    torch.set_num_threads(1)
    param = torch.nn.Parameter(torch.randn(numel))
    param.grad = torch.randn(numel)
    opt = torch.optim.AdamW([param], lr=1e-3, fused=True)
    for _ in range(3):  # the moments are allocated on the first step
        opt.step()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(10):
            opt.step()
        best = min(best, (time.perf_counter() - t0) / 10)
    return numel / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--numel", type=int, default=16 << 20)
    parser.add_argument("--repeats", type=int, default=10)
    ns = parser.parse_args(argv)
    import torch

    rate = measure(ns.numel, ns.repeats)
    print(f"host: {platform.processor() or platform.machine()}; torch {torch.__version__}")
    print(f"tensor: {ns.numel} fp32 elements; best of {ns.repeats} x 10 steps, one thread")
    print(f"cpu adam: {rate:.3g} params/s per core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
