"""tools/bench_hook_cost.py runs, and every hook family fires where it should: one module
event per module forward, one output-gradient event per module output, one parameter event
per parameter (the figure itself is a timing, printed, never asserted)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
)
import bench_hook_cost


def test_the_benchmark_counts_one_event_per_module_output_and_parameter():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench_hook_cost.main(["--blocks", "3", "--steps", "1", "--repeats", "1"]) == 0
    text = out.getvalue()
    events = dict(re.findall(r"^(untraced|step callbacks only|all hooks)\s+[\d.]+\s+(\d+)$",
                             text, re.M))  # fmt: skip
    modules = 1 + 3 * 5  # the Sequential, each block and its four submodules
    params = 3 * 6
    steps = 4  # the step boundaries: step start, two phase ends, step end
    assert events == {
        "untraced": "0",
        "step callbacks only": str(steps),
        "all hooks": str(steps + 2 * modules + params),
    }
    assert re.search(r"^per event: -?\d+\.\d us$", text, re.M)  # a timing: its sign is noise here
