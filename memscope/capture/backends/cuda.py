"""CUDA caching-allocator backend: one raw allocator-stats call per sample.

The allocator's own high-water mark is reset at every step start, so the reported peak is
the real peak of the step, not the largest value that happened to be sampled at a hook.
(Known limitation: that counter is process-wide, so Megatron's own "max allocated" log
then shows per-step values too.)
Step-level samples add allocation retries, OOM count, active bytes and device-level used
memory from ``cudaMemGetInfo`` (which also shows NCCL buffers and the CUDA context).
"""

from __future__ import annotations

from typing import Any

import torch

from memscope.capture.backends.base import BackendCapabilities, MemoryBackend, MemorySample
from memscope.capture.backends.registry import BackendSpec, register_backend

CAPABILITIES = BackendCapabilities(
    device_type="cuda",
    exact_categories=False,
    true_peak=True,
    peak_context=False,
    can_synchronize=True,
    distinct_reserved=True,
)


def register() -> None:
    """Make ``cuda`` a backend choice (``auto`` prefers it when a GPU is present)."""
    register_backend(
        BackendSpec(
            name="cuda",
            factory=CudaAllocatorBackend,
            is_available=torch.cuda.is_available,
            auto_priority=20,
            unavailable_reason="--memscope-backend cuda needs a CUDA device; none is available",
        )
    )


class CudaAllocatorBackend(MemoryBackend):
    """Readings from ``torch.cuda``'s caching allocator on one device."""

    name = "cuda"

    @property
    def capabilities(self) -> BackendCapabilities:
        return CAPABILITIES

    def __init__(self, device: int | None = None) -> None:
        if not torch.cuda.is_available():
            raise ValueError("--memscope-backend cuda needs a CUDA device; none is available")
        self.device = torch.cuda.current_device() if device is None else device
        raw = getattr(torch._C, "_cuda_memoryStats", None)
        self._raw_stats = raw if callable(raw) else None

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
            free, total = torch.cuda.mem_get_info(self.device)
            extras = {
                "active_bytes": int(stats.get("active_bytes", {}).get("all", {}).get("current", 0)),
                "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
                "num_ooms": int(stats.get("num_ooms", 0)),
                "device_used_bytes": int(total - free),
                "device_total_bytes": int(total),
            }
        return MemorySample(
            int(alloc.get("current", 0)),
            int(reserved.get("current", 0)),
            int(alloc.get("peak", 0)),
            int(reserved.get("peak", 0)),
            None,
            extras,
        )

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

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
