"""Every rank of every committed training-log fixture (tests/data/logs/): measured max
allocated, MemScope's estimate for that rank at that moment, the error.

The last column is what a steady-state estimate (Adam's moments present from the first
forward) would have said: the moment of the line matters where few real steps ran.

A fixture's ``# MEMSCOPE-OPTIONS:`` header line gives the options its log needs (a
tokenizer-defined vocabulary). An out-of-memory message has no max allocated: its row
shows what the rank held when it failed (allocated + the request, a lower bound of its
need) against the estimate for that moment.

    python tools/bench_analyze_log.py [--json benchmarks/analyze_log_fixtures.json]
        > benchmarks/analyze_log_fixtures.txt
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memscope.inputs.log_spec import LogOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "data", "logs")
OPTIONS = re.compile(r"^# MEMSCOPE-OPTIONS: (.*)$", re.M)
MIB = 2**20


def fixture_options(path: str) -> LogOptions:
    """The options the fixture's header gives (``--vocab-size``, ``--world-size``, ``--gpu``,
    ``--transformer-engine-version``), each followed by why in parentheses."""
    from memscope.inputs.log_spec import LogOptions

    with open(path, encoding="utf-8") as f:
        head = f.read(4096)
    given: dict[str, str] = {}
    m = OPTIONS.search(head)
    if m:
        flags = r"--(vocab-size|world-size|gpu|transformer-engine-version) ([^\s(]+)"
        for name, value in re.findall(flags, m.group(1)):
            given[name.replace("-", "_")] = value
    sizes = {k: int(given.pop(k)) for k in ("vocab_size", "world_size") if k in given}
    return LogOptions(**sizes, **given)


def rows() -> list[dict[str, Any]]:
    """One row per (fixture, run, rank line or out-of-memory message)."""
    sys.path.insert(0, ROOT)
    from memscope.cli.analyze_log_cmd import analyze_logs

    out = []
    for name in sorted(n for n in os.listdir(FIXTURES) if n.endswith(".log")):  # not README.md
        path = os.path.join(FIXTURES, name)
        doc = analyze_logs([path], fixture_options(path))
        for run in doc["runs"]:
            for r in run["ranks"]:
                if r["estimate"] is None:
                    continue  # a configuration the estimator refuses: nothing to compare
                measured = r["measured"]["max_allocated"]
                est = r["estimate"]["max_allocated_bytes"]
                out.append({
                    "fixture": name, "run": run["index"] + 1, "rank": r["rank"],
                    "what": f"max allocated after {r['iteration']} it. ({r['optimizer_steps']} "
                            "real steps)",
                    "measured_bytes": measured, "estimate_bytes": est,
                    "error": (est - measured) / measured, "verdict": r["verdict"]["status"],
                    "steady_bytes": r["estimate"]["steady_peak_bytes"],
                })  # fmt: skip
            for o in run["ooms"]:
                held = (o["sizes"]["allocated"] or 0) + (o["sizes"]["requested"] or 0)
                est = o["estimate"]["peak_bytes"]
                out.append({
                    "fixture": name, "run": run["index"] + 1, "rank": o["rank"],
                    "what": f"OOM: allocated + request ({o['optimizer_steps']} real steps)",
                    "measured_bytes": held, "estimate_bytes": est,
                    "error": (est - held) / held, "verdict": "lower bound",
                    "steady_bytes": o["estimate"]["steady_peak_bytes"],
                })  # fmt: skip
    return out


def table(data: list[dict[str, Any]]) -> str:
    head = ["fixture", "run", "rank", "moment", "measured MiB", "estimate MiB", "error",
            "steady-state estimate MiB (error)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in data:
        lines.append(
            f"| {r['fixture']} | {r['run']} | {r['rank']} | {r['what']} | "
            f"{r['measured_bytes'] / MIB:.1f} | {r['estimate_bytes'] / MIB:.1f} | "
            f"{r['error'] * 100:+.1f}% | {r['steady_bytes'] / MIB:.1f} "
            f"({(r['steady_bytes'] - r['measured_bytes']) / r['measured_bytes'] * 100:+.1f}%) |"
        )
    worst = max((abs(r["error"]) for r in data if r["verdict"] != "lower bound"), default=0.0)
    lines.append("")
    lines.append(f"{len(data)} rows; worst |error| of a max-allocated line: {worst * 100:.1f}%")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    data = rows()
    sys.stdout.write(table(data))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
