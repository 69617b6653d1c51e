"""Fixed GPU-resident workspaces: allocated once through the caching allocator, kept forever.

Two workspaces appear in ``torch.cuda.memory_allocated()`` after the first step and stay:

- **torch's cuBLAS workspace**, one per (cuBLAS handle, stream) that ran a GEMM
  (aten/src/ATen/cuda/CublasHandlePool.cpp, ``getNewWorkspace`` allocates it through
  ``CUDACachingAllocator``). Its size is ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT`` pairs,
  SIZE in KiB, summed) when set, else ``parseChosenWorkspaceSize``'s default: 32 MiB
  (``4096 KiB x 8``) on compute capability 9.x and newer, ``4096 KiB x 2 + 16 KiB x 8`` before.
  cuBLAS handles are per thread (``DeviceThreadHandlePool``) and autograd runs backward on
  its own device thread, so a training step that runs torch GEMMs in forward and backward on
  one stream (``CUDA_DEVICE_MAX_CONNECTIONS=1``) holds two.
- **Transformer Engine's cuBLAS workspace** (transformer_engine/pytorch/module/base.py,
  ``get_workspace`` / ``get_cublas_workspace_size_bytes``): a ``uint8`` tensor of 32 MiB on
  compute capability >= 9, 4 MiB before, created at the first TE GEMM.
- **Transformer Engine's multi-stream cuBLAS workspaces** (same file,
  ``get_multi_stream_cublas_workspace``): one workspace of that size per cuBLAS stream
  (``num_compute_streams`` = 4, transformer_engine/common/util/multi_stream.h), created at the
  first grouped GEMM. Megatron runs one when its MoE experts are ``TEGroupedMLP``
  (``moe_grouped_gemm`` with the TE spec and not ``moe_use_legacy_grouped_gemm``,
  megatron/core/extensions/transformer_engine_spec_provider.py ``grouped_mlp_modules``);
  transformer_engine/pytorch/module/grouped_linear.py passes them to every grouped GEMM.

These are the only constants of the estimator that are not derived from tensor shapes; each
is the number the named source file uses.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec

KIB = 1024
MIB = 1024 * KIB
# GPU name -> CUDA compute capability major (what the workspace sizes depend on)
GPU_COMPUTE_MAJOR = {
    "a100": 8,
    "a800": 8,
    "a10": 8,
    "l40s": 8,
    "h100": 9,
    "h800": 9,
    "h20": 9,
    "h200": 9,
    "gh200": 9,
    "b200": 10,
    "gb200": 10,
}
ASSUMED_GPU = "h100"  # when the spec names none (stated in the report's assumptions)
TE_WORKSPACE_HOPPER = 32 * MIB
TE_WORKSPACE_OLDER = 4 * MIB
# threads that run torch GEMMs in a training step: the main (forward) thread and autograd's
# backward thread for the device (torch/csrc/autograd/engine.cpp)
TORCH_GEMM_THREADS = 2
TE_CUBLAS_STREAMS = 4  # transformer_engine/common/util/multi_stream.h num_compute_streams
_PAIR = re.compile(r":([0-9]+):([0-9]+)")


def compute_major(gpu: str | None) -> int:
    """Compute capability major of ``gpu`` (``None``: the assumed Hopper GPU)."""
    name = (gpu or ASSUMED_GPU).lower()
    if name not in GPU_COMPUTE_MAJOR:
        raise ValueError(f"gpu {gpu!r} is unknown; use one of {sorted(GPU_COMPUTE_MAJOR)}")
    return GPU_COMPUTE_MAJOR[name]


def torch_cublas_workspace_bytes(major: int, config: str | None) -> int:
    """torch's cuBLAS workspace for one handle and stream (``parseChosenWorkspaceSize``)."""
    default = 4096 * 8 * KIB if major >= 9 else 4096 * 2 * KIB + 16 * 8 * KIB
    if not config:
        return default
    pairs = _PAIR.findall(config)
    if not pairs:  # torch warns and uses its default
        return default
    return sum(int(size) * int(count) * KIB for size, count in pairs)


def te_workspace_bytes(major: int) -> int:
    """Transformer Engine's GEMM workspace (``get_cublas_workspace_size_bytes``)."""
    return TE_WORKSPACE_HOPPER if major >= 9 else TE_WORKSPACE_OLDER


def workspace_terms(spec: TrainingSpec) -> dict[str, int]:
    """The fixed workspaces of one rank of ``spec``, by source (empty on CPU)."""
    if spec.device != "cuda":
        return {}
    major = compute_major(spec.gpu)
    one = torch_cublas_workspace_bytes(major, spec.cublas_workspace_config)
    out = {"torch_cublas_workspaces": TORCH_GEMM_THREADS * one}
    if spec.model.transformer_impl == "transformer_engine":
        out["te_cublas_workspace"] = te_workspace_bytes(major)
        m = spec.model
        if m.num_experts and m.moe_grouped_gemm and not m.moe_use_legacy_grouped_gemm:
            out["te_grouped_gemm_workspaces"] = TE_CUBLAS_STREAMS * te_workspace_bytes(major)
    return out
