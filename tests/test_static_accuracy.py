"""The CPU accuracy matrix's quick subset: our per-rank static peak against the measured one.

Real megatron-core runs (1-2 gloo processes) measured with the exact storage backend; the
full matrix and the Megatron/FlagScale formula columns are ``tools/bench_static_accuracy.py``.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))

from bench_static_accuracy import MATRIX, QUICK, estimate, measure

pytestmark = pytest.mark.integration

TOLERANCE = 0.03  # the bound on |static - measured| / measured, per rank


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", QUICK)
def test_static_peak_within_3_percent_and_persistent_terms_exact(name):
    world, overrides = next((w, o) for n, w, o in MATRIX if n == name)
    rows = measure(name, world, overrides)
    estimate(rows)
    assert len(rows) == world
    for row in rows:
        assert row["exact_params"] and row["exact_optimizer"], row
        assert abs(row["error"]) <= TOLERANCE, (name, row["rank"], row["error"])
        # the runtime report carried the same estimate in its comparisons
        assert row["in_report"] == row["ours"], row
