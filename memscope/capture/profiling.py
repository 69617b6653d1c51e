"""torch.profiler and CUDA allocator-history snapshots, bounded by a step schedule."""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from memscope.capture.torch_features import cuda_history_unsupported, log_once
from memscope.config import ProfilerSchedule
from memscope.events.file_names import PROFILER_DIR, snapshot_window_name


class ProfilerController:
    """Runs ``torch.profiler`` over ``wait`` + ``warmup`` + ``active`` steps, once."""

    def __init__(self, schedule: ProfilerSchedule, outdir: str) -> None:
        self.outdir = os.path.join(outdir, PROFILER_DIR)
        self.traces: list[str] = []
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof: Any = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=schedule.wait, warmup=schedule.warmup, active=schedule.active, repeat=1
            ),
            on_trace_ready=self._export,
            profile_memory=True,
            record_shapes=True,
            with_stack=False,
        )
        self._running = False

    def _export(self, prof: Any) -> None:
        os.makedirs(self.outdir, exist_ok=True)
        path = os.path.join(self.outdir, f"trace_step{prof.step_num}.json")
        prof.export_chrome_trace(path)
        self.traces.append(path)

    def start(self) -> None:
        self._prof.start()
        self._running = True

    def step(self) -> None:
        if self._running:
            self._prof.step()

    def stop(self) -> None:
        if self._running:
            self._running = False
            self._prof.stop()


class SnapshotController:
    """Records CUDA allocator history from ``start_step`` for ``steps`` steps, then dumps it.

    The pickle (protocol 4) opens in pytorch.org/memory_viz. By default no stacks are
    recorded (the cheapest history: actions, addresses, sizes, times); ``python`` adds Python
    frames, ``all`` C++ frames too, which can take minutes to symbolise when dumping.
    ``on_dump`` receives the file's path and the snapshot itself (for the replay).
    """

    source = "cuda_allocator"

    def __init__(
        self,
        outdir: str,
        start_step: int,
        steps: int,
        max_entries: int,
        stacks: str,
        on_start: Callable[[], None] | None = None,
        on_dump: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.on_start = on_start  # recording began (the tracer starts its context markers)
        self.on_dump = on_dump  # a snapshot was written (side files go beside it)
        self.outdir = outdir
        self.start_step = start_step
        self.steps = steps
        self.started_at: int | None = None  # first recorded step (a resumed run starts late)
        self.max_entries = max_entries
        self.stacks = stacks
        self.recording = False
        self.done = False
        self.snapshots: list[str] = []

    def device_index(self) -> int:
        """The device whose allocator history is recorded (addresses in the snapshot are
        that device's)."""
        return int(torch.cuda.current_device())

    def _begin(self) -> None:
        if self.stacks == "none":
            torch.cuda.memory._record_memory_history(
                enabled="all", context=None, max_entries=self.max_entries
            )
        else:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="all", stacks=self.stacks, max_entries=self.max_entries
            )

    def _take(self) -> dict[str, Any]:
        return dict(torch.cuda.memory._snapshot())

    def _end(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)

    def on_step_start(self, step: int) -> None:
        if not self.done and not self.recording and step >= self.start_step:
            self._begin()
            self.recording = True
            self.started_at = step
            if self.on_start is not None:
                self.on_start()

    def on_step_end(self, step: int) -> None:
        if (
            self.recording
            and self.started_at is not None
            and step + 1 >= self.started_at + self.steps
        ):
            self.dump(snapshot_window_name(self.started_at, step))
            self.stop()

    def dump(self, name: str) -> str | None:
        if not self.recording:
            return None
        os.makedirs(self.outdir, exist_ok=True)
        path = os.path.join(self.outdir, name)
        snapshot = self._take()
        # a fresh temporary name (O_EXCL, never an existing file or planted link), renamed
        # over the snapshot's name (a rename replaces a link there, never its target)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=name, dir=self.outdir)
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(snapshot, f, protocol=4)  # what memory_viz's unpickler reads
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; snapshots are for the team
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self.snapshots.append(path)
        if self.on_dump is not None:
            self.on_dump(path, snapshot)
        return path

    def stop(self) -> None:
        if self.recording:
            self._end()
            self.recording = False
            self.done = True


class LedgerSnapshotController(SnapshotController):
    """The same schedule and files from the ``storage`` backend's allocation history (on a
    CPU, or on a GPU with ``--memscope-backend storage``): a pickle in the allocator
    snapshot's format, readable by pytorch.org/memory_viz and ``memscope analyze-snapshot``.
    """

    source = "storage_ledger"

    def __init__(self, backend: Any, outdir: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(outdir, *args, **kwargs)
        self.backend = backend

    def device_index(self) -> int:
        return 0  # the ledger's history is one address space

    def _begin(self) -> None:
        self.backend.start_history(self.max_entries, stacks=self.stacks != "none")

    def _take(self) -> dict[str, Any]:
        snapshot: dict[str, Any] = self.backend.history_snapshot()
        return snapshot

    def _end(self) -> None:
        self.backend.stop_history()


def snapshot_controller(
    backend: Any,
    outdir: str,
    *args: Any,
    **kwargs: Any,
) -> tuple[SnapshotController | None, str]:
    """The snapshot controller for ``backend`` (its own history when it logs one, else the
    CUDA allocator's) with ``SnapshotController``'s other arguments, or ``None`` and why
    (``''`` without a GPU: the configuration already warned that snapshots need one)."""
    if backend.capabilities.allocation_history:
        return LedgerSnapshotController(backend, outdir, *args, **kwargs), ""
    if not torch.cuda.is_available():
        return None, ""
    unsupported = cuda_history_unsupported()
    if unsupported is not None:
        return None, f"allocator snapshots off: {log_once(unsupported)}"
    return SnapshotController(outdir, *args, **kwargs), ""
