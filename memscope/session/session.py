"""``TracingSession``: one rank's memory tracing, framework-neutral.

A framework adapter (Megatron, a plain PyTorch loop) builds the session from its settings,
hands it the model chunks and torch optimizers, and calls the lifecycle::

    session = TracingSession(config, parallel, static_estimate=..., framework_metadata=...)
    session.attach_model(chunks); session.attach_optimizers(optimizers)
    session.start()
    for each step:
        session.step_start(step)
        ... forward and backward passes ...
        session.forward_backward_end()
        session.optimizer_step_start(); optimizer.step(); session.optimizer_step_end()
        session.step_end()
    session.finalize()          # re-entrant; removes everything start() installed

The session owns the backend, the tracer, the analyzers, the trace file, the profiler and
snapshot controllers, the crash guard and the report files. Everything :meth:`start` installs
is pushed on a :class:`~memscope.session.teardown.Teardown` and removed in reverse order.

Every public call is failure-isolated: an exception inside MemScope is logged once with its
reason, that part of tracing turns off, and training goes on unchanged.

Known limitations:

* One session per process is the supported use (the crash guard chains process-wide hooks).
* With the ``cuda`` backend a step's peak is exact only when it raises the run's high-water
  mark (the process-wide counter is left to the host), or while allocator history is recorded
  (the replay gives every recorded step's peak), or with ``--memscope-reset-peak-stats``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from memscope._version import __version__
from memscope.analysis.base import Analyzer
from memscope.analysis.job import rank_summary
from memscope.analysis.static_comparison import StaticEstimate
from memscope.capture.backends import BackendOptions, create_backend, resolve_backend_name
from memscope.capture.backends.base import MemoryBackend
from memscope.capture.category_policy import CategoryPolicy
from memscope.capture.hooks import HookSet
from memscope.capture.parallel import ParallelInfo
from memscope.capture.profiling import (
    LedgerSnapshotController,
    ProfilerController,
    SnapshotController,
)
from memscope.capture.safety import FailureLog, failure_row
from memscope.capture.torch_features import cuda_history_unsupported, log_once
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.events import schema as s
from memscope.events.ownership import OwnershipIndex
from memscope.events.schema import ContextMarker, EventConsumer
from memscope.events.trace_sink import BufferedTraceWriter, JsonlTraceSink
from memscope.events.trace_store import BoundedTraceStore
from memscope.io.atomic import atomic_write_json, atomic_write_text
from memscope.io.rank_folders import START_FAILURE_NAME, TRACE_NAME
from memscope.report.builder import ReportSettings, RunFacts, RuntimeReportBuilder
from memscope.reporters.markdown import render_runtime_markdown
from memscope.session.crash_guard import CrashGuard
from memscope.session.job_exchange import default_store, share_job_summary
from memscope.session.report_assembly import runtime_metadata, trace_writer_facts
from memscope.session.run_identity import (
    agreed_run_identity,
    claim_rank_dir,
    release_rank_dir,
    run_identity,
    touch_lock,
)
from memscope.session.state import ReportStatus, SessionState
from memscope.session.step_peaks import Sink, StepPeakBoard
from memscope.session.teardown import Teardown

logger = logging.getLogger("memscope")
F = TypeVar("F", bound=Callable[..., Any])

StaticEstimateProvider = Callable[[], dict[str, Any] | None]
NO_ESTIMATOR_REASON = "static estimation is off (static_estimate_provider=None)"
REPORT_JSON = "runtime_report.json"
REPORT_MD = "runtime_report.md"
OOM_REPORT_JSON = "oom_report.json"
OOM_REPORT_MD = "oom_report.md"
TRACE_JSONL = TRACE_NAME


#: Sites whose loss leaves the report complete: an extra reading each step row marks as
#: absent (``host_rss_end`` missing), not a gap in what was traced.
OPTIONAL_SITES = frozenset({"host_rss"})


def _isolated(site: str) -> Callable[[F], F]:
    """Run a training-loop callback only while tracing, and never let it raise."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(self: TracingSession, *args: Any, **kwargs: Any) -> Any:
            try:
                if self.state is not SessionState.TRACING or self.failures.is_disabled(site):
                    return None
                try:
                    return fn(self, *args, **kwargs)
                except Exception as exc:
                    self._failed(site, exc)
                    return None
            except Exception:  # the safety net itself failed: stay out of training's way
                return None

        return inner  # type: ignore[return-value]

    return wrap


