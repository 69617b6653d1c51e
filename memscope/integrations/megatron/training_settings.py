"""What a Megatron run's report says about its training, from Megatron's args: the settings
its memory depends on (the report's ``training`` section) and its dtype and versions
(``metadata``)."""

from __future__ import annotations

from typing import Any

from memscope._version import package_version
from memscope.capture.parallel import ParallelInfo

#: ``training.static_spec`` when the static comparison's spec is built from the run's args.
SPEC_FROM_ARGS = "this run's Megatron args"
#: ... when the attached megatron-core model gives its own settings and the args the rest.
SPEC_FROM_MODEL = "the attached model (TransformerConfig, module classes), then this run's args"


def _int(args: Any, name: str) -> int | None:
    value = getattr(args, name, None)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def num_microbatches(args: Any, dp_size: int | None) -> int | None:
    """Microbatches per step: ``args.num_microbatches`` when set, else the global batch over
    micro-batch size times data-parallel size (when that divides)."""
    given = _int(args, "num_microbatches")
    if given is not None:
        return given
    gbs, mbs = _int(args, "global_batch_size"), _int(args, "micro_batch_size")
    if gbs is None or not mbs or not dp_size or gbs % (mbs * dp_size):
        return None
    return gbs // (mbs * dp_size)


def dtype_name(args: Any) -> str:
    """Training dtype from Megatron args (``bf16`` / ``fp16`` flags, else ``params_dtype``)."""
    if getattr(args, "bf16", False):
        return "bfloat16"
    if getattr(args, "fp16", False):
        return "float16"
    dtype = getattr(args, "params_dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else "float32"


def framework_metadata(args: Any, layer_numbers: dict[str, int]) -> dict[str, Any]:
    """The report metadata's Megatron facts: dtype, megatron-core's version, and the global
    layer numbers where they differ from the names' local ones."""
    return {
        "dtype": dtype_name(args),
        "megatron_core_version": package_version("megatron-core"),
        **({"layer_numbers": layer_numbers} if layer_numbers else {}),
    }


def training_settings(args: Any, parallel: ParallelInfo, static_spec: str | None) -> dict[str, Any]:
    """Sequence length, micro-batch size, global batch, microbatches per step, data-parallel
    size, recompute settings and where the static comparison's spec came from (``None``: no
    static comparison). A setting the args do not have is ``None``."""
    granularity = getattr(args, "recompute_granularity", None) or None
    method = getattr(args, "recompute_method", None) if granularity else None
    mbs, microbatches = _int(args, "micro_batch_size"), num_microbatches(args, parallel.dp_size)
    global_batch = _int(args, "global_batch_size")
    if global_batch is None and mbs and microbatches and parallel.dp_size:
        global_batch = mbs * microbatches * parallel.dp_size  # what one step consumes
    return {
        "seq_length": _int(args, "seq_length"),
        "micro_batch_size": mbs,
        "global_batch_size": global_batch,
        "num_microbatches": microbatches,
        "data_parallel_size": parallel.dp_size,
        "recompute_granularity": None if granularity is None else str(granularity),
        "recompute_method": None if method is None else str(method),
        "recompute_num_layers": _int(args, "recompute_num_layers") if granularity else None,
        "static_spec": static_spec,
    }
