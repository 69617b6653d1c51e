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

import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from memscope._version import __version__
from memscope.analysis.comparison import compare_with_static
from memscope.analysis.peak import locate_peak
from memscope.capture.backends import create_backend, resolve_backend_name
from memscope.capture.backends.base import MemoryBackend
from memscope.capture.hooks import HookSet, unwrap_module
from memscope.capture.parallel import ParallelInfo, discover_parallel_info, package_version
from memscope.capture.profiling import ProfilerController, SnapshotController
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.events import schema as s
from memscope.events.trace_sink import JsonlTraceSink
from memscope.io.atomic import atomic_write_json, atomic_write_text
from memscope.reporters.markdown import render_runtime_markdown
from memscope.reporters.runtime_json import RuntimeReportInputs, build_runtime_report

logger = logging.getLogger("memscope")
F = TypeVar("F", bound=Callable[..., Any])
StaticEstimateProvider = Callable[[Any, ParallelInfo], dict[str, Any] | None]
NO_ESTIMATOR_REASON = f"memscope {__version__} has no static estimator yet"


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


def _dtype_name(args: Any) -> str:
    if getattr(args, "bf16", False):
        return "bfloat16"
    if getattr(args, "fp16", False):
        return "float16"
    dtype = getattr(args, "params_dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else "float32"


class MemScopeMegatronRuntime:
    """Per-rank memory tracer for Megatron / FlagScale training loops."""

    def __init__(
        self,
        config: RuntimeConfig,
        args: Any = None,
        static_estimate_provider: StaticEstimateProvider | None = None,
    ) -> None:
        self.config = config.validate()
        self.args = args
        self.static_estimate_provider = static_estimate_provider
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
        self._prev_excepthook: Any = None
        self._prev_sigterm: Any = None
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
        self._mark_model_state()
        self._mark_optimizer()
        if self.tracer.ledger is not None:
            self.tracer.ledger.adopt_existing(s.CAT_OTHER)
        self._attach_hooks()
        self._start_profiling()
        self._install_crash_handlers()

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
        self._uninstall_crash_handlers()
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
    def _mark_model_state(self) -> None:
        ledger = self.tracer.ledger if self.tracer else None
        if ledger is None:
            return
        for chunk in self.chunks:
            for p in chunk.parameters():
                ledger.mark(p, s.CAT_PARAMETERS)
            for b in chunk.buffers():
                ledger.mark(b, s.CAT_PARAMETERS)
        self._mark_grads()

    def _mark_grads(self) -> None:
        ledger = self.tracer.ledger if self.tracer else None
        if ledger is None:
            return
        for chunk in self.chunks:
            for p in chunk.parameters():
                for g in (p.grad, getattr(p, "main_grad", None)):
                    if isinstance(g, torch.Tensor):
                        ledger.mark(g, s.CAT_GRADIENTS)

    def _mark_optimizer(self) -> None:
        ledger = self.tracer.ledger if self.tracer else None
        if ledger is None or self.optimizer is None:
            return
        model_params = {id(p) for c in self.chunks for p in c.parameters()}
        for opt in _torch_optimizers(self.optimizer):
            for state in opt.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        ledger.mark(value, s.CAT_OPTIMIZER_STATE)
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in model_params:  # fp32 master copies
                        ledger.mark(p, s.CAT_OPTIMIZER_STATE)

    # -- failures & crash paths ------------------------------------------------------------
    def _failed(self, site: str, exc: BaseException) -> None:
        if self.tracer is not None:
            self.tracer.failures.record(site, exc)
        else:
            self._startup_failures.append({"site": site, "count": 1, "first_error": repr(exc)})
            logger.warning("memscope rank %d: %s failed: %r", self.rank, site, exc)

    def _install_crash_handlers(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._atexit)
        if threading.current_thread() is threading.main_thread():
            try:
                current = signal.getsignal(signal.SIGTERM)
                if current in (signal.SIG_DFL, None):
                    self._prev_sigterm = current
                    signal.signal(signal.SIGTERM, self._on_sigterm)
            except (ValueError, OSError):
                pass
        observer = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if torch.cuda.is_available() and callable(observer):
            observer(self._cuda_oom_observer)

    def _uninstall_crash_handlers(self) -> None:
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        atexit.unregister(self._atexit)
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        self.on_exception(exc)
        hook = self._prev_excepthook or sys.__excepthook__
        hook(exc_type, exc, tb)

    def _atexit(self) -> None:
        if self.active and not self.finalized:
            if self._status == "running":
                self._status = "incomplete"
                self._status_reason = "the process exited before finalize() was called"
            self.finalized = True
            self._shutdown()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.active and not self.finalized:
            self._status, self._status_reason = "incomplete", "terminated by SIGTERM"
            self.finalized = True
            self._shutdown()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _cuda_oom_observer(
        self, device: int, alloc: int, device_alloc: int, device_free: int
    ) -> None:
        self._status = "oom"
        self._status_reason = (
            f"CUDA out of memory on device {device}: tried to allocate {alloc} bytes with "
            f"{device_alloc} allocated and {device_free} free"
        )
        if self.snapshot is not None and self.snapshot.recording:
            path = self.snapshot.dump("oom_snapshot.pickle")
            if path:
                self.artifacts["oom_snapshot"] = os.path.basename(path)
        self.write_report()

    # -- reports ---------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """Typed facts about this rank and run."""
        p = self.parallel
        device_info = self.backend.describe() if self.backend is not None else {}
        device_name = device_info.get("device_name") or (
            torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        )
        tracer = self.tracer
        return {
            **p.to_dict(),
            "dtype": _dtype_name(self.args),
            "backend": self.backend_name,
            "backend_info": device_info,
            "device_name": device_name,
            "torch_version": torch.__version__,
            "megatron_core_version": package_version("megatron-core"),
            "tool_version": __version__,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "steps_completed": tracer.steps_completed if tracer else 0,
            "last_step": tracer.step if tracer else None,
            "modules_hooked": self.modules_hooked,
            "params_hooked": self.params_hooked,
            "hook_handles_removed": self.hook_handles_removed,
            "config": _plain(self.config),
        }

    def _comparisons(self, peak: dict[str, Any]) -> dict[str, Any]:
        runtime_peak = int(peak.get("memory_bytes") or 0)
        if self.static_estimate_provider is None:
            return compare_with_static(
                runtime_peak, peak.get("categories"), None, NO_ESTIMATOR_REASON
            )
        try:
            estimate = self.static_estimate_provider(self.args, self.parallel)
        except Exception as exc:
            reason = f"the static estimator failed: {type(exc).__name__}: {exc}"
            return compare_with_static(runtime_peak, peak.get("categories"), None, reason)
        return compare_with_static(runtime_peak, peak.get("categories"), estimate)

    def build_report(self) -> dict[str, Any]:
        """The current runtime report as a dict (what :meth:`write_report` writes)."""
        tracer = self.tracer
        assert tracer is not None
        agg = tracer.aggregates
        peak = locate_peak(agg, *self._exact_peak())
        errors = tracer.failures.to_list() + self._startup_failures
        ledger = tracer.ledger
        if ledger is not None and ledger.error:
            errors.append({"site": "storage_backend", "count": 1, "first_error": ledger.error})
        store = tracer.store
        return build_runtime_report(
            RuntimeReportInputs(
                metadata=self.metadata(),
                status=self._status,
                status_reason=self._status_reason,
                peak=peak,
                top_events=agg.top_events(self.config.top_k),
                phase_summary=agg.phases,
                module_summary=agg.module_table(),
                steps=agg.step_table(),
                comparisons=self._comparisons(peak),
                events=list(store.events),
                trace_info={
                    "events_recorded": agg.events_seen,
                    "events_in_report": len(store.events),
                    "events_not_in_report": store.dropped,
                    "detail_steps": store.detail_steps_kept,
                    "max_events": store.max_events,
                    "step_summaries_thinned": agg.step_summaries_thinned,
                    "step_phase_steps_thinned": store.steps_thinned,
                    "jsonl": self.artifacts.get("trace_jsonl"),
                    "policy": "step phases for up to 2000 steps (then every other step); "
                    "module/grad events for the first detail_steps traced steps; "
                    "all events in the JSONL trace",
                },
                errors=errors,
                warnings=list(self.warnings),
                artifacts=self._artifact_list(),
            )
        )

    def _exact_peak(self) -> tuple[tuple[Any, ...] | None, tuple[int, ...] | None]:
        tracer = self.tracer
        if tracer is None or tracer.ledger is None or tracer.best_peak_context is None:
            return None, None
        return tracer.best_peak_context, tracer.best_peak_categories

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


def _torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """torch optimizers inside Megatron wrappers (``.optimizer``, ``chained_optimizers``)."""
    found: list[torch.optim.Optimizer] = []
    stack = [optimizer]
    seen: set[int] = set()
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.optim.Optimizer):
            found.append(obj)
            continue
        stack.extend(getattr(obj, "chained_optimizers", None) or [])
        stack.append(getattr(obj, "optimizer", None))
    return found


def _plain(config: RuntimeConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)
