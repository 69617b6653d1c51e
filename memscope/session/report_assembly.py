"""Gathers a session's state into the facts of its runtime report (:mod:`memscope.report`
builds the report from them)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

import torch

from memscope._version import __version__
from memscope.capture.backends.base import MemoryBackend
from memscope.capture.device import device_name
from memscope.capture.parallel import ParallelInfo
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig
from memscope.events.trace_sink import BufferedTraceWriter
from memscope.session.run_identity import RunIdentity


def runtime_metadata(
    *,
    parallel: ParallelInfo,
    config: RuntimeConfig,
    backend_name: str,
    backend: MemoryBackend | None,
    tracer: MemoryTracer | None,
    hook_counts: Mapping[str, int],
    framework: Mapping[str, Any],
    run: RunIdentity,
) -> dict[str, Any]:
    """Typed facts about this rank and run; ``framework`` holds the adapter's own facts
    (``dtype``, framework versions)."""
    device_info = backend.describe() if backend is not None else {}
    return {
        **parallel.to_dict(),
        **framework,
        "backend": backend_name,
        "backend_info": device_info,
        "device_name": device_info.get("device_name") or device_name(),
        "torch_version": torch.__version__,
        "tool_version": __version__,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "run_id": run.run_id,
        "run_id_source": run.source,
        "start_time": run.start_time,
        "steps_completed": tracer.steps_completed if tracer else 0,
        "last_step": tracer.step if tracer else None,
        **hook_counts,
        "config": config.to_report_dict(),
    }


def trace_writer_facts(writer: BufferedTraceWriter | None) -> dict[str, Any]:
    """The trace file's own counters for the report's ``trace`` section."""
    return {
        "jsonl_events_dropped": writer.dropped if writer is not None else 0,
        "jsonl_rotations": writer.sink.rotations if writer is not None else 0,
    }
