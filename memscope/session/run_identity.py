"""Which run a report belongs to, and a lock so two runs never write one rank folder.

The run id is what the launcher says the job is (``MEMSCOPE_RUN_ID``, torchrun's
``TORCHELASTIC_RUN_ID``, Slurm's job and step ids), so every rank of a job carries the same
one. Without any, the ranks agree on one through the store their process group was built on
(:func:`agreed_run_identity`): each offers its own id (host, pid, start time) with one
``compare_set`` on a fixed key, the first offer stays, and every rank reads back that one. No
rank waits for another (it is no collective), and a new launch has a new store, so a new id.
Only a process with neither (a single process without ``torch.distributed``) keeps its own id.
``run_id_source`` says which it was. The launcher's and the process's ids are computed once per
process, so a second ``train()`` in the same process is the same run.

A rank folder is claimed with a lock file. A second run that finds the folder locked by a live
run traces into a folder of its own next to it and says so; a folder left by an earlier,
finished run is kept, renamed with that run's id, before the new run writes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import time
import warnings
from dataclasses import dataclass

from memscope.events.file_names import REPORT_NAME
from memscope.io.safe_output import free_name
from memscope.session.job_exchange import SummaryStore, bounded, default_store
from memscope.session.teardown import Teardown

LOCK_NAME = ".memscope.lock"
#: A lock written from another host counts as live while it was touched this recently.
REMOTE_LOCK_FRESH_S = 15 * 60
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class RunIdentity:
    """The run's id, where it came from, and when this process started tracing."""

    run_id: str
    source: str
    start_time: str


#: The store key the ranks of a launch agree on a run id under (see :func:`agreed_run_identity`).
STORE_KEY = "memscope/run_id"
#: ``run_id_source`` of an id agreed through the store.
STORE_SOURCE = "torch.distributed store"
#: How long agreeing through the store may take before the rank keeps its own id.
STORE_TIMEOUT_S = 10.0


@functools.lru_cache(maxsize=1)
def run_identity() -> RunIdentity:
    """This process's run from the launcher's environment, else its own id (cached: one per
    process)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    env = os.environ
    for var in ("MEMSCOPE_RUN_ID", "TORCHELASTIC_RUN_ID"):
        value = env.get(var, "").strip()
        if value and value != "none":
            return RunIdentity(_SAFE.sub("_", value)[:80], var, started)
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID", "")
        value = env["SLURM_JOB_ID"] + (f".{step}" if step else "")
        return RunIdentity(_SAFE.sub("_", value)[:80], "SLURM_JOB_ID", started)
    own = f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
    return RunIdentity(_SAFE.sub("_", own)[:80], "process", started)


def agreed_run_identity(store: SummaryStore | None) -> tuple[RunIdentity, str]:
    """The run every rank of this launch shares, and a note (empty unless agreeing failed).

    A launcher's id (:func:`run_identity`) wins; else this process offers its own id under
    :data:`STORE_KEY` of ``store`` (the default process group's): ``compare_set`` with an
    empty expected value sets it only when no rank did before, and returns what is there, so
    every rank gets the first offer. A store that fails or takes longer than
    :data:`STORE_TIMEOUT_S` leaves the process its own id, and the note says why."""
    own = run_identity()
    if own.source != "process" or store is None:
        return own, ""
    try:
        raw = bounded(
            lambda: store.compare_set(STORE_KEY, "", own.run_id), STORE_TIMEOUT_S, "run id"
        )
        agreed = bytes(raw).decode("utf-8")
    except Exception as exc:
        return own, f"memscope: no run id agreed through the store ({exc}); using {own.run_id}"
    if not agreed or _SAFE.search(agreed) or len(agreed) > 80:
        return own, f"memscope: the store holds no usable run id; using {own.run_id}"
    return RunIdentity(agreed, STORE_SOURCE, own.start_time), ""


@dataclass
class Claim:
    """The folder this rank writes to, and what the claim had to say (a warning or empty)."""

    directory: str
    note: str = ""


def _lock_owner(directory: str) -> dict[str, object] | None:
    try:
        with open(os.path.join(directory, LOCK_NAME), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def _alive(owner: dict[str, object], directory: str) -> bool:
    pid = owner.get("pid")
    if owner.get("host") == socket.gethostname() and isinstance(pid, int):
        if pid == os.getpid():
            return False  # our own earlier session in this process: finished or abandoned
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        age = time.time() - os.path.getmtime(os.path.join(directory, LOCK_NAME))
    except OSError:
        return False
    return age < REMOTE_LOCK_FRESH_S


def _report_run_id(directory: str) -> str | None:
    if not os.path.isfile(os.path.join(directory, REPORT_NAME)):
        return None
    try:
        with open(os.path.join(directory, REPORT_NAME), encoding="utf-8") as f:
            meta = json.load(f).get("metadata") or {}
        run_id = meta.get("run_id")
        return str(run_id) if run_id else "unknown"
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return "unknown"


def _write_lock(directory: str, run: RunIdentity) -> None:
    body = {"run_id": run.run_id, "pid": os.getpid(), "host": socket.gethostname()}
    body["started"] = run.start_time
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(os.path.join(directory, LOCK_NAME), flags, 0o666)  # never through a link
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(body, f)


def claim_rank_dir(directory: str, run: RunIdentity) -> Claim:
    """Make ``directory`` this run's (or pick another one) and lock it."""
    owner = _lock_owner(directory)
    if owner is not None and owner.get("run_id") != run.run_id and _alive(owner, directory):
        other = free_name(f"{directory}.run-{run.run_id}")
        os.makedirs(other)
        _write_lock(other, run)
        return Claim(
            other,
            f"memscope: {directory} is being written by another run "
            f"({owner.get('run_id')}, pid {owner.get('pid')} on {owner.get('host')}); "
            f"this run traces into {other}",
        )
    note = ""
    previous = _report_run_id(directory)
    if previous is not None and previous != run.run_id:
        kept = free_name(f"{directory}.prev-{_SAFE.sub('_', previous)}")
        os.rename(directory, kept)
        note = f"memscope: {directory} held the report of run {previous}; kept as {kept}"
    os.makedirs(directory, exist_ok=True)
    _write_lock(directory, run)
    return Claim(directory, note)


def release_rank_dir(directory: str) -> None:
    """Remove our lock (a finished run leaves no lock)."""
    owner = _lock_owner(directory)
    if owner is not None and owner.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            os.remove(os.path.join(directory, LOCK_NAME))


def touch_lock(directory: str) -> None:
    """Mark the lock fresh (another host judges liveness by its age)."""
    with contextlib.suppress(OSError):
        os.utime(os.path.join(directory, LOCK_NAME))


def claim_run_folder(directory: str, teardown: Teardown) -> tuple[RunIdentity, str, list[str]]:
    """At a session's start: agree on the run with the other ranks (through the default
    process group's store), claim ``directory`` for it (released at teardown); returns the
    run, the folder this rank writes to, and the notes for the report's warnings."""
    run, agreement_note = agreed_run_identity(default_store())
    notes = [agreement_note] if agreement_note else []
    claim = claim_rank_dir(directory, run)
    teardown.push("rank_dir_lock", lambda: release_rank_dir(claim.directory))
    if claim.note:
        warnings.warn(claim.note, stacklevel=4)  # at the adapter's start()
        notes.append(claim.note)
    return run, claim.directory, notes
