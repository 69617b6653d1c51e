"""Gathers a runtime's state into the plain inputs of the runtime report."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from typing import Any

import torch

from memscope._version import __version__
from memscope.analysis.comparison import compare_with_static
from memscope.analysis.peak import locate_peak
from memscope.capture.backends.base import MemoryBackend
from memscope.capture.parallel import ParallelInfo, package_version
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.reporters.runtime_json import RuntimeReportInputs

StaticEstimateProvider = Callable[[Any, ParallelInfo], dict[str, Any] | None]
NO_ESTIMATOR_REASON = "static estimation is off (static_estimate_provider=None)"


def default_static_estimate(args: Any, parallel: ParallelInfo) -> dict[str, Any]:
    """MemScope's own per-rank estimate for this run's Megatron args."""
    from memscope.analysis.static.estimator import estimate_for_runtime

    if args is None:
        raise ValueError("no Megatron args were given to the runtime (from_megatron_args)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return estimate_for_runtime(args, parallel, device=device)


TRACE_POLICY = (
    "step phases for up to 2000 steps (then evenly thinned); module/grad events for the first "
    "detail_steps traced steps; all recorded events in the JSONL trace"
)


def dtype_name(args: Any) -> str:
    """Training dtype from Megatron args (``bf16`` / ``fp16`` flags, else ``params_dtype``)."""
    if getattr(args, "bf16", False):
        return "bfloat16"
    if getattr(args, "fp16", False):
        return "float16"
    dtype = getattr(args, "params_dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else "float32"


def runtime_metadata(
    *,
    parallel: ParallelInfo,
    args: Any,
    config: RuntimeConfig,
    backend_name: str,
    backend: MemoryBackend | None,
    tracer: MemoryTracer | None,
    hook_counts: dict[str, int],
) -> dict[str, Any]:
    """Typed facts about this rank and run."""
    device_info = backend.describe() if backend is not None else {}
    device_name = device_info.get("device_name") or (
        torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    )
    return {
        **parallel.to_dict(),
        "dtype": dtype_name(args),
        "backend": backend_name,
        "backend_info": device_info,
        "device_name": device_name,
        "torch_version": torch.__version__,
        "megatron_core_version": package_version("megatron-core"),
        "tool_version": __version__,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "steps_completed": tracer.steps_completed if tracer else 0,
        "last_step": tracer.step if tracer else None,
        **hook_counts,
        "config": dataclasses.asdict(config),
    }


@dataclasses.dataclass(frozen=True)
class StaticEstimate:
    """The run's static estimate (``compare_with_static`` input), or why there is none."""

    estimate: dict[str, Any] | None
    missing_reason: str = ""

    def compare(self, peak: dict[str, Any]) -> dict[str, Any]:
        """The ``comparisons`` section for the runtime ``peak``."""
        runtime_peak = int(peak.get("memory_bytes") or 0)
        if self.estimate is None:
            return compare_with_static(
                runtime_peak, peak.get("categories"), None, self.missing_reason
            )
        return compare_with_static(runtime_peak, peak.get("categories"), self.estimate)


def static_estimate(
    provider: StaticEstimateProvider | None, args: Any, parallel: ParallelInfo
) -> StaticEstimate:
    """Ask ``provider`` once; a failing estimator is reported, never raised."""
    if provider is None:
        return StaticEstimate(None, NO_ESTIMATOR_REASON)
    try:
        return StaticEstimate(provider(args, parallel))
    except ValueError as exc:  # a config the estimator does not model, said as such
        return StaticEstimate(None, f"no static estimate: {exc}")
    except Exception as exc:
        return StaticEstimate(None, f"the static estimator failed: {type(exc).__name__}: {exc}")


def report_inputs(
    *,
    tracer: MemoryTracer,
    top_k: int,
    metadata: dict[str, Any],
    status: str,
    status_reason: str,
    comparisons_for: Callable[[dict[str, Any]], dict[str, Any]],
    extra_errors: list[dict[str, Any]],
    warnings: list[str],
    artifacts: dict[str, str],
) -> RuntimeReportInputs:
    """Everything the JSON reporter needs, from the tracer's aggregates and store."""
    agg = tracer.aggregates
    exact = tracer.ledger is not None and tracer.best_peak_context is not None
    peak = locate_peak(
        agg,
        tracer.best_peak_context if exact else None,
        tracer.best_peak_categories if exact else None,
    )
    errors = tracer.failures.to_list() + extra_errors
    if tracer.ledger is not None and tracer.ledger.error:
        errors.append({"site": "storage_backend", "count": 1, "first_error": tracer.ledger.error})
    store = tracer.store
    events = store.events
    return RuntimeReportInputs(
        metadata=metadata,
        status=status,
        status_reason=status_reason,
        peak=peak,
        top_events=agg.top_events(top_k),
        phase_summary=agg.phases,
        module_summary=agg.module_table(),
        steps=agg.step_table(),
        comparisons=comparisons_for(peak),
        events=events,
        trace_info={
            "events_recorded": agg.events_seen,
            "events_in_report": len(events),
            "events_not_in_report": store.dropped,
            "detail_steps": store.detail_steps_kept,
            "max_events": store.max_events,
            "step_stride": store.stride,
            "step_summaries_thinned": agg.step_summaries_thinned,
            "step_phase_steps_thinned": store.steps_thinned,
            "jsonl": artifacts.get("trace_jsonl"),
            "policy": TRACE_POLICY,
        },
        errors=errors,
        warnings=warnings,
        artifacts=artifacts,
    )
