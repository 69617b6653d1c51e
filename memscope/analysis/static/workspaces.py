"""Fixed GPU-resident workspaces: allocated once through the caching allocator, kept forever.

Each size below is what the named source computes from the GPU's compute capability
(``major.minor``); :data:`GPU_COMPUTE_CAPABILITY` maps the GPU names a spec may give to it.

- **torch's cuBLAS workspace**, one per (thread, stream) that ran a GEMM
  (aten/src/ATen/cuda/CublasHandlePool.cpp: ``setCublasWorkspace`` allocates
  ``getChosenWorkspaceSize()`` through ``CUDACachingAllocator``). Its size is
  ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT`` pairs, SIZE in KiB, summed) when set, else
  ``parseChosenWorkspaceSize``'s default: 32 MiB (``4096 KiB x 8``) or ``4096 KiB x 2 +
  16 KiB x 8``. Which capabilities get 32 MiB depends on torch: up to torch 2.10 only
  compute capability 9.0 exactly (``major == 9 && minor == 0``, pytorch/pytorch#89027);
  from torch 2.11 majors 9, 10 and 12 (pytorch/pytorch#175344, "32MiB for Hopper and
  Blackwell"). Any other capability (8.x, 11.x, 9.x before 2.11 with minor != 0) gets
  8.125 MiB. (PyTorch's main branch later also gives major 11 32 MiB; whether 2.13 does is not
  checked here: its CPU wheel ships the headers only. Those headers key the workspaces by
  (handle, stream) and have no ``CUDABlasHandleWithWorkspace``, i.e. 2.13 still allocates them
  through the caching allocator per thread, as counted below.)
  cuBLAS handles and their workspaces are per thread and autograd runs backward
  on its own device thread, so a training step that runs torch GEMMs in forward and backward
  on one stream (``CUDA_DEVICE_MAX_CONNECTIONS=1``) holds two.
- **torch's cuBLASLt workspace**: with the unified workspaces torch builds by default
  (``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` unset, same file ``getCUDABlasLtWorkspace``), a
  cuBLASLt GEMM uses the cuBLAS workspace of its (thread, stream): nothing more.
- **Transformer Engine's cuBLAS workspace** (transformer_engine/pytorch/module/base.py,
  ``get_workspace`` / ``get_cublas_workspace_size_bytes``; later TE releases moved it to
  cpp_extensions/gemm.py): a ``uint8`` tensor of 32 MiB when the major is 9 or more (Hopper,
  Blackwell, every later GPU), 4 MiB before, created at the first TE GEMM. (Newer TE adds
  1 KiB of scale/alignment room for NVFP4, below what these estimates resolve.)
- **The MoE router's GEMM through Transformer Engine, also with the local spec**
  (megatron/core/transformer/moe/moe_utils.py ``RouterGatingLinearFunction``, since
  megatron-core 0.13): the gating GEMM and its backward call megatron's ``te_general_gemm``
  (megatron/core/extensions/transformer_engine.py) whenever Transformer Engine imports and the
  router dtype is not fp64, so a local-spec MoE run holds TE's GEMM workspace too. Assumed:
  TE is installed (Megatron-LM's containers pin it). Evidence it is real: the golden steady
  allocation of Megatron-LM's local-spec ``gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel`` is
  32 MiB higher in the refreshes after that change (2025-06-14, 0f058666) than before, 32 MiB
  lower again while megatron's wrapper failed to import against TE without
  ``module.base.get_workspace`` (NGC 26.02, fixed by d3528a21, 2026-03-06), and higher since.
- **Transformer Engine's multi-stream cuBLAS workspaces** (same file,
  ``get_multi_stream_cublas_workspace``): one workspace of that size per cuBLAS stream
  (``num_compute_streams`` = 4, transformer_engine/common/util/multi_stream.h), created at the
  first grouped GEMM. Megatron runs one when its MoE experts are ``TEGroupedMLP``
  (``moe_grouped_gemm`` with the TE spec and not ``moe_use_legacy_grouped_gemm``,
  megatron/core/extensions/transformer_engine_spec_provider.py ``grouped_mlp_modules``);
  transformer_engine/pytorch/module/grouped_linear.py passes them to every grouped GEMM.
- **Transformer Engine's userbuffer GEMM workspace** (``tp_comm_overlap``: Megatron's
  ``initialize_tp_communicators`` calls TE's ``initialize_ub`` and gives its TE linears the
  ``ub_*`` options): a GEMM overlapped with a TP collective splits over up to
  ``_NUM_MAX_UB_STREAMS`` = 3 compute streams and needs that many workspaces. From TE 2.11
  (NVIDIA/TransformerEngine#2377, cpp_extensions/gemm.py ``get_cublas_workspace(device, ub,
  grouped_gemm)``, cached per argument tuple) a GEMM with ``ub`` gets its own ``uint8``
  tensor of 3 x the workspace size beside the one the other GEMMs use (TE still runs those:
  a row-parallel linear's weight gradient has no ``ub``); up to TE 2.10
  (module/base.py ``initialize_ub``) the one workspace is replaced by a 3x ``repeat`` of it,
  2 x the size more. The userbuffers themselves are ``cudaMalloc``ed by TE
  (common/comm_gemm_overlap, ``register_user_buffer_collective``), outside PyTorch's caching
  allocator, like NCCL's buffers: not in the estimate.

These are the only constants of the estimator that are not derived from tensor shapes; each
is the number the named source file uses.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from memscope.analysis.static.megatron_versions import grouped_gemm_experts, legacy_grouped_mlp

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec

KIB = 1024
MIB = 1024 * KIB
# GPU name -> CUDA compute capability (major, minor): what the workspace sizes depend on
GPU_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "a100": (8, 0),
    "a800": (8, 0),
    "a10": (8, 6),
    "l40s": (8, 9),
    "h100": (9, 0),
    "h800": (9, 0),
    "h20": (9, 0),
    "h200": (9, 0),
    "gh200": (9, 0),
    "b200": (10, 0),
    "gb200": (10, 0),
    "b300": (10, 3),
    "rtx_pro_6000": (12, 0),
}
ASSUMED_GPU = "h100"  # when the spec names none (stated in the report's assumptions)
# the torch whose workspace rule applies: the version CI pins (README); stated in
# docs/static-estimator.md
ASSUMED_TORCH = (2, 13)
# the first torch whose default gives 32 MiB to majors 9, 10 and 12 (pytorch/pytorch#175344)
TORCH_BLACKWELL_WORKSPACE_SINCE = (2, 11)
TORCH_32MIB = 4096 * 8 * KIB  # parseChosenWorkspaceSize: ":4096:8"
TORCH_OLDER = 4096 * 2 * KIB + 16 * 8 * KIB  # ":4096:2:16:8"
TE_WORKSPACE_HOPPER = 32 * MIB
TE_WORKSPACE_OLDER = 4 * MIB
# threads that run torch GEMMs in a training step: the main (forward) thread and autograd's
# backward thread for the device (torch/csrc/autograd/engine.cpp)
TORCH_GEMM_THREADS = 2
TE_CUBLAS_STREAMS = 4  # transformer_engine/common/util/multi_stream.h num_compute_streams
# transformer_engine/pytorch/cpp_extensions/gemm.py (module/base.py up to TE 2.10)
TE_UB_STREAMS = 3  # _NUM_MAX_UB_STREAMS
# the first TE whose userbuffer GEMMs get a workspace of their own (NVIDIA/TransformerEngine
# #2377, in v2.11); the one assumed is what Megatron-LM's main branch pins (pyproject.toml at
# d98e8a64: TE rev 4329ff84, build_tools/VERSION.txt 2.17.1), stated in docs/static-estimator.md
TE_SEPARATE_UB_WORKSPACE_SINCE = (2, 11)
ASSUMED_TE = (2, 17)
_PAIR = re.compile(r":([0-9]+):([0-9]+)")
# "2.14.0", "2.2.0.dev0", "2.6.0a0", "2.13.0+abc": major, minor, patch, and what follows
_TE_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?(.*)$")
#: ``transformer_engine_version`` of a run without Transformer Engine installed
TE_NOT_INSTALLED = "none"


def _says_none(version: str | None) -> bool:
    """Whether a Transformer Engine ``version`` says the run has none (:data:`TE_NOT_INSTALLED`)."""
    return version is not None and version.strip().lower() == TE_NOT_INSTALLED


def te_release_at_least(version: str | None, first: tuple[int, ...]) -> bool:
    """Whether Transformer Engine ``version`` (None: :data:`ASSUMED_TE`;
    :data:`TE_NOT_INSTALLED`: none, so no release) is release ``first`` (major, minor[,
    patch]) or later; a pre-release of ``first`` (``dev``, ``a``, ``b``, ``rc``) is not."""
    if version is None:
        return first <= ASSUMED_TE
    if _says_none(version):
        return False
    match = _TE_VERSION.match(version)
    if not match:
        raise ValueError(
            f"transformer_engine_version {version!r} is not a release number (or "
            f"{TE_NOT_INSTALLED!r})"
        )
    have = (int(match[1]), int(match[2]), int(match[3] or 0))
    wanted = (*first, 0, 0)[:3]
    pre = re.match(r"^\.?(dev|a|b|rc)\d*", match[4]) is not None
    return have > wanted or (have == wanted and not pre)


def te_installed(spec: TrainingSpec) -> bool:
    """Whether the run has Transformer Engine (assumed unless the spec says it has none)."""
    return not _says_none(spec.transformer_engine_version)


def compute_capability(gpu: str | None) -> tuple[int, int]:
    """Compute capability of ``gpu`` (``None``: the assumed Hopper GPU)."""
    name = (gpu or ASSUMED_GPU).lower()
    if name not in GPU_COMPUTE_CAPABILITY:
        raise ValueError(f"gpu {gpu!r} is unknown; use one of {sorted(GPU_COMPUTE_CAPABILITY)}")
    return GPU_COMPUTE_CAPABILITY[name]


def compute_major(gpu: str | None) -> int:
    """Compute capability major of ``gpu`` (``None``: the assumed Hopper GPU)."""
    return compute_capability(gpu)[0]


def check_machine(gpu: str | None, transformer_engine_version: str | None) -> None:
    """Refuse an unknown GPU name or a Transformer Engine release that is not one
    (``ValueError``); ``None`` is the assumed one."""
    compute_capability(gpu)
    te_release_at_least(transformer_engine_version, (0, 0))


def gpu_words(gpu: str | None) -> str:
    """The GPU an estimate follows and what it sizes, in the reports' words."""
    name = f"{ASSUMED_GPU.upper()} assumed" if gpu is None else gpu
    return f"{name} (it sizes the fixed cuBLAS and Transformer Engine workspaces)"


