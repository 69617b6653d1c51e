"""This rank's place in the Megatron parallel grid, from args and ``parallel_state``."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass
class ParallelInfo:
    """Rank, world size and parallel sizes/ranks (``None`` when unknown)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    cp_size: int = 1
    ep_size: int = 1
    vpp_size: int | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    dp_rank: int | None = None
    cp_rank: int | None = None
    ep_rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: Any, default: int | None) -> int | None:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def discover_parallel_info(args: Any = None) -> ParallelInfo:
    """Read the grid from torch.distributed, megatron ``parallel_state`` and ``args``."""
    info = ParallelInfo()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        info.rank = torch.distributed.get_rank()
        info.world_size = torch.distributed.get_world_size()
    else:
        info.rank = _int(os.environ.get("RANK"), 0) or 0
        info.world_size = _int(os.environ.get("WORLD_SIZE"), 1) or 1
    info.local_rank = _int(os.environ.get("LOCAL_RANK"), 0) or 0
    if args is not None:
        info.tp_size = _int(getattr(args, "tensor_model_parallel_size", None), 1) or 1
        info.pp_size = _int(getattr(args, "pipeline_model_parallel_size", None), 1) or 1
        info.cp_size = _int(getattr(args, "context_parallel_size", None), 1) or 1
        info.ep_size = _int(getattr(args, "expert_model_parallel_size", None), 1) or 1
        info.vpp_size = _int(getattr(args, "virtual_pipeline_model_parallel_size", None), None)
        info.dp_size = _int(getattr(args, "data_parallel_size", None), None) or max(
            1, info.world_size // (info.tp_size * info.pp_size * info.cp_size)
        )
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None:  # megatron not in use here: importing it would only cost start-up time
        return info
    try:
        if not ps.model_parallel_is_initialized():
            return info
        info.tp_size = ps.get_tensor_model_parallel_world_size()
        info.pp_size = ps.get_pipeline_model_parallel_world_size()
        info.dp_size = ps.get_data_parallel_world_size()
        info.tp_rank = ps.get_tensor_model_parallel_rank()
        info.pp_rank = ps.get_pipeline_model_parallel_rank()
        info.dp_rank = ps.get_data_parallel_rank()
        info.cp_size = ps.get_context_parallel_world_size()
        info.cp_rank = ps.get_context_parallel_rank()
        info.ep_size = ps.get_expert_model_parallel_world_size()
        info.ep_rank = ps.get_expert_model_parallel_rank()
        vpp = ps.get_virtual_pipeline_model_parallel_world_size()
        info.vpp_size = vpp if vpp is not None else info.vpp_size
    except Exception:  # partially initialised grids: keep what we have
        pass
    return info


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
