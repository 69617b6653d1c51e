"""CPU SHIMS for megatron-core 0.16.1 -- test/demo only, NOT part of megatron-core.

megatron-core assumes CUDA in a handful of places that are otherwise device-agnostic.  To train
the real ``GPTModel`` with the real pipeline schedules on a CPU-only torch build (gloo backend),
:func:`apply_cpu_shims` redirects exactly those calls to the CPU.  Every redirected call would
raise on a CPU-only build ("Torch not compiled with CUDA enabled"), so the shims cannot change
the numerical behaviour of any code path that already worked.

What is patched (module attributes / small wrapper functions only; no file is edited):

* ``torch`` as seen by ``pipeline_parallel.schedules`` (``torch.zeros(..., device="cuda")`` for
  ``total_num_tokens``), ``pipeline_parallel.p2p_communication`` (``torch.cuda.current_device()``
  for receive buffers, ``torch.cuda.synchronize()`` after batched p2p),
  ``tensor_parallel.mappings`` / ``tensor_parallel.layers`` / ``tensor_parallel.utils``
  (sequence-parallel gather / reduce-scatter buffers) is replaced by a proxy module that forwards
  everything to the real ``torch`` except: ``cuda.current_device()`` returns ``cpu``,
  ``cuda.synchronize()`` is a no-op, and the tensor factories ``zeros/empty/ones/full/tensor``
  map a ``device="cuda"`` argument to ``cpu``.
* ``megatron.core.utils.GlobalMemoryBuffer.get_tensor`` allocates its (reused, named) buffer on
  the CPU instead of ``torch.cuda.current_device()``.
* ``tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state`` (used by activation
  recompute, ``CheckpointFunction``) return an empty state / do nothing; the CPU RNG state is
  still saved and restored by megatron itself, which is all a CPU run uses.
* ``fusions.fused_softmax.get_default_causal_mask`` builds the causal mask on the CPU (only hit
  when ``attention_mask=None`` is passed; the tiny GPT harness always passes a mask).
* The same proxy's ``torch.distributed``, and the module-level ``dist_all_gather_func`` /
  ``dist_reduce_scatter_func`` of ``tensor_parallel.mappings`` / ``layers``, return only once
  gloo's worker thread has let go of the collective's tensors (:mod:`.gloo_release`): not a
  CUDA redirect, but what makes a memory measurement of the run repeatable (without it a
  tensor whose last reference the work holds is freed at a moment that varies by run).
* The tensor-parallel RNG tracker is initialised as megatron's *inference* tracker
  (``initialize_rng_tracker(inference_rng_tracker=True)``), whose ``add`` / ``set_states`` are
  no-ops and whose ``fork()`` is a null context (the CUDA tracker snapshots CUDA generators).
  Consequence: dropout inside tensor-parallel regions uses the CPU default generator.

:func:`apply_cpu_shims` is idempotent; it returns the names of all active shims.
"""

from __future__ import annotations

import operator
import types
from collections.abc import Callable
from contextlib import nullcontext
from functools import reduce
from typing import Any

import torch

from memscope.demo.gloo_release import ReleasingDistributed, releasing

__all__ = ["apply_cpu_shims", "shims_applied"]

_APPLIED: list[str] = []

# Modules whose global ``torch`` is swapped for the CPU-redirecting proxy.
_PROXIED_MODULES: tuple[str, ...] = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.utils",
)

# Modules whose module-level gather / reduce-scatter functions wait for gloo's release.
_GATHER_SCATTER_MODULES: tuple[str, ...] = (
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.layers",
)

_CPU = torch.device("cpu")


def _redirect_device(device: Any) -> Any:
    """Map a CUDA device spec to the CPU; leave anything else untouched."""
    if isinstance(device, str) and device.startswith("cuda"):
        return _CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return _CPU
    return device


