"""``MemScopeMegatronRuntime``: the per-rank tracer wired into a Megatron training loop.

Lifecycle (the order FlagScale's and Megatron-LM's patched ``train()`` use)::

    runtime = MemScopeMegatronRuntime.from_megatron_args(args)
    runtime.attach_model(model)          # list of chunks or one module; wrappers unwrapped
    runtime.attach_optimizer(optimizer)  # optional: exact optimizer-state categorisation
    runtime.start()
    for each step:
        runtime.on_train_step_start(step)
        ... forward_backward_func(...)
        runtime.on_forward_backward_end(losses)
        runtime.on_optimizer_step_start(); optimizer.step(); runtime.on_optimizer_step_end()
        runtime.on_train_step_end(losses)
    runtime.finalize()                   # idempotent; removes every hook it added

Every callback is failure-isolated: an exception inside MemScope is logged once with its
reason, that part of tracing turns off, and training goes on unchanged.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from memscope._version import __version__
from memscope.capture.backends import create_backend, resolve_backend_name
from memscope.capture.backends.base import MemoryBackend
from memscope.capture.backends.storage import StorageLedgerBackend
from memscope.capture.categorize import mark_grads, mark_model_state, mark_optimizer_state
from memscope.capture.hooks import HookSet, unwrap_module
from memscope.capture.parallel import discover_parallel_info
from memscope.capture.profiling import ProfilerController, SnapshotController
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.events import schema as s
from memscope.events.trace_sink import JsonlTraceSink
from memscope.integrations.megatron.crash_guard import CrashGuard
from memscope.integrations.megatron.report_assembly import (
    StaticEstimate,
    StaticEstimateProvider,
    default_static_estimate,
    report_inputs,
    runtime_metadata,
    static_estimate,
)
from memscope.io.atomic import atomic_write_json, atomic_write_text
from memscope.reporters.markdown import render_runtime_markdown
from memscope.reporters.runtime_json import build_runtime_report

logger = logging.getLogger("memscope")
F = TypeVar("F", bound=Callable[..., Any])


def _isolated(site: str) -> Callable[[F], F]:
    """Run a public callback only while tracing is on, and never let it raise."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(self: MemScopeMegatronRuntime, *args: Any, **kwargs: Any) -> Any:
            if not self.active or (
                self.tracer is not None and self.tracer.failures.is_disabled(site)
            ):
                return None
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                self._failed(site, exc)
                return None

        return inner  # type: ignore[return-value]

    return wrap


