"""Chrome-trace / Perfetto JSON from MemScope events (plain dicts in, a JSON-ready dict out).

Per rank (one process, ``pid`` = rank): counter tracks of allocated and reserved bytes and,
when the backend classifies memory, one per category; slices for step phases (thread
"steps") and module forwards and recomputations (thread "forward"), from each event's
``start_timestamp`` to its ``timestamp``; instants for gradients (thread "backward"), at the
rank's peak and where training died (an OOM or another exception, with its reason).
The peak is the report's attributed one (its ``peak`` section: step, phase, module,
microbatch, chunk), placed at the end of the first event of its step whose interval reached
it; the ``memory`` counter gets a sample of exactly the peak's bytes there, since the
readings taken after each event miss the high-water mark reached inside it.
Timestamps are microseconds since each rank's tracing started.
Opens in ui.perfetto.dev and chrome://tracing; a long run is split into windows of whole
steps (:func:`step_windows`) so that each file stays small enough to open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memscope.events.schema import FAILURE_EVENTS, OOM

THREADS = {"steps": 1, "forward": 2, "backward": 3}
SLICE_EVENTS = {"step_phase": "steps", "module_forward": "forward"}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def rank_trace_events(
    rank: int, events: Iterable[Mapping[str, Any]], peak: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The trace events of one rank (``events``: ``trace.jsonl`` event dicts, in order;
    ``peak``: the rank report's ``peak`` section; without one, the highest high-water mark
    among ``events``, unattributed)."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "pid": rank, "name": "process_name", "args": {"name": f"rank {rank}"}},
    ]
    for name, tid in THREADS.items():
        out.append({"ph": "M", "pid": rank, "tid": tid, "name": "thread_name",
                    "args": {"name": name}})  # fmt: skip
    last_counter = -1.0
    best: tuple[int, float] | None = None
    where = dict(peak or {})
    top = int(where.get("memory_bytes") or 0)
    placed = False
    for e in events:
        ts = counter_ts = _us(float(e["timestamp"]))
        high = int(e.get("max_mem_allocated") or 0)
        if top and not placed and high >= top and e.get("step") == where.get("step"):
            placed = True  # the peak happened inside this event: its sample and instant
            at = max(ts, round(last_counter + 0.001, 3))
            reserved = max(top, int(e.get("max_mem_reserved") or 0))
            out.append({"ph": "C", "pid": rank, "ts": at, "name": "memory",
                        "args": {"allocated": top, "reserved": reserved}})  # fmt: skip
            out.append(_peak_instant(rank, at, top, where))
            last_counter, counter_ts = at, round(at + 0.001, 3)  # then the reading after it
        kind = e.get("event_type", "")
        track = SLICE_EVENTS.get(kind)
        start = e.get("start_timestamp")
        if track is not None and start is not None:
            begin = _us(float(start))
            name = e.get("module") or e.get("phase") or kind
            args = {"phase": e.get("phase"), "step": e.get("step"),
                    "microbatch": e.get("microbatch"), "virtual_chunk": e.get("virtual_chunk"),
                    "allocated_after": e.get("mem_allocated_after"),
                    "high_water": e.get("max_mem_allocated")}  # fmt: skip
            out.append({"ph": "X", "pid": rank, "tid": THREADS[track], "ts": begin,
                        "dur": max(0.0, round(ts - begin, 3)), "name": str(name),
                        "cat": str(e.get("phase", "")), "args": args})  # fmt: skip
        elif kind in FAILURE_EVENTS:
            out.append({"ph": "i", "s": "p", "pid": rank, "tid": THREADS["steps"], "ts": ts,
                        "name": "OOM" if kind == OOM else "crash", "cat": kind,
                        "args": {"reason": e.get("notes"), "step": e.get("step"),
                                 "phase": e.get("phase"), "module": e.get("module"),
                                 "microbatch": e.get("microbatch"),
                                 "allocated": e.get("mem_allocated_after")}})  # fmt: skip
        elif kind in ("output_grad", "param_grad"):
            out.append({"ph": "i", "s": "t", "pid": rank, "tid": THREADS["backward"], "ts": ts,
                        "name": str(e.get("module", kind)), "cat": kind,
                        "args": {"microbatch": e.get("microbatch"),
                                 "allocated_after": e.get("mem_allocated_after")}})  # fmt: skip
        if counter_ts > last_counter:  # one reading per instant, in time order
            last_counter = counter_ts
            out.append({"ph": "C", "pid": rank, "ts": counter_ts, "name": "memory",
                        "args": {"allocated": e.get("mem_allocated_after"),
                                 "reserved": e.get("mem_reserved_after")}})  # fmt: skip
            categories = e.get("categories")
            if isinstance(categories, Mapping):
                out.append({"ph": "C", "pid": rank, "ts": counter_ts, "name": "categories",
                            "args": dict(categories)})  # fmt: skip
        if best is None or high > best[0]:
            best = (high, ts)
    if best is not None and not top:  # no report peak: the highest mark, unattributed
        out.append(_peak_instant(rank, best[1], best[0], {}))
    return out


def _peak_instant(rank: int, ts: float, nbytes: int, peak: Mapping[str, Any]) -> dict[str, Any]:
    where = {k: peak.get(k) for k in ("step", "phase", "module", "microbatch", "virtual_chunk")}
    return {"ph": "i", "s": "p", "pid": rank, "tid": THREADS["steps"], "ts": ts, "name": "peak",
            "args": {"bytes": nbytes, **where, "attribution": peak.get("attribution")}}  # fmt: skip


def step_windows(sizes: Sequence[tuple[int, int]], max_bytes: int) -> list[tuple[int, int]]:
    """Consecutive steps grouped so each group's bytes stay within ``max_bytes``: ``sizes`` is
    ``(step, bytes)`` in step order, the result ``(first step, last step)`` per group. A step
    larger than ``max_bytes`` on its own is a group of its own."""
    windows: list[tuple[int, int]] = []
    total = 0
    for step, nbytes in sizes:
        if windows and total + nbytes <= max_bytes:
            windows[-1] = (windows[-1][0], step)
            total += nbytes
        else:
            windows.append((step, step))
            total = nbytes
    return windows


def chrome_trace(ranks: Mapping[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """The whole file: every rank's events (see :func:`rank_trace_events`)."""
    events = [e for rank in sorted(ranks) for e in ranks[rank]]
    return {"traceEvents": events, "displayTimeUnit": "ms"}