def _cpu_factory(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wrap a tensor factory so that ``device="cuda"`` becomes ``cpu``."""

    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        if "device" in kwargs:
            kwargs["device"] = _redirect_device(kwargs["device"])
        return factory(*args, **kwargs)

    wrapper.__name__ = getattr(factory, "__name__", "factory")
    wrapper.__doc__ = f"CPU shim around torch.{wrapper.__name__} (cuda -> cpu)."
    return wrapper


def _cpu_current_device() -> torch.device:
    """CPU shim for ``torch.cuda.current_device()``."""
    return _CPU


def _cpu_synchronize(device: Any = None) -> None:
    """CPU shim for ``torch.cuda.synchronize()``: CPU ops are synchronous."""
    del device


class _CpuCudaNamespace:
    """Stand-in for ``torch.cuda`` inside shimmed megatron modules."""

    current_device = staticmethod(_cpu_current_device)
    synchronize = staticmethod(_cpu_synchronize)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _CpuTorchProxy(types.ModuleType):
    """Proxy for the ``torch`` module: forwards everything, redirects CUDA device use to CPU."""

    def __init__(self) -> None:
        super().__init__("torch", "memscope CPU shim proxy for torch")
        self.cuda = _CpuCudaNamespace()
        self.distributed = ReleasingDistributed()
        for name in ("zeros", "empty", "ones", "full", "tensor"):
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _cpu_get_tensor(
    self: Any,
    tensor_shape: Any,
    dtype: torch.dtype,
    name: str,
    mem_alloc_context: Callable[[], Any] | None = None,
) -> torch.Tensor:
    """CPU shim for ``GlobalMemoryBuffer.get_tensor`` (same reuse semantics, CPU storage)."""
    required_len = reduce(operator.mul, tensor_shape, 1)
    key = (name, dtype)
    buf = self.buffer.get(key)
    if buf is None or buf.numel() < required_len:
        ctx = mem_alloc_context if mem_alloc_context else nullcontext
        with ctx():
            self.buffer[key] = torch.empty(
                required_len, dtype=dtype, device=_CPU, requires_grad=False
            )
    return self.buffer[key][0:required_len].view(*tensor_shape)


def _cpu_get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    """CPU shim for ``_get_cuda_rng_state``: there is no CUDA generator to snapshot."""
    del args, kwargs
    return torch.empty(0, dtype=torch.uint8)


def _cpu_set_rng_state(*args: Any, **kwargs: Any) -> None:
    """CPU shim for ``_set_cuda_rng_state``: nothing to restore."""
    del args, kwargs


def _cpu_default_causal_mask(sq: int) -> torch.Tensor:
    """CPU shim for ``get_default_causal_mask`` (upper-triangular True = masked)."""
    return torch.triu(torch.ones(sq, sq, device=_CPU), diagonal=1).bool()


def shims_applied() -> list[str]:
    """Names of the shims active in this process (empty before :func:`apply_cpu_shims`)."""
    return list(_APPLIED)


def apply_cpu_shims() -> list[str]:
    """Patch megatron-core 0.16.1 so that it trains on CPU; idempotent.

    Returns the names of all active shims (the same list on every call).
    """
    if _APPLIED:
        return list(_APPLIED)

    import importlib

    from megatron.core import utils as mcore_utils
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as tp_random

    proxy = _CpuTorchProxy()
    for mod_name in _PROXIED_MODULES:
        mod = importlib.import_module(mod_name)
        if not isinstance(getattr(mod, "torch", None), _CpuTorchProxy):
            setattr(mod, "torch", proxy)  # noqa: B010
        _APPLIED.append(f"{mod_name}.torch -> cpu proxy")

    for mod_name in _GATHER_SCATTER_MODULES:
        mod = importlib.import_module(mod_name)
        for name in ("dist_all_gather_func", "dist_reduce_scatter_func"):
            setattr(mod, name, releasing(getattr(mod, name)))
        _APPLIED.append(f"{mod_name} collectives -> release their tensors before returning")

    setattr(mcore_utils.GlobalMemoryBuffer, "get_tensor", _cpu_get_tensor)  # noqa: B010
    _APPLIED.append("megatron.core.utils.GlobalMemoryBuffer.get_tensor -> cpu")

    setattr(tp_random, "_get_cuda_rng_state", _cpu_get_rng_state)  # noqa: B010
    setattr(tp_random, "_set_cuda_rng_state", _cpu_set_rng_state)  # noqa: B010
    _APPLIED.append("megatron.core.tensor_parallel.random._get/_set_cuda_rng_state -> no-op")

    setattr(fused_softmax, "get_default_causal_mask", _cpu_default_causal_mask)  # noqa: B010
    _APPLIED.append("megatron.core.fusions.fused_softmax.get_default_causal_mask -> cpu")

    tp_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    _APPLIED.append("megatron.core.tensor_parallel.random rng tracker -> inference (null fork)")
    return list(_APPLIED)
