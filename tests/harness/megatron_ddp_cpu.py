"""Test helper: megatron-core 0.16.1's ``DistributedDataParallel`` and Megatron optimizer
(optionally the distributed optimizer) on CPU with gloo.

Redirected here, and only here (none of it holds or shapes a tensor the tests count):

* the modules in :data:`STUBBED` see ``torch`` through :class:`CpuTorch`: ``device="cuda"``
  becomes the CPU, ``torch.cuda.current_device()`` is the CPU, CUDA RNG calls are no-ops;
* ``Tensor.type()`` (no argument) reports the CUDA type name of a CPU tensor
  (``torch.FloatTensor`` -> ``torch.cuda.FloatTensor``): the distributed optimizer and the
  gradient clipping check it;
* gradient clipping is off (``clip_grad=0``): its fused norm asserts CUDA tensors.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Iterable
from typing import Any

import torch

STUBBED = (
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.optimizer",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.utils",
)


class CpuTorch(types.ModuleType):
    """``torch`` with every CUDA device use redirected to the CPU (see module doc)."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(
            current_device=lambda: torch.device("cpu"),
            synchronize=lambda *a, **k: None,
            get_rng_state=lambda *a, **k: torch.empty(0, dtype=torch.uint8),
            set_rng_state=lambda *a, **k: None,
            empty_cache=lambda: None,
            is_available=lambda: False,
            current_stream=lambda *a, **k: None,
        )
        for name in ("zeros", "empty", "ones", "full", "tensor", "zeros_like", "empty_like"):
            setattr(self, name, self._on_cpu(getattr(torch, name)))

    @staticmethod
    def _on_cpu(factory: Any) -> Any:
        def make(*args: Any, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if device is not None and str(device).startswith("cuda"):
                kwargs["device"] = "cpu"
            return factory(*args, **kwargs)

        return make

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def redirect_torch(modules: Iterable[str | types.ModuleType]) -> None:
    """The given modules (or module names) see ``torch`` through one :class:`CpuTorch`."""
    stub = CpuTorch()
    for module in modules:
        target = importlib.import_module(module) if isinstance(module, str) else module
        target.torch = stub  # type: ignore[attr-defined]


def install_ddp_cpu_stand_ins() -> None:
    """Apply the redirections listed in the module docstring."""
    redirect_torch(STUBBED)
    plain = torch.Tensor.type

    def cuda_type_name(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = plain(self, *args, **kwargs)
        if args or kwargs or not isinstance(out, str):
            return out
        return out.replace("torch.", "torch.cuda.", 1)

    torch.Tensor.type = cuda_type_name  # type: ignore[assignment,method-assign]


def megatron_ddp_and_optimizer(chunks: list[Any], distributed_optimizer: bool) -> tuple[Any, Any]:
    """Wrap ``chunks`` in Megatron's DDP and build its Adam (fp32, no clipping)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp = DistributedDataParallelConfig(
        use_distributed_optimizer=distributed_optimizer, grad_reduce_in_fp32=True
    )
    model = [DistributedDataParallel(c.config, ddp, c) for c in chunks]
    config = OptimizerConfig(
        optimizer="adam", lr=1e-3, clip_grad=0.0, use_distributed_optimizer=distributed_optimizer
    )
    return model, get_megatron_optimizer(config, model, use_gloo_process_groups=False)
