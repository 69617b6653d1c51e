"""The tracing costs the README quotes are the committed benchmarks' figures: the GPU pass's
summary (``tools/gpu_results.py``) and the CPU overhead table (``tools/bench_overhead.py``)."""

from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts: str) -> str:
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


def test_gpu_overhead_figures_in_the_readme_are_the_gpu_summary():
    summary = _read("benchmarks", "gpu", "h100_2026-11-28", "summary.txt")
    ratios = dict(re.findall(r"^   (.+?)\s+off .* ratio ([\d.]+)$", summary, re.M))
    readme = _read("README.md")
    assert f"made a step {float(ratios['cuda, all hooks (default)']):.1f}× slower" in readme
    assert (
        f"callbacks alone added {round(100 * (float(ratios['cuda, step callbacks only']) - 1))}%"
        in readme
    )
    assert f"made a step {float(ratios['storage (exact composition)']):.1f}× slower" in readme


def test_cpu_after_window_figures_in_the_readme_are_the_cpu_benchmark():
    table = _read("benchmarks", "overhead_cpu_pp2_h256_s128.txt")
    rows = dict(re.findall(r"^(\S.*?)\s{2,}[\d.]+\s+([\d.]+)\s", table, re.M))
    readme = _read("README.md")
    after = float(rows["all hooks, after the hook window"])
    inside = float(rows["+ param-grad hooks (all, default)"])
    steps_only = float(rows["step callbacks only"])
    assert f"cost {after:.2f}×, against {inside:.2f}× inside the window" in " ".join(readme.split())
    assert f"and {steps_only:.2f}× for the step callbacks alone" in " ".join(readme.split())
