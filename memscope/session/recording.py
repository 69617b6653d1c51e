"""What a session records with, built at its start in steps: the backend and the event
consumers (bounded store, analyzers) first, with no side effect; the streamed ``trace.jsonl``;
then, once the final report is in place, the backend started, the category policy and the
tracer. The report reads its recorded content from here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from memscope.analysis.base import Analyzer
from memscope.analysis.static_comparison import StaticEstimate
from memscope.capture.backends import BackendOptions, create_backend
from memscope.capture.backends.base import MemoryBackend
from memscope.capture.category_policy import CategoryPolicy
from memscope.capture.parallel import ParallelInfo
from memscope.capture.safety import FailureLog
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.events.schema import EventConsumer
from memscope.events.trace_sink import BufferedTraceWriter
from memscope.events.trace_store import BoundedTraceStore
from memscope.report.builder import ReportSettings, RuntimeReportBuilder
from memscope.session.run_identity import RunIdentity
from memscope.session.teardown import Teardown
from memscope.session.writers import flush_trace, open_trace, trace_header


@dataclass
class Recording:
    """The backend and the consumers of its events; :meth:`start` adds policy and tracer."""

    config: RuntimeConfig
    failures: FailureLog
    static: StaticEstimate
    backend_name: str
    backend: MemoryBackend
    report_builder: RuntimeReportBuilder
    consumers: list[EventConsumer] = field(default_factory=list)
    trace: BufferedTraceWriter | None = None
    policy: CategoryPolicy | None = None
    tracer: MemoryTracer | None = None
    failure_recorded: bool = False

    @classmethod
    def prepare(
        cls, config: RuntimeConfig, failures: FailureLog, backend_name: str, static: StaticEstimate
    ) -> Recording:
        """Build the backend (not started) and the analyzers; raises if the backend can't
        run here (the session's start then fails, said once)."""
        options = BackendOptions(
            reset_peak_stats=config.reset_peak_stats,
            capacity_bytes=int(config.storage_capacity_mib * 2**20),
        )
        backend = create_backend(backend_name, options)
        builder = RuntimeReportBuilder(ReportSettings.from_config(config), static)
        return cls(config, failures, static, backend_name, backend, builder, builder.consumers)

    @property
    def store(self) -> BoundedTraceStore:
        """The bounded store of the events the report keeps."""
        return self.report_builder.store

    @property
    def analyzers(self) -> list[Analyzer]:
        """The report's analyzers, in the order their sections are built."""
        return self.report_builder.analyzers

    def open_trace(
        self,
        directory: str,
        parallel: ParallelInfo,
        run: RunIdentity,
        training: dict[str, Any] | None,
        teardown: Teardown,
    ) -> list[str]:
        """Stream every event to ``directory/trace.jsonl`` (when configured) from now on;
        returns the warning to give when it can't be opened (none otherwise)."""
        if not self.config.trace_jsonl:
            return []
        header = trace_header(
            parallel=parallel,
            run=run,
            backend=self.backend_name,
            config=self.config,
            static=self.static,
            training=training,
        )
        self.trace, note = open_trace(
            directory, header, self.config.trace_max_mib, teardown, self.failures
        )
        if self.trace is not None:
            self.consumers.append(self.trace)
        return [note] if note else []

    def flush_trace(self) -> None:
        """Write buffered events to ``trace.jsonl`` (a failure is recorded, retried later)."""
        flush_trace(self.trace, self.failures)

    def start(
        self,
        rank: int,
        pipeline_stage: int | None,
        grad_attributes: Sequence[str],
        model: tuple[Sequence[torch.nn.Module], Sequence[torch.optim.Optimizer]],
        teardown: Teardown,
    ) -> MemoryTracer:
        """Start the backend and the tracer over ``model`` (chunks, optimizers), each undone
        at teardown; memory that predates this is adopted (categorised where it can be)."""
        self.backend.start()
        teardown.push("backend", self.backend.stop)
        policy = self.policy = CategoryPolicy(self.backend.categorizer(), tuple(grad_attributes))
        teardown.push("saved_tensor_hooks", policy.pop_saved_hooks)
        self.tracer = MemoryTracer(
            self.config,
            self.backend,
            rank,
            self.consumers,
            policy=policy,
            failures=self.failures,
            pipeline_stage=pipeline_stage,
        )
        chunks, optimizers = model
        policy.set_model(list(chunks))
        policy.set_optimizers(list(optimizers))
        policy.adopt_untracked()  # whatever else predates start()
        return self.tracer

    def record_failure(self, oom: bool, reason: str) -> None:
        """The training's failure as an event in the trace, once (the allocator's OOM
        observer fires before the exception reaches the excepthook)."""
        if self.failure_recorded or self.tracer is None:
            return
        self.failure_recorded = True
        try:
            self.tracer.record_failure(oom, reason)
        except Exception as exc:
            self.failures.record("failure_event", exc)
