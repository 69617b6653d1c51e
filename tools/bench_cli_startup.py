"""How fast the offline CLI starts: ``memscope --help`` and ``memscope summarize``.

Runs each command N times as a fresh process (``python -m memscope.cli``, output discarded)
and prints the median, min and max wall time. The offline commands import neither torch nor
the reporters they don't use, so both should take well under a second (before the lazy CLI:
``--help`` 3.7 s, ``summarize`` 3.3-4.0 s, almost all of it importing torch).

Last line: ``startup: help X s, summarize Y s`` (medians).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from memscope.events.file_names import REPORT_NAME, rank_folder_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_REPORT = os.path.join(REPO, "examples", "cpu_pp2_demo", rank_folder_name(0), REPORT_NAME)


def wall_times(argv: list[str], runs: int) -> list[float]:
    """Wall time of ``python -m memscope.cli ARGV`` per run; fails loudly on a non-zero exit."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-m", "memscope.cli", *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        times.append(time.perf_counter() - t0)
        if res.returncode != 0:
            raise SystemExit(f"memscope {' '.join(argv)} exited {res.returncode}: {res.stderr}")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=10, help="processes per command")
    parser.add_argument("--report", default=EXAMPLE_REPORT, help="report for summarize")
    ns = parser.parse_args(argv)
    commands = {"help": ["--help"], "summarize": ["summarize", "--report", ns.report]}
    wall_times(["--help"], 1)  # warm the file system cache once
    medians = {}
    for name, command in commands.items():
        times = wall_times(command, ns.runs)
        medians[name] = statistics.median(times)
        print(
            f"memscope {' '.join(command)}: median {medians[name]:.3f} s "
            f"(min {min(times):.3f}, max {max(times):.3f}, {ns.runs} runs)"
        )
    print(f"startup: help {medians['help']:.3f} s, summarize {medians['summarize']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
