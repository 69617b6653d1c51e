"""How long the OOM report takes for a run of a million events.

When training raises an OOM, the session builds the report (and ``oom_report.json``) from the
analyzers' state: every event was already folded as it came, so the cost at the failure is
that of building the sections, whatever the run's length. This script measures both parts
on a synthetic run of ``--events`` hook and step events (module forwards, gradients, step
phases over many steps) that ends in an ``oom`` event:

* ``fold``: feeding every event to the analyzers (spread over the run, in the hooks);
* ``oom report``: building the sections with the ``oom`` one and its Markdown (at the OOM);
* ``offline``: ``memscope analyze --trace`` of the same events written as ``trace.jsonl``
  (reading a million JSON lines back), with ``--offline``.

Usage::

    python tools/bench_oom_report.py                   # 1,000,000 events
    python tools/bench_oom_report.py --events 200000 --offline
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from memscope.analysis.base import build_sections
from memscope.analysis.runtime_sections import runtime_analyzers
from memscope.analysis.static_comparison import StaticEstimate
from memscope.events.file_names import TRACE_NAME
from memscope.events.schema import (
    MODULE_FORWARD,
    OOM,
    OUTPUT_GRAD,
    PHASE_BACKWARD,
    PHASE_FORWARD,
    PHASE_STEP,
    STEP_PHASE,
    MemoryEvent,
)
from memscope.events.trace_sink import JsonlTraceSink
from memscope.reporters.oom_report import render_oom_markdown

MODULES = [f"decoder.layers.{i}.mlp" for i in range(32)]
MiB = 1 << 20


def synthetic_run(events: int) -> list[MemoryEvent]:
    """Module forwards and output gradients of 32 layers, a step event every 64, an OOM."""
    out: list[MemoryEvent] = []
    step, level = 0, 1000 * MiB
    for seq in range(events - 1):
        if seq % 65 == 64:
            kind, phase, module = STEP_PHASE, PHASE_STEP, ""
            step += 1
        elif (seq % 65) < 32:
            kind, phase, module = MODULE_FORWARD, PHASE_FORWARD, MODULES[seq % 32]
        else:
            kind, phase, module = OUTPUT_GRAD, PHASE_BACKWARD, MODULES[31 - seq % 32]
        level += MiB if phase == PHASE_FORWARD else -MiB if phase == PHASE_BACKWARD else 0
        out.append(
            MemoryEvent(
                seq=seq, event_type=kind, phase=phase, step=step, module=module,
                timestamp=seq * 1e-4, rank=0, mem_allocated_before=level,
                mem_allocated_after=level, mem_reserved_before=2 * level,
                mem_reserved_after=2 * level, max_mem_allocated=level + 32 * MiB,
                max_mem_reserved=2 * level, microbatch=0,
            )
        )  # fmt: skip
    out.append(
        MemoryEvent(
            seq=events, event_type=OOM, phase=PHASE_BACKWARD, step=step, module=MODULES[3],
            timestamp=events * 1e-4, rank=0, mem_allocated_before=level,
            mem_allocated_after=level, mem_reserved_before=2 * level,
            mem_reserved_after=2 * level, max_mem_allocated=level, max_mem_reserved=2 * level,
            notes="CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity "
            "of 79.10 GiB of which 1.50 GiB is free.",
        )
    )  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--offline", action="store_true", help="also time memscope analyze")
    args = parser.parse_args()
    if args.events < 100:
        parser.error("--events must be at least 100")
    events = synthetic_run(args.events)
    analyzers = runtime_analyzers(20, StaticEstimate(None))
    t0 = time.perf_counter()
    for e in events:
        for a in analyzers:
            a.consume(e)
    fold = time.perf_counter() - t0
    t0 = time.perf_counter()
    sections = build_sections(analyzers)
    oom = sections["oom"]
    assert oom is not None and oom["verdict"] == "fragmentation"
    text = render_oom_markdown({"rank": 0, "world_size": 1, **oom})
    at_oom = time.perf_counter() - t0
    print(f"events: {len(events)}")
    print(f"fold (spread over the run): {fold:.2f} s ({fold / len(events) * 1e6:.2f} us/event)")
    print(f"oom report at the failure: {at_oom * 1000:.1f} ms ({len(text)} chars of Markdown)")
    print(f"verdict: {oom['verdict']}; remedies: {[r['name'] for r in oom['remedies']]}")
    if args.offline:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, TRACE_NAME)
            sink = JsonlTraceSink(path, {"rank": 0, "world_size": 1})  # the session's writer
            try:
                sink.write(events)
            finally:
                sink.close()
            from memscope.cli import main as cli

            t0 = time.perf_counter()
            rc = cli(["analyze", "--trace", path, "--out", os.path.join(tmp, "r.json")])
            print(f"offline memscope analyze: {time.perf_counter() - t0:.2f} s (exit {rc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
