"""Run a function in several fresh processes and collect what each returns.

Used to launch the 2-process gloo trainings of ``memscope demo``, the tests and benchmarks.
A worker's exception is re-raised in the parent as :class:`WorkerError` with every rank's
traceback; surviving workers are stopped.
"""

from __future__ import annotations

import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

# --------------------------------------------------------------------------------------------
# processes


class WorkerError(RuntimeError):
    """A spawned worker raised (message carries the worker tracebacks) or died."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago (all held open
    together while they are chosen, so that concurrent jobs never get the same one)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _spawn_entry(
    rank: int, world_size: int, fn: Callable[..., Any], args: tuple[Any, ...], results: Any
) -> None:
    """Child-process entry: run ``fn`` and report ``(rank, ok, payload)`` on the queue."""
    torch.set_num_threads(1)
    try:
        out = fn(rank, world_size, *args)
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        raise SystemExit(1) from None
    results.put((rank, True, out))


def spawn(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 600.0,
    grace: float = 5.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes.

    Returns the per-rank results (index = rank).  If a worker raises or dies, the others get
    ``grace`` seconds and are then terminated, and :class:`WorkerError` is raised with every
    collected traceback.  ``fn``, ``args`` and the results must be picklable.

    The workers share a run id as any launch's ranks do: they agree on one through their
    process group's store (see :mod:`memscope.session.run_identity`).
    """
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_spawn_entry, args=(r, world_size, fn, args, results))
        for r in range(world_size)
    ]
    for proc in procs:
        proc.start()
    outputs: dict[int, Any] = {}
    errors: dict[int, str] = {}
    dead_since: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    grace_end: float | None = None
    try:
        while len(outputs) + len(errors) < world_size:
            now = time.monotonic()
            if now > deadline:
                errors[-1] = f"timed out after {timeout:.0f}s"
                break
            if grace_end is not None and now > grace_end:
                break
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                for r, proc in enumerate(procs):
                    if r in outputs or r in errors or proc.exitcode is None:
                        continue
                    # Exited without (yet) reporting: allow the queue a moment to deliver.
                    if now - dead_since.setdefault(r, now) > 2.0:
                        errors[r] = f"worker exited with code {proc.exitcode} without reporting"
                if errors and grace_end is None:
                    grace_end = time.monotonic() + grace
                continue
            if ok:
                outputs[rank] = payload
            else:
                errors[rank] = str(payload)
                if grace_end is None:
                    grace_end = time.monotonic() + grace
    finally:
        for proc in procs:
            proc.join(timeout=1.0 if errors else 30.0)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
        results.close()
    if errors:
        msgs = [f"--- rank {r} ---\n{msg}" for r, msg in sorted(errors.items())]
        raise WorkerError(f"{len(errors)} of {world_size} worker(s) failed:\n" + "\n".join(msgs))
    return [outputs[r] for r in range(world_size)]
