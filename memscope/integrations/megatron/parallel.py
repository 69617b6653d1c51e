"""This rank's place in the Megatron parallel grid, from args and ``parallel_state``."""

from __future__ import annotations

import sys
from typing import Any

from memscope.capture.parallel import ParallelInfo, as_int, process_parallel_info


def megatron_parallel_info(args: Any = None) -> ParallelInfo:
    """Rank and world size from torch.distributed, the grid from Megatron's ``args`` and, once
    it is initialised, ``megatron.core.parallel_state`` (which wins)."""
    info = process_parallel_info()
    if args is not None:
        info.tp_size = as_int(getattr(args, "tensor_model_parallel_size", None), 1) or 1
        info.pp_size = as_int(getattr(args, "pipeline_model_parallel_size", None), 1) or 1
        info.cp_size = as_int(getattr(args, "context_parallel_size", None), 1) or 1
        info.ep_size = as_int(getattr(args, "expert_model_parallel_size", None), 1) or 1
        info.vpp_size = as_int(getattr(args, "virtual_pipeline_model_parallel_size", None), None)
        info.dp_size = as_int(getattr(args, "data_parallel_size", None), None) or max(
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