def resolve_static_estimate(
    provider: StaticEstimateProvider | None, no_provider_reason: str = NO_ESTIMATOR_REASON
) -> StaticEstimate:
    """Ask ``provider`` once; a failing estimator is reported, never raised."""
    if provider is None:
        return StaticEstimate(None, no_provider_reason)
    try:
        estimate = provider()
    except ValueError as exc:  # a config the estimator does not model, said as such
        return StaticEstimate(None, f"no static estimate: {exc}")
    except Exception as exc:
        return StaticEstimate(None, f"the static estimator failed: {type(exc).__name__}: {exc}")
    if estimate is None:
        return StaticEstimate(None)
    return StaticEstimate(estimate)


class TracingSession:
    """Per-rank memory tracing: lifecycle, analyzers, reports and crash handling."""

    def __init__(
        self,
        config: RuntimeConfig,
        parallel: ParallelInfo,
        *,
        static_estimate: StaticEstimateProvider | None = None,
        no_estimate_reason: str = NO_ESTIMATOR_REASON,
        framework_metadata: Callable[[], dict[str, Any]] | None = None,
        training_settings: Callable[[], dict[str, Any]] | None = None,
        grad_attributes: Sequence[str] = ("grad",),
        dashboard_sink: Callable[[], Sink | None] | None = None,
    ) -> None:
        # never raises into training: a setting it can't use takes its default, said once
        self.config, put_back = config.settled()
        setting_notes = [*config.notes, *put_back]
        for note in put_back:
            warnings.warn(note, stacklevel=2)
        config = self.config
        self.parallel = parallel
        self.rank = parallel.rank
        self.static_estimate_provider = static_estimate
        self.no_estimate_reason = no_estimate_reason
        self._framework_metadata = framework_metadata or dict
        self._training_settings = training_settings
        self._grad_attributes = tuple(grad_attributes)
        self._dashboard_sink = dashboard_sink  # the training's writers, found at start
        self.step_peaks: StepPeakBoard | None = None
        self.report_dir = os.path.join(config.outdir, f"rank{self.rank:05d}")
        self.run = run_identity()
        self.start_error = ""
        self.backend_name = resolve_backend_name(config.backend)
        traced = config.enabled and config.traces_rank(self.rank)
        self.state = SessionState.IDLE if traced else SessionState.DISABLED
        self.status = ReportStatus.RUNNING
        self.status_reason = ""
        self._failure_recorded = False
        self._exception: BaseException | None = None
        self.failures = FailureLog(rank=self.rank)
        self.warnings: list[str] = list(setting_notes)
        self.artifacts: dict[str, str] = {}
        self.report_path: str | None = None
        self.job_summary_path: str | None = None
        self._summary: dict[str, Any] | None = None  # of the last report written
        self._job_shared = False
        self.chunks: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.backend: MemoryBackend | None = None
        self.tracer: MemoryTracer | None = None
        self.policy: CategoryPolicy | None = None
        self.analyzers: list[Analyzer] = []
        self.store: BoundedTraceStore | None = None
        self.hooks: HookSet | None = None
        self.profiler: ProfilerController | None = None
        self.snapshot: SnapshotController | None = None
        self.static: StaticEstimate | None = None
        self.hook_counts = {"modules_hooked": 0, "params_hooked": 0, "hook_handles_removed": 0}
        self._trace: BufferedTraceWriter | None = None
        self.report_builder: RuntimeReportBuilder | None = None
        self._teardown = Teardown()
        self._crash_guard = CrashGuard(
            self.record_exception, self._on_process_exit, self._on_cuda_oom
        )

    # -- state -----------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Whether this rank is traced at all."""
        return self.state is not SessionState.DISABLED

    @property
    def active(self) -> bool:
        """Whether tracing is running now."""
        return self.state is SessionState.TRACING

    # -- what to trace ---------------------------------------------------------------------
    def attach_model(self, chunks: Sequence[torch.nn.Module]) -> None:
        """The model chunks to hook (already unwrapped by the adapter). Never raises: a
        wrong argument is reported once and this rank is left untraced."""
        if self.state in (SessionState.DISABLED, SessionState.FINALIZED):
            return
        try:
            found = list(chunks)
            bad = [type(c).__name__ for c in found if not isinstance(c, torch.nn.Module)]
            if bad:
                raise TypeError(f"expected torch.nn.Module chunks, got {', '.join(bad)}")
            self.chunks = found
            if self.active:
                assert self.policy is not None
                self.policy.set_model(self.chunks)
                self._attach_hooks()
        except Exception as exc:
            self.abandon("attach_model", exc)

    def attach_optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """The torch optimizers whose state is ``optimizer_state`` (exact backends). Never
        raises: a failure is reported once and optimizer state goes uncategorised."""
        if self.state in (SessionState.DISABLED, SessionState.FINALIZED):
            return
        try:
            found = list(optimizers)
            bad = [type(o).__name__ for o in found if not isinstance(o, torch.optim.Optimizer)]
            if bad:
                raise TypeError(f"expected torch.optim.Optimizer, got {', '.join(bad)}")
            self.optimizers = found
            if self.active and self.policy is not None:
                self.policy.set_optimizers(self.optimizers)
        except Exception as exc:
            self._failed("attach_optimizer", exc)
            self.optimizers = []

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Begin tracing: backend, trace file, tracer, hooks, profiler, crash handlers.

        Never raises: if anything fails, everything installed so far is removed, the reason
        is logged once (``start_error``) and training goes on untraced. The first report is
        written before this returns, so a run killed at once still leaves one.
        """
        if self.state is not SessionState.IDLE:
            return
        self.state = SessionState.STARTING
        try:
            self._start()
        except Exception as exc:
            self.abandon("start", exc)
            self._leave_start_note()
            return
        self.state = SessionState.TRACING
        self.write_report()

    def on_stop(self, site: str, action: Callable[[], object]) -> None:
        """Run ``action`` when tracing stops, before what :meth:`start` installed is removed
        (a framework adapter's own instrumentation); a failure is recorded under ``site``."""
        assert self.state is SessionState.TRACING, "on_stop() belongs after start()"
        self._teardown.push(site, action)

    def abandon(self, site: str, exc: BaseException) -> None:
        """Give up tracing on this rank after ``exc`` at ``site``: log it once, remove
        everything installed, leave training untraced. Never raises."""
        try:
            self.start_error = f"{site}: {type(exc).__name__}: {exc}"
            self._failed(site, exc)
            if self.status is ReportStatus.RUNNING:
                self.status = ReportStatus.INCOMPLETE
                self.status_reason = f"tracing stopped at {site}: {type(exc).__name__}: {exc}"
            self.state = SessionState.STOPPING
            self._teardown.unwind(self._failed)
        except Exception:
            pass
        finally:
            self.state = SessionState.FINALIZED

    def _leave_start_note(self) -> None:
        """A rank that never started tracing leaves a small note saying why in its folder
        (``start_failure.json``), so the job view can tell it from one that never ran;
        where the folder itself can't be written the logged line is all there is."""
        try:
            atomic_write_json(
                os.path.join(self.report_dir, START_FAILURE_NAME),
                {
                    "schema_version": s.SCHEMA_VERSION,
                    "report_type": "start_failure",
                    "tool": {"name": "memscope", "version": __version__},
                    "rank": self.rank,
                    "world_size": self.parallel.world_size,
                    "run_id": self.run.run_id,
                    "reason": self.start_error,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        except Exception as exc:  # e.g. the output folder is not writable: logged once already
            logger.debug("memscope: no start note: %s", exc)

    def _start(self) -> None:
        cfg = self.config
        self.run, agreement_note = agreed_run_identity(default_store())
        if agreement_note:
            self.warnings.append(agreement_note)
        claim = claim_rank_dir(self.report_dir, self.run)
        self._teardown.push("rank_dir_lock", lambda: release_rank_dir(claim.directory))
        self.report_dir = claim.directory
        if claim.note:
            warnings.warn(claim.note, stacklevel=3)
            self.warnings.append(claim.note)
        self.warnings += cfg.warn_ignored(torch.cuda.is_available(), self.backend_name)
        self.static = resolve_static_estimate(
            self.static_estimate_provider, self.no_estimate_reason
        )
        backend = self.backend = create_backend(
            self.backend_name,
            BackendOptions(
                reset_peak_stats=cfg.reset_peak_stats,
                capacity_bytes=int(cfg.storage_capacity_mib * 2**20),
            ),
        )
        self.warnings += backend.notes  # what this torch lacks (each logged once)
        consumers: list[EventConsumer] = []
        self.report_builder = RuntimeReportBuilder(ReportSettings.from_config(cfg), self.static)
        self.store, self.analyzers = self.report_builder.store, self.report_builder.analyzers
        consumers += self.report_builder.consumers
        sink = self._open_trace_sink() if cfg.trace_jsonl else None
        if sink is not None:
            self._trace = BufferedTraceWriter(sink)
            self._teardown.push("trace_sink", self._trace.close)
            consumers.append(self._trace)
            self.artifacts["trace_jsonl"] = TRACE_JSONL
        self._teardown.push("final_report", self._write_final_report)
        backend.start()
        self._teardown.push("backend", backend.stop)
        self.policy = CategoryPolicy(backend.categorizer(), self._grad_attributes)
        self._teardown.push("saved_tensor_hooks", self.policy.pop_saved_hooks)
        self.tracer = MemoryTracer(
            cfg,
            backend,
            self.rank,
            consumers,
            policy=self.policy,
            failures=self.failures,
            pipeline_stage=self.parallel.pp_rank,
        )
        self.policy.set_model(self.chunks)
        self.policy.set_optimizers(self.optimizers)
        self.policy.adopt_untracked()  # whatever else predates start()
        self._teardown.push("remove_hooks", self._remove_hooks)
        self._attach_hooks()
        self._start_profiling()
        self._start_step_peaks()
        self._crash_guard.install()
        self._teardown.push("crash_guard", self._crash_guard.uninstall)

    def _start_step_peaks(self) -> None:
        """Share this rank's step peaks for the dashboards (see :mod:`.step_peaks`)."""
        cfg = self.config
        if not cfg.dashboard_peaks:
            return
        try:
            store = default_store()
            if store is None:
                return
            sink = self._dashboard_sink() if self._dashboard_sink is not None else None
            ranks = cfg.traced_ranks(self.parallel.world_size)
            board = StepPeakBoard(
                store, self.rank, ranks, sink, on_error=lambda e: self._failed("step_peaks", e)
            )
        except Exception as exc:
            self._failed("step_peaks", exc)
            return
        self.step_peaks = board
        self._teardown.push("step_peaks", board.close)

    def _open_trace_sink(self) -> JsonlTraceSink | None:
        """The streamed ``trace.jsonl``, or ``None`` (recorded once, the report still
        written) when it can't be opened, e.g. a symlink planted at its name."""
        try:
            return JsonlTraceSink(
                os.path.join(self.report_dir, TRACE_JSONL),
                self._trace_header(),
                max_bytes=self.config.trace_max_mib * 2**20,
            )
        except OSError as exc:
            self.failures.record("trace_sink", exc, disable=False)
            self.warnings.append(f"trace.jsonl not written: {exc}")
            return None

    def _trace_header(self) -> dict[str, Any]:
        """What ``memscope analyze`` needs to rebuild the report from the trace alone."""
        assert self.static is not None
        return {
            "rank": self.rank,
            "world_size": self.parallel.world_size,
            "tool_version": __version__,
            "run_id": self.run.run_id,
            "run_id_source": self.run.source,
            "start_time": self.run.start_time,
            "hostname": socket.gethostname(),
            "training": self._training_settings() if self._training_settings else None,
            "parallel": self.parallel.to_dict(),
            "backend": self.backend_name,
            "config": self.config.to_report_dict(),
            "static_estimate": self.static.to_dict(),
        }

    def _attach_hooks(self) -> None:
        if self.tracer is None or not self.chunks or self.hooks is not None:
            return
        self.hooks = HookSet(self.tracer)
        if self.config.hook_modules:
            self.hooks.attach_modules(self.chunks)
        if self.config.hook_param_grads:
            self.hooks.attach_params(self.chunks)
        self.hook_counts["modules_hooked"] = len(self.hooks.labels)
        self.hook_counts["params_hooked"] = len(self.hooks.param_names)

    def _remove_hooks(self) -> None:
        if self.hooks is not None:
            self.hook_counts["hook_handles_removed"] += self.hooks.remove()
            self.hooks = None

    def _start_profiling(self) -> None:
        cfg = self.config
        if cfg.enable_profiler and self.rank in cfg.profiler_ranks:
            try:
                profiler = ProfilerController(cfg.profiler_schedule, self.report_dir)
                profiler.start()
            except Exception as exc:
                self._failed("profiler", exc)
            else:
                self.profiler = profiler
                self._teardown.push("profiler", profiler.stop)
        assert self.backend is not None
        ledger = self.backend.capabilities.allocation_history
        wanted = cfg.enable_memory_snapshot and self.rank in cfg.snapshot_ranks
        unsupported = None if ledger or not wanted else cuda_history_unsupported()
        if unsupported is not None and torch.cuda.is_available():
            self.warnings.append(f"allocator snapshots off: {log_once(unsupported)}")
        elif wanted and (ledger or torch.cuda.is_available()):
            sched = cfg.snapshot_schedule
            schedule = (sched.wait, sched.active, cfg.snapshot_max_entries, cfg.snapshot_stacks)
            start, dump = self._start_snapshot_markers, self.write_snapshot_side_files
            self.snapshot = (
                LedgerSnapshotController(
                    self.backend, self.report_dir, *schedule, on_start=start, on_dump=dump
                )
                if ledger
                else SnapshotController(self.report_dir, *schedule, on_start=start, on_dump=dump)
            )
            self._teardown.push("snapshot", self._stop_snapshot)

    def _start_snapshot_markers(self) -> None:
        if self.tracer is not None:
            self.tracer.start_markers(self.config.snapshot_max_entries)

    def write_snapshot_side_files(
        self, snapshot_path: str, snapshot: dict[str, Any] | None = None
    ) -> None:
        """Beside an allocator snapshot: the context markers recorded with it and who owns
        which addresses (``memscope analyze-snapshot`` joins the three); with the snapshot
        itself, its replay goes into the trace and the report (``allocator_timeline``). A
        failure is reported once; the snapshot itself stays."""
        try:
            from memscope.capture.ownership import OwnershipRegistry
            from memscope.io.snapshot_reader import MARKERS_SUFFIX, OWNERS_SUFFIX

            stem = os.path.splitext(snapshot_path)[0]
            markers = self.tracer.take_markers() if self.tracer is not None else []
            atomic_write_text(
                stem + MARKERS_SUFFIX,
                "".join(json.dumps(m.to_dict()) + "\n" for m in markers),
            )
            registry = OwnershipRegistry(self.chunks, self.optimizers)
            atomic_write_json(
                stem + OWNERS_SUFFIX, {"ranges": [r.to_dict() for r in registry.ranges]}
            )
        except Exception as exc:
            self._failed("snapshot_side_files", exc)
            return
        if snapshot is not None and self.tracer is not None:
            try:
                self._record_timeline(snapshot_path, snapshot, registry.index, markers)
            except Exception as exc:
                self._failed("allocator_timeline", exc)

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

        assert self.tracer is not None and self.snapshot is not None
        device = torch.cuda.current_device() if self.snapshot.source == "cuda_allocator" else 0
        peak = peak_composition(snapshot, device, owners, markers)
        step = None if peak.peak_marker is None else peak.peak_marker.step
        timeline = active_memory(snapshot, device, owners, markers, step)
        idle = idle_at_peak(snapshot, device, owners, markers)
        summary = peak.summary(
            os.path.basename(snapshot_path), self.snapshot.source, timeline, idle
        )
        self.tracer.record_timeline(summary, peak.composition)

    def _stop_snapshot(self) -> None:
        if self.snapshot is not None and self.snapshot.recording:
            self.snapshot.dump("memory_snapshot_final.pickle")
            self.snapshot.stop()

    def finalize(self) -> None:
        """Stop tracing, remove everything start() installed, write the final report.

        Re-entrant: a second call (or one from a signal handler while the first runs) returns
        at once. Never raises.
        """
        if self.state is SessionState.IDLE:
            self.state = SessionState.FINALIZED
        if self.state is not SessionState.TRACING:
            return
        if self.status is ReportStatus.RUNNING:
            off = self._parts_turned_off()
            if off:  # a callback or hook family that turned itself off left gaps
                self.status, self.status_reason = ReportStatus.INCOMPLETE, off
            else:
                self.status = ReportStatus.COMPLETE
        self._shutdown()

    def _parts_turned_off(self) -> str:
        """'' when every part of tracing ran to the end; else which turned itself off after
        a failure (a callback, a hook family, a sampler), each with its first reason."""
        off = [
            f"{site} ({self.failures.sites[site]['first_error']})"
            if site in self.failures.sites
            else site
            for site in sorted(self.failures.disabled - OPTIONAL_SITES)
        ]
        if not off:
            return ""
        return "parts of tracing turned themselves off after a failure: " + "; ".join(off)

    def _shutdown(self) -> None:
        self.state = SessionState.STOPPING
        try:
            self._teardown.unwind(self._failed)
        finally:
            self.state = SessionState.FINALIZED

    def _write_final_report(self) -> None:
        if self.state is SessionState.STOPPING:
            self.write_report()
            self._share_job_summary()

    def _share_job_summary(self) -> None:
        """Send this rank's summary towards ``job_summary.json`` (once: at the end, or at the
        failure that ends the run); a failure is reported once and changes nothing else."""
        cfg = self.config
        if not cfg.job_summary or self._summary is None or self._job_shared:
            return
        self._job_shared = True
        world = self.parallel.world_size
        try:
            path = share_job_summary(
                self._summary,
                rank=self.rank,
                world_size=world,
                expected=cfg.traced_ranks(world),
                outdir=cfg.outdir,
                run_id=self.run.run_id,
                start_time=self.run.start_time,
                timeout_s=cfg.job_summary_timeout,
            )
        except Exception as exc:
            self._failed("job_summary", exc)
            return
        if path is not None:
            self.job_summary_path = path
            logger.info("memscope rank %d: wrote %s", self.rank, path)

    # -- training-loop callbacks -----------------------------------------------------------
    @_isolated("on_train_step_start")
    def step_start(self, step: int, notes: str = "") -> None:
        """Before the step's forward-backward passes; opens the step's high-water window."""
        assert self.tracer is not None
        try:
            number = int(step)
        except (TypeError, ValueError, OverflowError) as exc:  # only the step number is lost
            self.failures.record("step_argument", exc, disable=False)
            number = self.tracer.step + 1
        if self.snapshot is not None:
            self.snapshot.on_step_start(number)
        self.tracer.step_start(number, notes)

    @_isolated("on_forward_backward_end")
    def forward_backward_end(self, notes: str = "") -> None:
        """Right after the forward-backward passes."""
        assert self.tracer is not None
        self.tracer.phase_end(s.PHASE_FORWARD_BACKWARD, s.PHASE_PRE_OPTIMIZER, notes)

    @_isolated("on_optimizer_step_start")
    def optimizer_step_start(self, notes: str = "") -> None:
        """Just before ``optimizer.step()``."""
        assert self.tracer is not None
        self.tracer.phase_end(s.PHASE_PRE_OPTIMIZER, s.PHASE_OPTIMIZER, notes)

    @_isolated("on_optimizer_step_end")
    def optimizer_step_end(self, notes: str = "") -> None:
        """Just after ``optimizer.step()``."""
        assert self.tracer is not None
        self.tracer.phase_end(s.PHASE_OPTIMIZER, s.PHASE_STEP, notes)

    @_isolated("on_train_step_end")
    def step_end(self, notes: str = "") -> None:
        """On every way out of a training step; writes the report every ``report_interval``."""
        assert self.tracer is not None
        tracer = self.tracer
        tracer.step_end(notes)
        if self.step_peaks is not None:
            self.step_peaks.publish(tracer.step, tracer.last_step_peak)
        self._flush_trace()
        if self.profiler is not None:
            self.profiler.step()
        if self.snapshot is not None:
            self.snapshot.on_step_end(tracer.step)
        interval = self.config.report_interval
        if interval and tracer.steps_completed % interval == 0:
            self.write_report()

    # -- failures and crash paths ----------------------------------------------------------
    def _failed(self, site: str, exc: BaseException) -> None:
        self.failures.record(site, exc)

    def _flush_trace(self) -> None:
        """Write buffered events to trace.jsonl; a failure (full disk...) is reported and
        retried at the next flush, and never stops the report from being written."""
        if self._trace is None:
            return
        try:
            self._trace.flush()
        except Exception as exc:
            self.failures.record("trace_sink", exc, disable=False)

    def record_exception(self, exc: BaseException) -> None:
        """A training failure (OOM or other): mark the report and write what was recorded.
        The same exception reported again (by an outer handler) changes nothing."""
        if not self.active or exc is self._exception:
            return
        self._exception = exc
        try:
            is_oom = isinstance(exc, torch.OutOfMemoryError)
            self.status = ReportStatus.OOM if is_oom else ReportStatus.CRASHED
            self.status_reason = f"{type(exc).__name__}: {exc}"[:2000]
            self._record_failure(is_oom)
            if is_oom:
                self._dump_oom_snapshot()
            self.write_report()
            self._share_job_summary()
        except Exception as inner:
            logger.warning(
                "memscope rank %d: could not write the crash report: %s", self.rank, inner
            )

    def _on_process_exit(self, reason: str) -> None:
        """atexit / SIGTERM: close tracing and write what was recorded, marked incomplete."""
        if self.active:
            if self.status is ReportStatus.RUNNING:
                self.status, self.status_reason = ReportStatus.INCOMPLETE, reason
            self._shutdown()

    def _on_cuda_oom(self, reason: str) -> None:
        self.status, self.status_reason = ReportStatus.OOM, reason
        self._record_failure(oom=True)
        self._dump_oom_snapshot()
        self.write_report()

    def _write_oom_report(self, report: dict[str, Any]) -> None:
        """``oom_report.json`` and ``.md`` beside the runtime report (see analysis/oom.py)."""
        from memscope.reporters.oom_report import oom_document, render_oom_markdown

        doc = oom_document(report)
        atomic_write_json(os.path.join(self.report_dir, OOM_REPORT_JSON), doc)
        atomic_write_text(os.path.join(self.report_dir, OOM_REPORT_MD), render_oom_markdown(doc))
        self.artifacts["oom_report"] = OOM_REPORT_JSON

    def _record_failure(self, oom: bool) -> None:
        """The failure as an event in the trace (once: the allocator's OOM observer fires
        before the exception reaches the excepthook)."""
        if self._failure_recorded or self.tracer is None:
            return
        self._failure_recorded = True
        try:
            self.tracer.record_failure(oom, self.status_reason)
        except Exception as exc:
            self._failed("failure_event", exc)

    def _dump_oom_snapshot(self) -> None:
        if self.snapshot is not None and self.snapshot.recording:
            path = self.snapshot.dump("oom_snapshot.pickle")
            if path:
                self.artifacts["oom_snapshot"] = os.path.basename(path)

    # -- reports ---------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """Typed facts about this rank and run."""
        return runtime_metadata(
            parallel=self.parallel,
            config=self.config,
            backend_name=self.backend_name,
            backend=self.backend,
            tracer=self.tracer,
            hook_counts=self.hook_counts,
            framework=self._framework_metadata(),
            run=self.run,
        )

    def build_report(self) -> dict[str, Any]:
        """The current runtime report as a dict (what :meth:`write_report` writes)."""
        assert self.tracer is not None and self.report_builder is not None
        errors = self.failures.to_list()
        if self.backend is not None and self.backend.error:
            errors.append(failure_row(f"{self.backend.name}_backend", self.backend.error))
        artifacts = self._artifact_list()
        return self.report_builder.build(
            RunFacts(
                metadata=self.metadata(),
                training=self._training_settings() if self._training_settings else None,
                status=self.status.value,
                status_reason=self.status_reason,
                events_recorded=self.tracer.events_emitted,
                jsonl=artifacts.get("trace_jsonl"),
                trace=trace_writer_facts(self._trace),
                errors=errors,
                warnings=list(self.warnings),
                artifacts=artifacts,
            )
        )

    def _artifact_list(self) -> dict[str, str]:
        out = dict(self.artifacts)
        if self.profiler is not None:
            for i, path in enumerate(self.profiler.traces):
                out[f"profiler_trace_{i}"] = os.path.relpath(path, self.report_dir)
        if self.snapshot is not None:
            for i, path in enumerate(self.snapshot.snapshots):
                out.setdefault(f"memory_snapshot_{i}", os.path.basename(path))
        return {
            name: rel
            for name, rel in out.items()
            if os.path.exists(os.path.join(self.report_dir, rel))
        }

    def write_report(self) -> str | None:
        """Write ``runtime_report.json`` and ``.md`` atomically; returns the JSON path."""
        if self.tracer is None or self.state not in (SessionState.TRACING, SessionState.STOPPING):
            return None
        self._flush_trace()
        try:
            report = self.build_report()
            self._summary = rank_summary(report)
            path = os.path.join(self.report_dir, REPORT_JSON)
            atomic_write_json(path, report)
            atomic_write_text(
                os.path.join(self.report_dir, REPORT_MD), render_runtime_markdown(report)
            )
            if report.get("oom"):
                self._write_oom_report(report)
            self.report_path = path
            touch_lock(self.report_dir)
            return path
        except Exception as exc:  # retried at the next interval and at finalize
            self.failures.record("write_report", exc, disable=False)
            return None