class MemScopeMegatronRuntime:
    """Per-rank memory tracer for Megatron / FlagScale training loops."""

    def __init__(
        self,
        config: RuntimeConfig,
        args: Any = None,
        static_estimate_provider: StaticEstimateProvider | None = default_static_estimate,
    ) -> None:
        self.config = config.validate()
        self.args = args
        self.static_estimate_provider = static_estimate_provider
        self._static: StaticEstimate | None = None  # see _static_estimate()
        self.parallel = discover_parallel_info(args)
        self.rank = self.parallel.rank
        self.enabled = config.enabled and config.traces_rank(self.rank)
        self.active = False
        self.finalized = False
        self.report_dir = os.path.join(config.outdir, f"rank{self.rank:05d}")
        self.backend_name = resolve_backend_name(config.backend)
        self.tracer: MemoryTracer | None = None
        self.backend: MemoryBackend | None = None
        self.hooks: HookSet | None = None
        self.chunks: list[torch.nn.Module] = []
        self.optimizer: Any = None
        self.profiler: ProfilerController | None = None
        self.snapshot: SnapshotController | None = None
        self.warnings: list[str] = []
        self.artifacts: dict[str, str] = {}
        self.hook_handles_removed = 0
        self.modules_hooked = 0
        self.params_hooked = 0
        self.report_path: str | None = None
        self._status = "running"
        self._status_reason = ""
        self._sink: JsonlTraceSink | None = None
        self._crash_guard = CrashGuard(self.on_exception, self._on_process_exit, self._on_cuda_oom)
        self._startup_failures: list[dict[str, Any]] = []

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_megatron_args(cls, args: Any, **kwargs: Any) -> MemScopeMegatronRuntime:
        """Build from Megatron's parsed args (see :func:`add_memscope_args`)."""
        return cls(RuntimeConfig.from_megatron_args(args), args=args, **kwargs)

    def attach_model(self, model: torch.nn.Module | list[torch.nn.Module]) -> None:
        """Hook a module or Megatron's list of model chunks (every virtual stage)."""
        if not self.enabled:
            return
        chunks = list(model) if isinstance(model, (list, tuple)) else [model]
        self.chunks = [unwrap_module(c) for c in chunks]
        if self.active:
            self._attach_hooks()

    def attach_optimizer(self, optimizer: Any) -> None:
        """Optional: lets the exact backend classify optimizer state and master weights."""
        if self.enabled:
            self.optimizer = optimizer
            if self.active:
                self._mark_optimizer()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Begin tracing: backend, hooks, trace file, profiler, crash handlers."""
        if not self.enabled or self.active or self.finalized:
            return
        os.makedirs(self.report_dir, exist_ok=True)
        self.warnings += self.config.warn_ignored(torch.cuda.is_available(), self.backend_name)
        self.backend = create_backend(self.backend_name)
        try:
            self._start_tracing()
        except BaseException:
            # Leave nothing behind: no dispatch mode, no hooks, no open file.
            self.active = False
            self._remove_hooks()
            self.backend.stop()
            if self._sink is not None:
                self._sink.close()
            raise

    def _start_tracing(self) -> None:
        assert self.backend is not None
        if self.config.trace_jsonl:
            self._sink = JsonlTraceSink(
                os.path.join(self.report_dir, "trace.jsonl"),
                {
                    "rank": self.rank,
                    "world_size": self.parallel.world_size,
                    "tool_version": __version__,
                },
            )
            self.artifacts["trace_jsonl"] = "trace.jsonl"
        self.backend.start()
        self.tracer = MemoryTracer(
            self.config, self.backend, self.rank, self.parallel.pp_rank, self._sink
        )
        self.active = True
        ledger = self._ledger
        if ledger is not None:
            mark_model_state(ledger, self.chunks)
            self._mark_optimizer()
            ledger.adopt_existing(s.CAT_OTHER)  # whatever else predates start()
        self._attach_hooks()
        self._start_profiling()
        self._crash_guard.install()

    def _attach_hooks(self) -> None:
        if self.tracer is None or not self.chunks or self.hooks is not None:
            return
        self.hooks = HookSet(self.tracer)
        if self.config.hook_modules:
            self.hooks.attach_modules(self.chunks)
        if self.config.hook_param_grads:
            self.hooks.attach_params(self.chunks)
        self.modules_hooked = len(self.hooks.labels)
        self.params_hooked = len(self.hooks.param_names)

    def _start_profiling(self) -> None:
        cfg = self.config
        if cfg.enable_profiler and self.rank in cfg.profiler_ranks:
            try:
                self.profiler = ProfilerController(cfg.profiler_schedule, self.report_dir)
                self.profiler.start()
            except Exception as exc:
                self.profiler = None
                self._failed("profiler", exc)
        if (
            cfg.enable_memory_snapshot
            and self.rank in cfg.snapshot_ranks
            and torch.cuda.is_available()
        ):
            sched = cfg.snapshot_schedule
            self.snapshot = SnapshotController(
                self.report_dir,
                sched.wait,
                sched.active,
                cfg.snapshot_max_entries,
                cfg.snapshot_stacks,
            )

    # -- training-loop callbacks -----------------------------------------------------------
    @_isolated("on_train_step_start")
    def on_train_step_start(self, step: int, batch: Any = None, notes: str = "") -> None:
        """Call before ``forward_backward_func``; resets the step's high-water mark."""
        assert self.tracer is not None
        if self.snapshot is not None:
            self.snapshot.on_step_start(step)
        self._mark_grads()
        self.tracer.step_start(int(step), notes)

    @_isolated("on_forward_backward_end")
    def on_forward_backward_end(self, outputs: Any = None, notes: str = "") -> None:
        """Call right after ``forward_backward_func`` returns."""
        assert self.tracer is not None
        self._mark_grads()
        self.tracer.phase_end(s.PHASE_FORWARD_BACKWARD, s.PHASE_PRE_OPTIMIZER, notes)

    @_isolated("on_optimizer_step_start")
    def on_optimizer_step_start(self, notes: str = "") -> None:
        """Call just before ``optimizer.step()``."""
        assert self.tracer is not None
        self.tracer.phase_end(s.PHASE_PRE_OPTIMIZER, s.PHASE_OPTIMIZER, notes)

    @_isolated("on_optimizer_step_end")
    def on_optimizer_step_end(self, notes: str = "") -> None:
        """Call just after ``optimizer.step()``."""
        assert self.tracer is not None
        self._mark_optimizer()
        self.tracer.phase_end(s.PHASE_OPTIMIZER, s.PHASE_STEP, notes)

    @_isolated("on_train_step_end")
    def on_train_step_end(self, outputs: Any = None, notes: str = "") -> None:
        """Call on every return path of ``train_step``."""
        assert self.tracer is not None
        tracer = self.tracer
        tracer.step_end(notes)
        if self.profiler is not None:
            self.profiler.step()
        if self.snapshot is not None:
            self.snapshot.on_step_end(tracer.step)
        interval = self.config.report_interval
        if interval and tracer.steps_completed % interval == 0:
            self.write_report()

    def on_exception(self, exc: BaseException) -> None:
        """Record a training failure (OOM or other) and write what was recorded."""
        if not self.active:
            return
        try:
            is_oom = isinstance(exc, torch.OutOfMemoryError)
            self._status = "oom" if is_oom else "crashed"
            self._status_reason = f"{type(exc).__name__}: {exc}"[:2000]
            if is_oom and self.snapshot is not None and self.snapshot.recording:
                path = self.snapshot.dump("oom_snapshot.pickle")
                if path:
                    self.artifacts["oom_snapshot"] = os.path.basename(path)
            self.write_report()
        except Exception as inner:
            logger.warning(
                "memscope rank %d: could not write the crash report: %s", self.rank, inner
            )

    def finalize(self) -> None:
        """Stop tracing, remove every hook, write the final report. Safe to call twice."""
        if self.finalized or not self.enabled:
            return
        self.finalized = True
        if not self.active:
            return
        if self._status == "running":
            self._status = "complete"
        self._shutdown()

    def _shutdown(self) -> None:
        for site, fn in (
            ("remove_hooks", self._remove_hooks),
            ("profiler", lambda: self.profiler.stop() if self.profiler else None),
            ("snapshot", self._stop_snapshot),
            ("backend", lambda: self.backend.stop() if self.backend else None),
        ):
            try:
                fn()
            except Exception as exc:
                self._failed(site, exc)
        self._crash_guard.uninstall()
        try:
            self.write_report()
        finally:
            self.active = False
            if self._sink is not None:
                self._sink.close()

    def _remove_hooks(self) -> None:
        if self.hooks is not None:
            self.hook_handles_removed += self.hooks.remove()
            self.hooks = None

    def _stop_snapshot(self) -> None:
        if self.snapshot is not None and self.snapshot.recording:
            self.snapshot.dump("memory_snapshot_final.pickle")
            self.snapshot.stop()

    # -- categorisation for the exact backend ----------------------------------------------
    @property
    def _ledger(self) -> StorageLedgerBackend | None:
        return self.tracer.ledger if self.tracer is not None else None

    def _mark_grads(self) -> None:
        if self._ledger is not None:
            mark_grads(self._ledger, self.chunks)

    def _mark_optimizer(self) -> None:
        if self._ledger is not None and self.optimizer is not None:
            mark_optimizer_state(self._ledger, self.optimizer, self.chunks)

    # -- failures & crash paths ------------------------------------------------------------
    def _failed(self, site: str, exc: BaseException) -> None:
        if self.tracer is not None:
            self.tracer.failures.record(site, exc)
        else:
            self._startup_failures.append({"site": site, "count": 1, "first_error": repr(exc)})
            logger.warning("memscope rank %d: %s failed: %r", self.rank, site, exc)

    def _on_process_exit(self, reason: str) -> None:
        """atexit / SIGTERM: close tracing and write what was recorded, marked incomplete."""
        if self.active and not self.finalized:
            if self._status == "running":
                self._status, self._status_reason = "incomplete", reason
            self.finalized = True
            self._shutdown()

    def _on_cuda_oom(self, reason: str) -> None:
        self._status, self._status_reason = "oom", reason
        if self.snapshot is not None and self.snapshot.recording:
            path = self.snapshot.dump("oom_snapshot.pickle")
            if path:
                self.artifacts["oom_snapshot"] = os.path.basename(path)
        self.write_report()

    # -- reports ---------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """Typed facts about this rank and run."""
        return runtime_metadata(
            parallel=self.parallel,
            args=self.args,
            config=self.config,
            backend_name=self.backend_name,
            backend=self.backend,
            tracer=self.tracer,
            hook_counts={
                "modules_hooked": self.modules_hooked,
                "params_hooked": self.params_hooked,
                "hook_handles_removed": self.hook_handles_removed,
            },
        )

    def build_report(self) -> dict[str, Any]:
        """The current runtime report as a dict (what :meth:`write_report` writes)."""
        assert self.tracer is not None
        return build_runtime_report(
            report_inputs(
                tracer=self.tracer,
                top_k=self.config.top_k,
                metadata=self.metadata(),
                status=self._status,
                status_reason=self._status_reason,
                comparisons_for=self._static_estimate().compare,
                extra_errors=self._startup_failures,
                warnings=list(self.warnings),
                artifacts=self._artifact_list(),
            )
        )

    def _static_estimate(self) -> StaticEstimate:
        """The estimate for this rank, computed at the first report (args do not change)."""
        if self._static is None:
            self._static = static_estimate(self.static_estimate_provider, self.args, self.parallel)
        return self._static

    def _artifact_list(self) -> dict[str, str]:
        out = dict(self.artifacts)
        if self.profiler is not None:
            for i, path in enumerate(self.profiler.traces):
                out[f"profiler_trace_{i}"] = os.path.relpath(path, self.report_dir)
        if self.snapshot is not None:
            for i, path in enumerate(self.snapshot.snapshots):
                out.setdefault(f"memory_snapshot_{i}", os.path.basename(path))
        return out

    def write_report(self) -> str | None:
        """Write ``runtime_report.json`` and ``.md`` atomically; returns the JSON path."""
        if self.tracer is None:
            return None
        try:
            self.tracer.flush()
            report = self.build_report()
            path = os.path.join(self.report_dir, "runtime_report.json")
            atomic_write_json(path, report)
            atomic_write_text(
                os.path.join(self.report_dir, "runtime_report.md"), render_runtime_markdown(report)
            )
            self.report_path = path
            return path
        except Exception as exc:
            self._failed("write_report", exc)
            return None
