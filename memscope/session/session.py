"""``TracingSession``: one rank's memory tracing, framework-neutral.

A framework adapter (Megatron, a plain PyTorch loop) builds the session from its settings,
hands it the model chunks and torch optimizers, and calls the lifecycle::

    session = TracingSession(config, parallel, AdapterFacts(static_estimate=..., ...))
    session.attach_model(chunks); session.attach_optimizers(optimizers)
    session.start()
    for each step:
        session.step_start(step)
        ... forward and backward passes ...
        session.forward_backward_end()
        session.optimizer_step_start(); optimizer.step(); session.optimizer_step_end()
        session.step_end()
    session.finalize()          # re-entrant; removes everything start() installed

The session is the lifecycle: its state, the teardown stack, failure isolation and the
report's status. The rest is done by parts, each a small class or module with one job:

* :mod:`.run_identity`: which run this is, and the rank folder claimed for it;
* :mod:`.recording`: the backend, the analyzers, the trace file and the tracer;
* :mod:`.report_source` and :mod:`.writers`: the report, and its files (written atomically);
* :mod:`.model_hooks`: the hooks on the model chunks;
* :mod:`.recorders`: the profiler and allocator snapshots (with their replay);
* :mod:`.step_peaks`: every rank's step peaks on the training's dashboards;
* :mod:`.job_exchange`: this rank's summary sent towards ``job_summary.json``;
* :mod:`.crash_guard`: excepthook, atexit, SIGTERM and the CUDA OOM observer;
* :mod:`.adapter_facts`: what the framework adapter tells the session.

Everything :meth:`start` installs is pushed on a :class:`~memscope.session.teardown.Teardown`
and removed in reverse order. Every public call is failure-isolated: an exception inside
MemScope is recorded once with its reason, that part of tracing turns off, and training goes
on unchanged.

Known limitations:

* One session per process is the supported use (the crash guard chains process-wide hooks).
* With the ``cuda`` backend a step's peak is exact only when it raises the run's high-water
  mark (the process-wide counter is left to the host), or while allocator history is recorded
  (the replay gives every recorded step's peak), or with ``--memscope-reset-peak-stats``.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from memscope.capture.backends import resolve_backend_name
from memscope.capture.device import accelerator_available
from memscope.capture.parallel import ParallelInfo
from memscope.capture.safety import FailureLog
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.events import schema as s
from memscope.events.file_names import rank_folder_name
from memscope.session.adapter_facts import AdapterFacts
from memscope.session.crash_guard import CrashGuard
from memscope.session.job_exchange import JobSummaryShare
from memscope.session.model_hooks import ModelHooks
from memscope.session.recorders import Recorders
from memscope.session.recording import Recording
from memscope.session.report_source import build_session_report
from memscope.session.run_identity import claim_run_folder, run_identity
from memscope.session.state import ReportStatus, SessionState, final_status
from memscope.session.step_peaks import StepPeakBoard, open_step_peaks
from memscope.session.teardown import Teardown
from memscope.session.writers import ReportFiles

logger = logging.getLogger("memscope")
F = TypeVar("F", bound=Callable[..., Any])


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
                    self.failures.record(site, exc)
                    return None
            except Exception:  # the safety net itself failed: stay out of training's way
                return None

        return inner  # type: ignore[return-value]

    return wrap


def _checked(items: Sequence[Any], kind: type, what: str) -> list[Any]:
    """``items`` as a list, or ``TypeError`` naming the ones that are not ``kind``."""
    found = list(items)
    bad = [type(x).__name__ for x in found if not isinstance(x, kind)]
    if bad:
        raise TypeError(f"expected {what}, got {', '.join(bad)}")
    return found


def _step_number(step: Any, fallback: int, failures: FailureLog) -> int:
    """``step`` as an int; a value that is none is recorded (only the number is lost)."""
    try:
        return int(step)
    except (TypeError, ValueError, OverflowError) as exc:
        failures.record("step_argument", exc, disable=False)
        return fallback


class TracingSession:
    """Per-rank memory tracing: the lifecycle, with its parts (see the module docstring)."""

    def __init__(
        self, config: RuntimeConfig, parallel: ParallelInfo, adapter: AdapterFacts | None = None
    ) -> None:
        # never raises into training: a setting it can't use takes its default, said once
        self.config, put_back = config.settled()
        for note in put_back:
            warnings.warn(note, stacklevel=2)
        self.warnings: list[str] = [*config.notes, *put_back]
        cfg, self.parallel, self.rank = self.config, parallel, parallel.rank
        self.adapter = adapter or AdapterFacts()
        self.run = run_identity()
        self.backend_name = resolve_backend_name(cfg.backend)
        traced = cfg.enabled and cfg.traces_rank(self.rank)
        self.state = SessionState.IDLE if traced else SessionState.DISABLED
        self.status, self.status_reason, self.start_error = ReportStatus.RUNNING, "", ""
        self.failures = FailureLog(rank=self.rank)
        self.chunks: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self._teardown = Teardown()
        self.files = ReportFiles(
            os.path.join(cfg.outdir, rank_folder_name(self.rank)), self.failures
        )
        self.model_hooks = ModelHooks(cfg, self.failures)
        self.hook_counts = self.model_hooks.counts
        self.recorders = Recorders(cfg, self.rank, self.failures)
        self.job = JobSummaryShare(cfg, self.rank, parallel.world_size, self.failures)
        self.recording: Recording | None = None  # built by start()
        self.tracer: MemoryTracer | None = None  # the recording's, once started
        self.step_peaks: StepPeakBoard | None = None
        self._crash_guard = CrashGuard(self._on_failure, self._on_process_exit)

    @property
    def enabled(self) -> bool:
        """Whether this rank is traced at all."""
        return self.state is not SessionState.DISABLED

    @property
    def active(self) -> bool:
        """Whether tracing is running now."""
        return self.state is SessionState.TRACING

    @property
    def report_dir(self) -> str:
        """This rank's folder (another one when a live run holds the usual one)."""
        return self.files.directory

    @property
    def report_path(self) -> str | None:
        """The last report written, if any."""
        return self.files.path

    # -- what to trace ---------------------------------------------------------------------
    def attach_model(self, chunks: Sequence[torch.nn.Module]) -> None:
        """The model chunks to hook (already unwrapped by the adapter). Never raises: a
        wrong argument is reported once and this rank is left untraced."""
        if self.state in (SessionState.DISABLED, SessionState.FINALIZED):
            return
        try:
            self.chunks = _checked(chunks, torch.nn.Module, "torch.nn.Module chunks")
            if self.active and self.recording is not None and self.recording.policy is not None:
                self.recording.policy.set_model(self.chunks)
                self.model_hooks.attach(self.tracer, self.chunks)
        except Exception as exc:
            self.abandon("attach_model", exc)

    def attach_optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """The torch optimizers whose state is ``optimizer_state`` (exact backends). Never
        raises: a failure is reported once and optimizer state goes uncategorised."""
        if self.state in (SessionState.DISABLED, SessionState.FINALIZED):
            return
        try:
            self.optimizers = _checked(optimizers, torch.optim.Optimizer, "torch.optim.Optimizer")
            if self.active and self.recording is not None and self.recording.policy is not None:
                self.recording.policy.set_optimizers(self.optimizers)
        except Exception as exc:
            self.failures.record("attach_optimizer", exc)
            self.optimizers = []

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Begin tracing. Never raises: if anything fails, everything installed so far is
        removed, the reason is recorded once (``start_error``) and training goes on untraced.
        The first report is written before this returns (a run killed at once leaves one)."""
        if self.state is not SessionState.IDLE:
            return
        self.state = SessionState.STARTING
        try:
            self._start()
        except Exception as exc:
            self.abandon("start", exc)
            self.files.leave_start_note(self.parallel, self.run, self.start_error)
            return
        self.state = SessionState.TRACING
        self.write_report()

    def _start(self) -> None:
        """Install every part, each with its undo action on the teardown stack."""
        cfg, teardown, failures = self.config, self._teardown, self.failures
        self.run, self.files.directory, notes = claim_run_folder(self.report_dir, teardown)
        self.warnings += notes + cfg.warn_ignored(accelerator_available(), self.backend_name)
        rec = self.recording = Recording.prepare(
            cfg, failures, self.backend_name, self.adapter.estimate()
        )
        self.warnings += rec.backend.notes  # what this torch lacks (each logged once)
        training = self.adapter.training()
        self.warnings += rec.open_trace(
            self.report_dir, self.parallel, self.run, training, teardown
        )
        teardown.push("final_report", self._write_final_report)
        grads, model = self.adapter.grad_attributes, (self.chunks, self.optimizers)
        tracer = self.tracer = rec.start(self.rank, self.parallel.pp_rank, grads, model, teardown)
        teardown.push("remove_hooks", self.model_hooks.remove)
        self.model_hooks.attach(tracer, self.chunks)
        owners = lambda: (self.chunks, self.optimizers)  # noqa: E731 - read at each snapshot
        self.warnings += self.recorders.start(self.report_dir, rec, owners, teardown)
        on_error = functools.partial(failures.record, "step_peaks")
        sink, world = self.adapter.dashboard_sink, self.parallel.world_size
        self.step_peaks = open_step_peaks(cfg, self.rank, world, sink, teardown, on_error)
        self._crash_guard.install()
        teardown.push("crash_guard", self._crash_guard.uninstall)

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
            self.failures.record(site, exc)
            if self.status is ReportStatus.RUNNING:
                self.status = ReportStatus.INCOMPLETE
                self.status_reason = f"tracing stopped at {self.start_error}"
            self._shutdown()
        except Exception:
            self.state = SessionState.FINALIZED

    def finalize(self) -> None:
        """Stop tracing, remove everything start() installed, write the final report.
        Re-entrant: a second call (or one from a signal handler while the first runs)
        returns at once. Never raises."""
        if self.state is SessionState.IDLE:
            self.state = SessionState.FINALIZED
        if self.state is SessionState.TRACING:
            self.status, self.status_reason = final_status(
                self.status, self.status_reason, self.failures
            )
            self._shutdown()

    def _shutdown(self) -> None:
        self.state = SessionState.STOPPING
        try:
            self._teardown.unwind(self.failures.record)
        finally:
            self.state = SessionState.FINALIZED

    def _write_final_report(self) -> None:
        if self.state is SessionState.STOPPING:
            self.write_report()
            self.job.share(self.files.summary, self.run.run_id, self.run.start_time)

    # -- training-loop callbacks -----------------------------------------------------------
    @_isolated("on_train_step_start")
    def step_start(self, step: int, notes: str = "") -> None:
        """Before the step's forward-backward passes; opens the step's high-water window."""
        assert self.tracer is not None
        number = _step_number(step, self.tracer.step + 1, self.failures)
        self.recorders.on_step_start(number)
        self.model_hooks.follow_window(self.tracer.step_start(number, notes))

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
        rec = self.recording
        assert rec is not None and rec.tracer is not None
        tracer = rec.tracer
        tracer.step_end(notes)
        if self.step_peaks is not None:
            self.step_peaks.publish(tracer.step, tracer.last_step_peak)
        rec.flush_trace()
        self.recorders.on_step_end(tracer.step)
        interval = self.config.report_interval
        if interval and tracer.steps_completed % interval == 0:
            self.write_report()

    # -- failures and crash paths ----------------------------------------------------------
    def record_exception(self, exc: BaseException) -> None:
        """A training failure (OOM or other): mark the report and write what was recorded.
        The same exception reported again (by an outer handler) changes nothing."""
        if self.active:
            self._crash_guard.record(exc)

    def _on_failure(self, oom: bool, reason: str, final: bool) -> None:
        """Mark the report (OOM or crashed), put the failure in the trace, keep an OOM's
        allocator history, write the report; ``final``: send the job summary too."""
        if not self.active:
            return
        self.status = ReportStatus.OOM if oom else ReportStatus.CRASHED
        self.status_reason = reason
        if self.recording is not None:
            self.recording.record_failure(oom, reason)
        if oom:
            self.recorders.dump_oom_snapshot()
        self.write_report()
        if final:
            self.job.share(self.files.summary, self.run.run_id, self.run.start_time)

    def _on_process_exit(self, reason: str) -> None:
        """atexit / SIGTERM: close tracing and write what was recorded, marked incomplete."""
        if self.active:
            if self.status is ReportStatus.RUNNING:
                self.status, self.status_reason = ReportStatus.INCOMPLETE, reason
            self._shutdown()

    # -- reports ---------------------------------------------------------------------------
    def build_report(self) -> dict[str, Any]:
        """The current runtime report as a dict (what :meth:`write_report` writes)."""
        return build_session_report(self)

    def write_report(self) -> str | None:
        """Write ``runtime_report.json`` and ``.md`` atomically; returns the JSON path."""
        if self.tracer is None or self.state not in (SessionState.TRACING, SessionState.STOPPING):
            return None
        assert self.recording is not None
        self.recording.flush_trace()
        return self.files.write(self.build_report)
