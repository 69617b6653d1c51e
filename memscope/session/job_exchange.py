"""Ranks hand their summaries to one rank through the job's own ``torch.distributed`` store.

Every traced rank *publishes* its summary (compressed JSON) under its own key of the store the
process group was built on (torchrun's, or the one ``init_process_group`` made) and counts
itself in; the *collector* (the lowest traced rank) polls that count until every expected rank
is in or its time is up, then reads the summaries that are there. Nothing here is a
collective: no rank waits for another except the collector, and the collector only for
``timeout_s``, so a rank that died or hangs is named as missing instead of stopping the job.
Every store call runs on a daemon thread joined with a deadline, so even a store whose server
is gone cannot hold a rank past it.

No shared file system is assumed: only the collector writes, to its own disk.

Known limitations: if the collector itself dies first, no job summary is written (each rank's
own report still is); a rank that publishes after the collector gave up is not in it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from memscope.events.bounded_input import InputRefused, open_regular, strict_json_loads
from memscope.events.file_names import JOB_SUMMARY_NAME
from memscope.io.atomic import atomic_write_json
from memscope.io.safe_output import free_name, name_part
from memscope.reporters.job_summary_json import job_summary_document

if TYPE_CHECKING:
    from memscope.capture.safety import FailureLog
    from memscope.config import RuntimeConfig

T = TypeVar("T")
logger = logging.getLogger("memscope")

#: Keys live under this prefix of the job's store (one generation per exchange in a process).
KEY_PREFIX = "memscope/job_summary"
#: A published summary is read back decompressed to at most this many bytes (a rank summary
#: is a few KB); anything longer reads as truncated JSON, an unreadable summary.
MAX_SUMMARY_BYTES = 32 * 2**20
POLL_S = 0.1
#: Beyond the wait itself: how long publishing, or reading what arrived, may take.
STORE_GRACE_S = 10.0
# Exchanges started in this process: every rank runs the same training code, so the n-th
# exchange of each rank meets the others' n-th under the same keys.
_generations = itertools.count()


class SummaryStore(Protocol):
    """The part of ``torch.distributed.Store`` MemScope uses (here, and for the run id)."""

    def set(self, key: str, value: Any) -> None: ...  # bytes (torch's stub says str)
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...
    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes: ...


@dataclass
class Gathered:
    """What the collector got: summaries by rank, why each other expected rank has none, and
    how long it waited."""

    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)
    waited_s: float = 0.0


def bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """``fn()`` on a daemon thread; its result, its exception, or ``TimeoutError`` after
    ``timeout_s`` (the thread is left behind; being a daemon it never holds the process)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:
            box.append((False, exc))

    worker = threading.Thread(target=run, name=f"memscope-{what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not box:
        raise TimeoutError(f"{what} took longer than {timeout_s:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


class JobSummaryExchange:
    """One exchange of rank summaries over ``store`` (see the module docstring)."""

    def __init__(
        self, store: SummaryStore, rank: int, expected: Sequence[int], generation: int = 0
    ) -> None:
        self.store = store
        self.rank = rank
        self.expected = sorted(set(expected))
        self.prefix = f"{KEY_PREFIX}/{generation}"
        self.published = False

    @property
    def collector(self) -> int:
        """The rank that gathers and writes: the lowest expected one."""
        return self.expected[0] if self.expected else 0

    def key(self, rank: int) -> str:
        return f"{self.prefix}/rank{rank}"

    def publish(self, summary: dict[str, Any]) -> None:
        """Put this rank's summary in the store (again: replaced, counted once)."""
        blob = zlib.compress(json.dumps(summary, separators=(",", ":")).encode("utf-8"))
        self.store.set(self.key(self.rank), blob)
        if not self.published:
            self.store.add(f"{self.prefix}/count", 1)
            self.published = True

    def collect(self, timeout_s: float, poll_s: float = POLL_S) -> Gathered:
        """Wait up to ``timeout_s`` for every expected rank, then read what is there."""
        started = time.monotonic()
        deadline = started + timeout_s
        want = len(self.expected)
        while self.store.add(f"{self.prefix}/count", 0) < want and time.monotonic() < deadline:
            time.sleep(poll_s)
        out = Gathered(waited_s=round(time.monotonic() - started, 3))
        for rank in self.expected:
            key = self.key(rank)
            if not self.store.check([key]):
                out.missing[rank] = (
                    f"no summary within {timeout_s:g} s (the rank died, hung or was not traced)"
                )
                continue
            try:
                out.summaries[rank] = decode_summary(self.store.get(key))
            except ValueError as exc:
                out.missing[rank] = f"unreadable summary ({exc})"
        return out


def decode_summary(blob: bytes) -> dict[str, Any]:
    """A published summary back as a dict; ``ValueError`` when it is not one."""
    try:
        text = zlib.decompressobj().decompress(bytes(blob), MAX_SUMMARY_BYTES)
        data = strict_json_loads(text.decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # the bounded reader's refusals
        raise ValueError(str(exc)) from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    return data


def default_store() -> SummaryStore | None:
    """The store of the default process group, or ``None`` without one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import distributed_c10d

    store: SummaryStore = distributed_c10d._get_default_store()
    return store


def share_job_summary(
    summary: dict[str, Any],
    *,
    rank: int,
    world_size: int,
    expected: Sequence[int],
    outdir: str,
    run_id: str,
    timeout_s: float,
    start_time: str = "",
    store: SummaryStore | None = None,
    generation: int | None = None,
) -> str | None:
    """Publish this rank's summary; on the collector, gather the others' (for at most
    ``timeout_s``) and write ``outdir/job_summary.json``, whose path is returned. Without a
    process group, a single-rank job writes its own. Raises on failure (the caller reports
    it once); never waits past ``timeout_s`` plus :data:`STORE_GRACE_S` twice. ``store``
    defaults to the default process group's; ``generation`` to this process's next."""
    store = store if store is not None else default_store()
    if generation is None:
        generation = next(_generations)
    exchange = JobSummaryExchange(store, rank, expected, generation) if store else None
    if exchange is None:
        if len(expected) > 1:
            raise RuntimeError("no torch.distributed process group to send the summary through")
        gathered = Gathered({rank: summary})
        collector = rank
    else:
        bounded(lambda: exchange.publish(summary), STORE_GRACE_S, "job summary publish")
        collector = exchange.collector
        if rank != collector:
            return None
        gathered = bounded(
            lambda: exchange.collect(timeout_s), timeout_s + STORE_GRACE_S, "job summary collect"
        )
    doc = job_summary_document(
        gathered.summaries,
        gathered.missing,
        world_size=world_size,
        written_by=collector,
        run_id=run_id,
        start_time=start_time,
        hostname=socket.gethostname(),
        collection={
            "transport": "torch.distributed store" if exchange else "single process",
            "timeout_s": timeout_s,
            "waited_s": gathered.waited_s,
            "expected_ranks": len(expected),
        },
    )
    path = os.path.join(outdir, JOB_SUMMARY_NAME)
    keep_other_runs_summary(path, run_id)
    atomic_write_json(path, doc)
    return path


class JobSummaryShare:
    """A session's side of the exchange: sends this rank's summary once (at the end, or at
    the failure that ends the run); a failure is recorded once and changes nothing else."""

    def __init__(
        self, config: RuntimeConfig, rank: int, world_size: int, failures: FailureLog
    ) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.failures = failures
        self.sent = False
        self.path: str | None = None  # job_summary.json, on the rank that wrote it

    def share(self, summary: dict[str, Any] | None, run_id: str, start_time: str) -> None:
        """Send ``summary`` (the last report's, of run ``run_id`` started at ``start_time``)
        unless already sent or switched off."""
        cfg = self.config
        if not cfg.job_summary or summary is None or self.sent:
            return
        self.sent = True
        try:
            path = share_job_summary(
                summary,
                rank=self.rank,
                world_size=self.world_size,
                expected=cfg.traced_ranks(self.world_size),
                outdir=cfg.outdir,
                run_id=run_id,
                start_time=start_time,
                timeout_s=cfg.job_summary_timeout,
            )
        except Exception as exc:
            self.failures.record("job_summary", exc)
            return
        if path is not None:
            self.path = path
            logger.info("memscope rank %d: wrote %s", self.rank, path)


#: A job summary larger than this is not read to learn its run id (it is kept either way).
_MAX_SUMMARY_PEEK = 256 << 20


def keep_other_runs_summary(path: str, run_id: str) -> str | None:
    """One ``job_summary.json`` per run id: another run's (or an unreadable) summary at
    ``path`` is renamed to ``job_summary.prev-<its run id>.json`` (a free name) before this
    run writes its own, so two runs into one output folder never overwrite each other's.
    Returns where it was kept, or ``None`` when there was none or it was this run's."""
    if not os.path.lexists(path):
        return None
    try:
        with open_regular(path, _MAX_SUMMARY_PEEK) as f:
            previous = json.loads(f.read()).get("run_id")
    except (InputRefused, OSError, ValueError, AttributeError):
        previous = "unreadable"
    if previous == run_id:
        return None
    stem, ext = os.path.splitext(path)
    kept = free_name(f"{stem}.prev-{name_part(str(previous))}", ext)
    os.rename(path, kept)
    return kept
