"""Test helper: megatron-core's Megatron-FSDP (0.16.1 or 0.19.x; ``FullyShardedDataParallel``
of ``distributed/fsdp/mcore_fsdp_adapter.py``) built on CPU with gloo.

Redirected here, and only here (none of it holds or shapes a buffer the tests count):

* the Megatron-FSDP modules see ``torch`` through :class:`.megatron_ddp_cpu.CpuTorch` with
  CUDA streams and events as no-ops (:class:`NoStream`: the CPU runs every op in order, so
  nothing waits) and device index 0;
* the adapter's device meshes are CPU meshes (``DeviceMesh.from_group(..., "cpu")``);
* ``Tensor.cuda`` is the identity while the wrapper is built (its uneven-DTensor check moves
  a small shape tensor to the GPU).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any
from unittest import mock

import torch

from tests.harness.megatron_ddp_cpu import CpuTorch

FSDP_MODULES = (
    "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer",
    "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp",
    "megatron.core.distributed.fsdp.src.megatron_fsdp.utils",
    "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
)


class NoStream:
    """A CUDA stream or event stand-in: waiting, recording and synchronising do nothing."""

    def wait_stream(self, *args: Any) -> None:
        return None

    def wait_event(self, *args: Any) -> None:
        return None

    def wait(self, *args: Any) -> None:
        return None

    def record(self, *args: Any) -> None:
        return None

    def record_event(self, *args: Any) -> NoStream:
        return NoStream()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


def megatron_fsdp_on_cpu(config: Any, ddp_config: Any, model: Any) -> Any:
    """``model`` wrapped in Megatron-FSDP with ``ddp_config`` (see the module doc)."""
    from torch.distributed import DeviceMesh

    stub = CpuTorch()
    stub.cuda.Stream = lambda *a, **k: None
    stub.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    stub.cuda.current_device = lambda: 0
    stub.cuda.current_stream = lambda *a, **k: NoStream()
    stub.cuda.default_stream = lambda *a, **k: NoStream()
    stub.cuda.Event = lambda *a, **k: NoStream()
    for name in FSDP_MODULES:
        importlib.import_module(name).torch = stub  # type: ignore[attr-defined]
    adapter = importlib.import_module("megatron.core.distributed.fsdp.mcore_fsdp_adapter")

    class CpuMesh:
        @staticmethod
        def from_group(*args: Any, device_type: str = "cuda", **kwargs: Any) -> Any:
            return DeviceMesh.from_group(*args, device_type="cpu", **kwargs)

    with (
        mock.patch.object(adapter, "DeviceMesh", CpuMesh),
        mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self),
    ):
        return adapter.FullyShardedDataParallel(
            config, ddp_config, model, device=torch.device("cpu")
        )


def unsharded_weight_bytes(wrapped: Any) -> int:
    """Bytes of all-gathered (unsharded) parameter buckets this rank holds right now."""
    total = 0
    for group in wrapped.param_and_grad_buffer.parameter_groups:
        buf = group.model_weight_buffer
        if buf is None or not buf.is_data_distributed:
            continue
        bucket = buf.temporary_bucket_allocator.buckets.get(buf.bucket_index.bucket_id)
        if bucket is not None:
            total += bucket.data.untyped_storage().nbytes()
    return total


def buffer_bytes(wrapped: Any) -> dict[str, int]:
    """Bytes this rank holds in each kind of Megatron-FSDP buffer (its shard when sharded)."""
    out = {"model_weight": 0, "main_weight": 0, "main_grad": 0}
    for group in wrapped.param_and_grad_buffer.parameter_groups:
        for kind in out:
            buf = getattr(group, f"{kind}_buffer")
            if buf is not None:
                out[kind] += buf.data_size * buf.dtype.itemsize
            elif kind == "model_weight":  # no_shard: the module keeps its own parameters
                out[kind] += sum(p.numel() * p.element_size() for p in group.params)
    return out
