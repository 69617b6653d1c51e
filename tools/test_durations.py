"""Times the quick test subset (the unit layer) and names its slowest tests.

    python tools/test_durations.py                 # python -m pytest -m "not integration"
    python tools/test_durations.py --top 40 -- tests/test_planner.py   # any pytest arguments

Runs pytest in this process with a small plugin that times every test's setup, call and
teardown, in wall-clock seconds and in CPU seconds (this process plus the subprocesses it
waited for). On a machine shared with other jobs the wall time grows with their load while
the CPU time does not, so both are printed: the run's total, then the ``--top`` slowest tests
by wall time with their CPU time. Exits 1 if any test outside the integration layer took
longer than ``--limit`` seconds (30) of wall time, else with pytest's exit status.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections import defaultdict
from typing import Any

import pytest

LIMIT_S = 30.0


def _cpu() -> float:
    """CPU seconds of this process and of its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Timer:
    """pytest plugin: wall and CPU seconds per test (setup + call + teardown)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.integration: set[str] = set()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Any:
        if item.get_closest_marker("integration"):
            self.integration.add(item.nodeid)
        wall, cpu = time.perf_counter(), _cpu()
        yield
        self.wall[item.nodeid] += time.perf_counter() - wall
        self.cpu[item.nodeid] += _cpu() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=20, help="slowest tests listed")
    parser.add_argument("--limit", type=float, default=LIMIT_S, help="seconds a unit test may take")
    parser.add_argument(
        "pytest_args", nargs="*", help='after --: pytest arguments (default: -m "not integration")'
    )
    args = parser.parse_args(argv)
    timer = Timer()
    pytest_args = args.pytest_args or ["-m", "not integration"]
    wall, cpu = time.perf_counter(), _cpu()
    status = pytest.main(["-q", "-p", "no:cacheprovider", *pytest_args], plugins=[timer])
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    print(f"\n{len(timer.wall)} tests (pytest {' '.join(pytest_args)}): "
          f"{wall:.1f} s wall, {cpu:.1f} s CPU")  # fmt: skip
    slowest = sorted(timer.wall, key=timer.wall.__getitem__, reverse=True)[: args.top]
    print(f"slowest {len(slowest)} by wall time (wall s, CPU s):")
    for nodeid in slowest:
        layer = "integration" if nodeid in timer.integration else "unit"
        print(f"  {timer.wall[nodeid]:7.2f} {timer.cpu[nodeid]:7.2f}  {layer:11} {nodeid}")
    over = [n for n, s in timer.wall.items() if s > args.limit and n not in timer.integration]
    for nodeid in over:
        print(f"over {args.limit:g} s outside the integration layer: {nodeid}")
    return 1 if over else int(status)


if __name__ == "__main__":
    sys.exit(main())
