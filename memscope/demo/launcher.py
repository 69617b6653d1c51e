"""Run a function in several fresh processes and collect what each returns.

Used to launch the 2-process gloo trainings of ``memscope demo``, the tests and benchmarks.
A worker's exception is re-raised in the parent as :class:`WorkerError` with every rank's
traceback; surviving workers are stopped.
"""

from __future__ import annotations

import os
import queue as queue_mod
import random
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


#: Where :func:`free_ports` looks first: below the kernel's ephemeral range, whose ports any
#: process's outgoing connection (gloo's, a browser's) or ``bind(0)`` may take in the seconds
#: between choosing a port and the rendezvous listening on it.
PORTS_BELOW_EPHEMERAL = (20000, 32768)


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 where unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return PORTS_BELOW_EPHEMERAL[1]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago (all held open
    together while they are chosen, so that concurrent jobs never get the same one), picked
    at random below the ephemeral range where possible (:data:`PORTS_BELOW_EPHEMERAL`), else
    by the kernel."""
    low, high = PORTS_BELOW_EPHEMERAL[0], min(PORTS_BELOW_EPHEMERAL[1], _ephemeral_low())
    candidates = random.Random().sample(range(low, high), min(high - low, 64 * count))
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            if len(socks) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        while len(socks) < count:  # nothing free below the range: the kernel's choice
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


#: Imported once by the fork server that starts the workers, so that each worker does not
#: spend seconds importing them again (a module that does not import is skipped).
PRELOAD = (
    "torch",
    "megatron.core.models.gpt",
    "megatron.core.pipeline_parallel",
    "megatron.core.distributed",
    "megatron.core.optimizer",
    "memscope.demo.tiny_gpt",
)


def _context() -> Any:
    """The workers' start method: a fork server with :data:`PRELOAD` imported where the
    platform has one (each worker a fork of that clean process), else ``spawn``."""
    import multiprocessing

    import torch.multiprocessing as tmp

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return tmp.get_context("spawn")
    ctx = tmp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _spawn_entry(
    rank: int,
    world_size: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    environ: dict[str, str] | None = None,
) -> None:
    """Child-process entry: run ``fn`` and report ``(rank, ok, payload)`` on the queue.
    ``environ``: the parent's environment at the launch (a fork server's children would
    otherwise have the server's, from when it started)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
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
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes (:func:`_context`).

    Returns the per-rank results (index = rank).  If a worker raises or dies, the others get
    ``grace`` seconds and are then terminated, and :class:`WorkerError` is raised with every
    collected traceback.  ``fn``, ``args`` and the results must be picklable.

    The workers share a run id as any launch's ranks do: they agree on one through their
    process group's store (see :mod:`memscope.session.run_identity`).
    """
    ctx = _context()
    results = ctx.Queue()
    environ = dict(os.environ)
    procs = [
        ctx.Process(target=_spawn_entry, args=(r, world_size, fn, args, results, environ))
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
