"""CUDA caching-allocator backend: one raw allocator-stats call per sample.

The allocator's high-water mark is process-wide: Megatron's ``report_memory`` and its
TensorBoard memory log read the same counter. By default it is never reset; a step's peak
comes from :class:`.PeakWindow` (exact for every step that raises the run's high-water mark,
else the largest value read in the step, and the step says so). With
``BackendOptions.reset_peak_stats`` (``--memscope-reset-peak-stats``) the counter is reset
at every step start and every step's peak is exact, at the cost of the host's own "max
allocated" figures, which then show per-step values too.
Step-level samples add allocation retries, OOM count, active bytes and device-level used
memory from ``cudaMemGetInfo`` (which also shows NCCL buffers and the CUDA context).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from memscope.capture.backends.base import (
    BackendCapabilities,
    BackendOptions,
    MemoryBackend,
    MemorySample,
)
from memscope.capture.backends.peak_window import PeakWindow
from memscope.capture.backends.registry import BackendSpec, register_backend
from memscope.capture.torch_features import device_used_unsupported, log_once

CAPABILITIES = BackendCapabilities(
    device_type="cuda",
    exact_categories=False,
    true_peak=True,
    peak_context=False,
    can_synchronize=True,
    distinct_reserved=True,
)
# Without resetting the counter a step's peak is exact only when the step raised it.
CAPABILITIES_NO_RESET = dataclasses.replace(CAPABILITIES, true_peak=False)


def register() -> None:
    """Make ``cuda`` a backend choice (``auto`` prefers it when a GPU is present)."""
    register_backend(
        BackendSpec(
            name="cuda",
            factory=lambda options: CudaAllocatorBackend(options=options),
            is_available=lambda: torch.cuda.is_available(),  # looked up at each call
            auto_priority=20,
            unavailable_reason="--memscope-backend cuda needs a CUDA device; none is available",
        )
    )


class CudaAllocatorBackend(MemoryBackend):
    """Readings from ``torch.cuda``'s caching allocator on one device."""

    name = "cuda"

    @property
    def capabilities(self) -> BackendCapabilities:
        return CAPABILITIES if self.reset_peak_stats else CAPABILITIES_NO_RESET

    def __init__(self, device: int | None = None, options: BackendOptions | None = None) -> None:
        if not torch.cuda.is_available():
            raise ValueError("--memscope-backend cuda needs a CUDA device; none is available")
        self.device = torch.cuda.current_device() if device is None else device
        raw = getattr(torch._C, "_cuda_memoryStats", None)
        self._raw_stats = raw if callable(raw) else None
        unsupported = device_used_unsupported()
        self._mem_get_info = None if unsupported else torch.cuda.mem_get_info
        if unsupported:
            self.notes = (f"device-used memory not recorded: {log_once(unsupported)}",)
        self.reset_peak_stats = (options or BackendOptions()).reset_peak_stats
        self._allocated_window = PeakWindow()
        self._reserved_window = PeakWindow()

    def _stats(self) -> dict[str, Any]:
        if self._raw_stats is not None:
            return self._raw_stats(self.device)  # nested dict; no Python-side flattening
        flat = torch.cuda.memory_stats(self.device)
        nested: dict[str, Any] = {}
        for key, value in flat.items():
            node = nested
            parts = key.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return nested

    def sample(self, detailed: bool = False) -> MemorySample:
        stats = self._stats()
        alloc = stats.get("allocated_bytes", {}).get("all", {})
        reserved = stats.get("reserved_bytes", {}).get("all", {})
        extras: dict[str, int] | None = None
        if detailed:
            extras = {
                "active_bytes": int(stats.get("active_bytes", {}).get("all", {}).get("current", 0)),
                "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
                "num_ooms": int(stats.get("num_ooms", 0)),
            }
            if self._mem_get_info is not None:
                free, total = self._mem_get_info(self.device)
                extras["device_used_bytes"] = int(total - free)
                extras["device_total_bytes"] = int(total)
        current, current_reserved = int(alloc.get("current", 0)), int(reserved.get("current", 0))
        peak, peak_reserved = int(alloc.get("peak", 0)), int(reserved.get("peak", 0))
        if not self.reset_peak_stats:
            peak = self._allocated_window.update(peak, current)
            peak_reserved = self._reserved_window.update(peak_reserved, current_reserved)
            if extras is not None:
                extras["peak_exact"] = int(self._allocated_window.exact)
        return MemorySample(current, current_reserved, peak, peak_reserved, None, extras)

    def reset_peak(self) -> None:
        if self.reset_peak_stats:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        stats = self._stats()
        alloc = stats.get("allocated_bytes", {}).get("all", {})
        reserved = stats.get("reserved_bytes", {}).get("all", {})
        self._allocated_window.start(int(alloc.get("peak", 0)), int(alloc.get("current", 0)))
        self._reserved_window.start(int(reserved.get("peak", 0)), int(reserved.get("current", 0)))

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def describe(self) -> dict[str, Any]:
        props = torch.cuda.get_device_properties(self.device)
        return {
            "backend": self.name,
            "device_type": "cuda",
            "device_name": props.name,
            "device_index": self.device,
            "device_total_bytes": int(props.total_memory),
        }
