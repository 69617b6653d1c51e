"""The estimator's measured accuracy, read from the GPU benchmark's committed summary.

``tools/bench_static_gpu_golden.py --write`` regenerates ``benchmarks/static_gpu_golden.*``
and the generated module :mod:`.gpu_benchmark_summary` (its last line's figures: worst
signed error, median absolute error, case counts), so no file is read here. Code that
quotes the estimator's accuracy (the planner's band) reads it here;
``tests/test_gpu_benchmark_fresh.py`` re-runs the benchmark and fails when the committed
files, or a figure in the docs, differ from a fresh run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from memscope.analysis.static.gpu_benchmark_summary import SUMMARY


@dataclass(frozen=True)
class BenchmarkSummary:
    """The figures of one run of the GPU golden-value benchmark."""

    cases: int
    worst_error: float  # signed (estimate - measured) / measured of the worst case
    worst_case: str
    median_abs_error: float
    over_5_percent: int
    over_10_percent: int
    # the band: the cases whose flags the estimator claims to model whole (it warns of no
    # feature it does not model); the planner's and the OOM remedies' margin
    band_cases: int
    band_worst_error: float
    band_worst_case: str

    @property
    def worst_abs_error(self) -> float:
        return abs(self.worst_error)

    @property
    def band(self) -> float:
        """The estimator's uncertainty where it claims to model everything the flags set."""
        return abs(self.band_worst_error)


@lru_cache(maxsize=1)
def gpu_benchmark_summary() -> BenchmarkSummary:
    """The committed summary of ``benchmarks/static_gpu_golden.txt``."""
    data = SUMMARY
    return BenchmarkSummary(
        cases=int(data["cases"]),
        worst_error=float(data["worst_error"]),
        worst_case=str(data["worst_case"]),
        median_abs_error=float(data["median_abs_error"]),
        over_5_percent=int(data["over_5_percent"]),
        over_10_percent=int(data["over_10_percent"]),
        band_cases=int(data["band_cases"]),
        band_worst_error=float(data["band_worst_error"]),
        band_worst_case=str(data["band_worst_case"]),
    )
