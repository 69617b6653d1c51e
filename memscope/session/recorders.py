"""A session's optional recorders: ``torch.profiler`` traces and allocator-history snapshots,
with each snapshot's side files (context markers, address owners) and its replay into the
trace as one ``allocator_timeline`` event."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from memscope.capture.profiling import ProfilerController, SnapshotController, snapshot_controller
from memscope.capture.safety import FailureLog
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.events.file_names import OOM_SNAPSHOT_NAME, SNAPSHOT_FINAL_NAME
from memscope.events.ownership import OwnershipIndex
from memscope.events.schema import ContextMarker
from memscope.io.atomic import atomic_write_json, atomic_write_text
from memscope.session.recording import Recording
from memscope.session.teardown import Teardown

#: What owns memory: the model chunks and the torch optimizers (read when a snapshot is taken).
Owners = Callable[[], tuple[Sequence[Any], Sequence[Any]]]


class Recorders:
    """The profiler and snapshot controllers of one rank (each only where configured)."""

    def __init__(self, config: RuntimeConfig, rank: int, failures: FailureLog) -> None:
        self.config = config
        self.rank = rank
        self.failures = failures
        self.profiler: ProfilerController | None = None
        self.snapshot: SnapshotController | None = None
        self.oom_snapshot: str | None = None  # its file name, once written
        self._tracer: MemoryTracer | None = None
        self._owners: Owners = lambda: ((), ())

    def start(
        self, directory: str, recording: Recording, owners: Owners, teardown: Teardown
    ) -> list[str]:
        """Start what the configuration asks for on this rank, over ``recording``'s backend
        and tracer; returns report warnings."""
        cfg, notes, backend = self.config, [], recording.backend
        self._tracer, self._owners = recording.tracer, owners
        if cfg.enable_profiler and self.rank in cfg.profiler_ranks:
            try:
                profiler = ProfilerController(cfg.profiler_schedule, directory)
                profiler.start()
            except Exception as exc:
                self.failures.record("profiler", exc)
            else:
                self.profiler = profiler
                teardown.push("profiler", profiler.stop)
        if cfg.enable_memory_snapshot and self.rank in cfg.snapshot_ranks:
            sched = cfg.snapshot_schedule
            self.snapshot, why_not = snapshot_controller(
                backend,
                directory,
                *(sched.wait, sched.active, cfg.snapshot_max_entries, cfg.snapshot_stacks),
                on_start=self.start_markers,
                on_dump=self.write_side_files,
            )
            if why_not:
                notes.append(why_not)
            if self.snapshot is not None:
                teardown.push("snapshot", self._stop_snapshot)
        return notes

    def on_step_start(self, step: int) -> None:
        if self.snapshot is not None:
            self.snapshot.on_step_start(step)

    def on_step_end(self, step: int) -> None:
        if self.profiler is not None:
            self.profiler.step()
        if self.snapshot is not None:
            self.snapshot.on_step_end(step)

    def start_markers(self) -> None:
        """Recording began: the tracer keeps context markers from now on."""
        if self._tracer is not None:
            self._tracer.start_markers(self.config.snapshot_max_entries)

    def write_side_files(self, snapshot_path: str, snapshot: dict[str, Any] | None = None) -> None:
        """Beside an allocator snapshot: the context markers recorded with it and who owns
        which addresses (``memscope analyze-snapshot`` joins the three); with the snapshot
        itself, its replay goes into the trace and the report (``allocator_timeline``). A
        failure is recorded once; the snapshot itself stays."""
        try:
            from memscope.capture.ownership import OwnershipRegistry
            from memscope.io.snapshot_reader import MARKERS_SUFFIX, OWNERS_SUFFIX

            stem = os.path.splitext(snapshot_path)[0]
            markers = self._tracer.take_markers() if self._tracer is not None else []
            atomic_write_text(
                stem + MARKERS_SUFFIX,
                "".join(json.dumps(m.to_dict()) + "\n" for m in markers),
            )
            chunks, optimizers = self._owners()
            registry = OwnershipRegistry(chunks, list(optimizers))
            atomic_write_json(
                stem + OWNERS_SUFFIX, {"ranges": [r.to_dict() for r in registry.ranges]}
            )
        except Exception as exc:
            self.failures.record("snapshot_side_files", exc)
            return
        if snapshot is not None and self._tracer is not None:
            try:
                self._record_timeline(snapshot_path, snapshot, registry.index, markers)
            except Exception as exc:
                self.failures.record("allocator_timeline", exc)

    def _record_timeline(
        self,
        snapshot_path: str,
        snapshot: dict[str, Any],
        owners: OwnershipIndex,
        markers: list[ContextMarker],
    ) -> None:
        """Replay the snapshot (host memory only, no device call) and emit the result: the
        peak, its composition and the active-memory timeline of the peak's step."""
        from memscope.analysis.active_memory import active_memory
        from memscope.analysis.allocator_timeline import peak_composition
        from memscope.analysis.lifetimes import idle_at_peak

        assert self._tracer is not None and self.snapshot is not None
        device = self.snapshot.device_index()
        peak = peak_composition(snapshot, device, owners, markers)
        step = None if peak.peak_marker is None else peak.peak_marker.step
        timeline = active_memory(snapshot, device, owners, markers, step)
        idle = idle_at_peak(snapshot, device, owners, markers)
        summary = peak.summary(
            os.path.basename(snapshot_path), self.snapshot.source, timeline, idle
        )
        self._tracer.record_timeline(summary, peak.composition)

    def _stop_snapshot(self) -> None:
        if self.snapshot is not None and self.snapshot.recording:
            self.snapshot.dump(SNAPSHOT_FINAL_NAME)
            self.snapshot.stop()

    def dump_oom_snapshot(self) -> None:
        """Keep the allocator history at an OOM (while recording)."""
        if self.snapshot is not None and self.snapshot.recording:
            path = self.snapshot.dump(OOM_SNAPSHOT_NAME)
            if path:
                self.oom_snapshot = os.path.basename(path)

    def artifacts(self, directory: str) -> dict[str, str]:
        """Profiler traces and snapshots written so far, relative to ``directory``."""
        out = {"oom_snapshot": self.oom_snapshot} if self.oom_snapshot else {}
        if self.profiler is not None:
            for i, path in enumerate(self.profiler.traces):
                out[f"profiler_trace_{i}"] = os.path.relpath(path, directory)
        if self.snapshot is not None:
            for i, path in enumerate(self.snapshot.snapshots):
                out.setdefault(f"memory_snapshot_{i}", os.path.basename(path))
        return out