def te_words(transformer_engine_version: str | None) -> str:
    """The Transformer Engine release an estimate follows and what it sizes, in the
    reports' words."""
    te = transformer_engine_version
    if _says_none(te):
        return f"{TE_NOT_INSTALLED}: not installed (no TE workspaces or placeholder gradients)"
    name = "{}.{} assumed".format(*ASSUMED_TE) if te is None else te
    return f"{name} (its workspaces and cached placeholder gradients)"


def torch_default_workspace_bytes(
    capability: tuple[int, int], torch_version: tuple[int, int] = ASSUMED_TORCH
) -> int:
    """``parseChosenWorkspaceSize``'s default for ``capability`` under ``torch_version``."""
    major, minor = capability
    if torch_version >= TORCH_BLACKWELL_WORKSPACE_SINCE:
        big = major in (9, 10, 12)
    else:
        big = (major, minor) == (9, 0)
    return TORCH_32MIB if big else TORCH_OLDER


def torch_cublas_workspace_bytes(
    capability: tuple[int, int],
    config: str | None,
    torch_version: tuple[int, int] = ASSUMED_TORCH,
) -> int:
    """torch's cuBLAS workspace for one thread and stream (``parseChosenWorkspaceSize``)."""
    default = torch_default_workspace_bytes(capability, torch_version)
    if not config:
        return default
    pairs = _PAIR.findall(config)
    if not pairs:  # torch warns and uses its default
        return default
    return sum(int(size) * int(count) * KIB for size, count in pairs)


