"""How long gathering, merging and rendering a job summary takes at thousands of ranks.

Makes N rank summaries (default 4,096) from a real rank report of the repository's example
PP=2 run, each with its own rank, parallel coordinates, peak and step series, then:

1. **transport**: every rank's summary is published through a real ``torch.distributed``
   ``TCPStore`` (server in this process, one client per published rank in turn) and the
   collector gathers them, as ``share_job_summary`` does in a job;
2. **merge**: ``job_summary.json`` is built and written;
3. **page**: ``memscope visualize-runtime --report job_summary.json`` (in-process) renders the
   job page.

Prints each time, the file sizes, and last ``job summary: N ranks -> page X MB in Y s``.
Target: every stage in seconds on a 2-core machine, and a page under 10 MB.

Usage::

    python tools/bench_job_summary.py [--ranks 4096] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from memscope.analysis.job import rank_summary
from memscope.cli import main as cli_main
from memscope.demo.launcher import free_port
from memscope.events.file_names import (
    JOB_PAGE_NAME,
    JOB_SUMMARY_NAME,
    REPORT_NAME,
    rank_folder_name,
)
from memscope.io.report_reader import load_report
from memscope.session.job_exchange import JobSummaryExchange, share_job_summary

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"


def synthetic_summaries(ranks: int, steps: int, seed: int = 0) -> list[dict[str, Any]]:
    """``ranks`` summaries shaped like the example's rank 0 (TP=8, PP=8, the rest DP)."""
    rng = random.Random(seed)
    report0 = load_report(str(EXAMPLE / rank_folder_name(0) / REPORT_NAME), "runtime")
    template = json.dumps(rank_summary(report0))  # events and tables dropped once
    out = []
    for rank in range(ranks):
        report = json.loads(template)
        tp, pp = rank % 8, (rank // 8) % 8
        peak = int((60 - 4 * pp) * 2**30 * (1 + rng.uniform(-0.01, 0.01)))
        report["rank"], report["world_size"] = rank, ranks
        report["metadata"].update(rank=rank, world_size=ranks, tp_rank=tp, pp_rank=pp,
                                  dp_rank=rank // 64, tp_size=8, pp_size=8,
                                  dp_size=max(1, ranks // 64))  # fmt: skip
        report["peak"].update(memory_bytes=peak, reserved_bytes=peak + 2**30)
        row = report["steps"][-1]
        report["steps"] = [
            dict(row, step=s, peak_allocated=int(peak * (0.9 + 0.1 * min(1, s / 3))),
                 allocated_end=peak // 3, reserved_end=peak + 2**30)
            for s in range(steps)
        ]  # fmt: skip
        out.append(rank_summary(report))
    return out


def _transport(summaries: list[dict[str, Any]], timeout_s: float) -> tuple[float, float, int]:
    """Seconds to publish all, seconds to collect, compressed bytes in the store (approx.)."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=60))
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    ranks = range(len(summaries))
    t0 = time.perf_counter()
    for summary in summaries[1:]:
        JobSummaryExchange(client, summary["rank"], ranks, generation=1).publish(summary)
    published = time.perf_counter() - t0
    collector = JobSummaryExchange(server, 0, ranks, generation=1)
    collector.publish(summaries[0])
    t0 = time.perf_counter()
    got = collector.collect(timeout_s)
    collected = time.perf_counter() - t0
    assert not got.missing, f"missing after transport: {sorted(got.missing)[:10]}"
    size = sum(len(server.get(collector.key(r))) for r in ranks)
    return published, collected, size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=200, help="steps per rank before thinning")
    ns = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="memscope-jobsum-")
    try:
        t0 = time.perf_counter()
        summaries = synthetic_summaries(ns.ranks, ns.steps)
        made = time.perf_counter() - t0
        one = len(json.dumps(summaries[0]))
        published, collected, stored = _transport(summaries, timeout_s=60.0)

        t0 = time.perf_counter()
        store = dist.HashStore()  # merge alone: every summary already in a store
        for s in summaries[1:]:
            JobSummaryExchange(store, s["rank"], range(ns.ranks), generation=2).publish(s)
        path = share_job_summary(
            summaries[0], rank=0, world_size=ns.ranks, expected=range(ns.ranks),
            outdir=workdir, run_id="bench", timeout_s=60.0, store=store, generation=2,
        )  # fmt: skip
        merged = time.perf_counter() - t0
        assert path is not None

        t0 = time.perf_counter()
        page = os.path.join(workdir, JOB_PAGE_NAME)
        rc = cli_main(["visualize-runtime", "--report", path, "--out", page])
        rendered = time.perf_counter() - t0
        if rc != 0:
            print(f"visualize-runtime exited {rc}", file=sys.stderr)
            return 1
        page_mb = os.path.getsize(page) / 2**20
        print(f"ranks: {ns.ranks} (built in {made:.1f} s); one summary {one / 1024:.1f} KiB JSON")
        print(f"transport (TCPStore): publish {published:.2f} s, collect {collected:.2f} s, "
              f"{stored / 2**20:.1f} MiB compressed")  # fmt: skip
        print(f"merge + write {JOB_SUMMARY_NAME}: {merged:.2f} s, "
              f"{os.path.getsize(path) / 2**20:.1f} MiB")  # fmt: skip
        print(f"render job page: {rendered:.2f} s, {page_mb:.2f} MiB")
        print(f"job summary: {ns.ranks} ranks -> page {page_mb:.1f} MB in "
              f"{merged + rendered:.1f} s")  # fmt: skip
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
