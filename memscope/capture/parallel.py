"""This rank's place in the job: rank, world size and the parallel grid (``None`` if unknown).

Framework-neutral: :func:`process_parallel_info` reads ``torch.distributed`` (or the launcher's
environment). Framework adapters fill in their own grid (Megatron's ``parallel_state``: see
``memscope.integrations.megatron.parallel``).
"""

from __future__ import annotations

import os
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


def as_int(value: Any, default: int | None) -> int | None:
    """``int(value)``, or ``default`` when it is missing or not a number."""
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def process_parallel_info() -> ParallelInfo:
    """Rank and world size from ``torch.distributed`` (else ``RANK``/``WORLD_SIZE``); a plain
    data-parallel job as far as anyone can tell."""
    info = ParallelInfo()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        info.rank = torch.distributed.get_rank()
        info.world_size = torch.distributed.get_world_size()
    else:
        info.rank = as_int(os.environ.get("RANK"), 0) or 0
        info.world_size = as_int(os.environ.get("WORLD_SIZE"), 1) or 1
    info.local_rank = as_int(os.environ.get("LOCAL_RANK"), 0) or 0
    info.dp_size = info.world_size
    return info