def te_workspace_bytes(capability: tuple[int, int]) -> int:
    """Transformer Engine's GEMM workspace (``get_cublas_workspace_size_bytes``: major >= 9)."""
    return TE_WORKSPACE_HOPPER if capability[0] >= 9 else TE_WORKSPACE_OLDER


def te_userbuffer_workspace_bytes(
    capability: tuple[int, int], te_version: str | None = None
) -> int:
    """What ``tp_comm_overlap`` adds to Transformer Engine's GEMM workspaces: a separate
    ``_NUM_MAX_UB_STREAMS`` x workspace from TE 2.11, else the one workspace grown to that
    many (see the module docstring); ``te_version`` None: :data:`ASSUMED_TE`."""
    one = te_workspace_bytes(capability)
    if te_release_at_least(te_version, TE_SEPARATE_UB_WORKSPACE_SINCE):
        return TE_UB_STREAMS * one
    return (TE_UB_STREAMS - 1) * one


def workspace_terms(spec: TrainingSpec) -> dict[str, int]:
    """The fixed workspaces of one rank of ``spec``, by source (empty on CPU)."""
    if spec.device != "cuda":
        return {}
    capability = compute_capability(spec.gpu)
    one = torch_cublas_workspace_bytes(capability, spec.cublas_workspace_config)
    out = {"torch_cublas_workspaces": TORCH_GEMM_THREADS * one}
    router_through_te = (
        spec.model.num_experts and spec.model.moe_router_dtype != "fp64" and te_installed(spec)
    )
    if spec.model.transformer_impl == "local" and router_through_te:
        out["te_cublas_workspace"] = te_workspace_bytes(capability)  # the router's GEMM
    if spec.model.transformer_impl == "transformer_engine":
        out["te_cublas_workspace"] = te_workspace_bytes(capability)
        if spec.tp_comm_overlap and spec.parallel.tp > 1:  # TE linears get userbuffers
            out["te_userbuffer_gemm_workspace"] = te_userbuffer_workspace_bytes(
                capability, spec.transformer_engine_version
            )
        m = spec.model
        if m.num_experts and grouped_gemm_experts(m) and not legacy_grouped_mlp(m):
            out["te_grouped_gemm_workspaces"] = TE_CUBLAS_STREAMS * te_workspace_bytes(capability)
    return out
