"""What the CUDA caching allocator's *allocated* counter counts, read from the real GPU
snapshot fixture (tests/data/gpu_e2e_snapshot, an H100 run): every block at its size rounded
up to ``allowance.ALLOCATION_ROUNDING`` bytes, so the counter includes the rounding the
estimate (bytes requested) leaves out, as ``analysis/static/allowance.py`` says."""

from __future__ import annotations

import glob
import os
import pickle

from memscope.analysis.static.allowance import ALLOCATION_ROUNDING

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpu_e2e_snapshot")


def test_the_allocated_counter_counts_blocks_at_their_rounded_size():
    (path,) = glob.glob(os.path.join(FIXTURE, "*.pickle"))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)  # our own committed fixture
    live = [
        b for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
    ]
    assert len(live) > 100
    for block in live:
        assert block["size"] % ALLOCATION_ROUNDING == 0
        assert 0 <= block["size"] - block["requested_size"] < ALLOCATION_ROUNDING
    # a segment's allocated_size (what torch.cuda.memory_allocated sums) is the rounded sizes
    counted = sum(s["allocated_size"] for s in snapshot["segments"])
    assert counted == sum(b["size"] for b in live) > sum(b["requested_size"] for b in live)
