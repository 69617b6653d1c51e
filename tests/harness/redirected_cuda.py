"""TEST HELPER -- CUDA-only calls redirected so that the ``cuda`` backend runs on a CPU.

The ``cuda`` backend reads the caching allocator's counters (``torch._C._cuda_memoryStats``)
and ``cudaMemGetInfo``; neither exists in a CPU build of torch. :func:`redirect_cuda` makes
``torch.cuda`` report one device whose counters are those of :class:`FakeAllocator` (driven
by the test), and records every call that would synchronise the device or reset the host's
peak counters, and every tensor-to-Python conversion (``.item()``, ``.tolist()``,
``bool()``, ``float()``, ``int()``: each a device sync on a GPU) made from MemScope's own
code. Nothing else about torch changes: the model, autograd and the hooks are real.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import memscope

MEMSCOPE_DIR = os.path.dirname(os.path.abspath(memscope.__file__))
#: Tensor methods that copy a device value to the host (a synchronisation on a GPU).
HOST_CONVERSIONS = ("item", "tolist", "__bool__", "__float__", "__int__")


@dataclass
class FakeAllocator:
    """Allocator counters the test sets; ``peak`` follows ``allocated`` up, never down."""

    allocated: int = 1 << 20
    reserved: int = 4 << 20
    peak: int = 1 << 20
    total: int = 80 << 30
    calls: list[str] = field(default_factory=list)  # the recorded calls, in order

    def stats(self, device: int) -> dict[str, Any]:
        self.peak = max(self.peak, self.allocated)
        return {
            "allocated_bytes": {"all": {"current": self.allocated, "peak": self.peak}},
            "reserved_bytes": {"all": {"current": self.reserved, "peak": self.reserved}},
            "active_bytes": {"all": {"current": self.allocated}},
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }


def _from_memscope() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(MEMSCOPE_DIR):
            return True
        frame = frame.f_back
    return False


def redirect_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeAllocator:
    """Redirect the CUDA calls the ``cuda`` backend makes; returns the fake allocator whose
    ``calls`` list every sync, peak reset and host conversion made by MemScope."""
    fake = FakeAllocator()

    def record(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            fake.calls.append(name)

        return call

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_memoryStats", fake.stats, raising=False)
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda device=None: (fake.total - fake.reserved, fake.total)
    )
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "redirected")
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=None: types.SimpleNamespace(name="redirected", total_memory=fake.total),
    )
    monkeypatch.setattr(torch.cuda, "synchronize", record("torch.cuda.synchronize"))
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", record("torch.cuda.reset_peak_memory_stats")
    )
    for name in HOST_CONVERSIONS:
        original = getattr(torch.Tensor, name)

        def converted(self: torch.Tensor, *args: Any, __name=name, __orig=original) -> Any:
            if _from_memscope():
                fake.calls.append(f"Tensor.{__name}")
            return __orig(self, *args)

        monkeypatch.setattr(torch.Tensor, name, converted)
    return fake
