"""Checks of a training spec before the estimator runs.

Two kinds of findings:

* a **refusal**: a ``ValueError`` whose one-line message names the field (a size that is zero
  or negative, a contradiction Megatron itself would assert, a size beyond what the estimator
  can list in reasonable time);
* a **warning** (:class:`ConfigWarning`, through :mod:`warnings`): the config is estimated,
  but something in it is suspicious (an absurd size). ``memscope analyze-static`` prints each
  as one line.

Turning what a file or a namespace holds into typed values is :mod:`memscope.inputs`' job.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec

# Sizes the estimator can list in reasonable time (refused beyond): the report lists every
# global rank and every parameter tensor of every (tp, pp) position.
MAX_LAYERS = 4096  # about 20x the deepest published model
MAX_WORLD_SIZE = 1 << 20
MAX_PARAM_TENSORS = 2_000_000  # parameter tensors over all (tp, pp) positions
# Above these a size is legal but absurd for a real model (a warning, the estimate is made).
SANE_MAX = {
    "hidden_size": 1 << 18,
    "ffn_hidden_size": 1 << 21,
    "moe_ffn_hidden_size": 1 << 21,
    "num_attention_heads": 1 << 12,
    "kv_channels": 1 << 14,
    "seq_length": 1 << 24,
    "vocab_size": 1 << 23,
    "num_experts": 1 << 14,
    "micro_batch_size": 1 << 14,
}
SANE_PEAK_BYTES = 1 << 50  # 1 PiB on one rank: far beyond any accelerator


class ConfigWarning(UserWarning):
    """Something in the config is suspicious; the estimate is still made."""


def warn(message: str) -> None:
    """Emit one :class:`ConfigWarning` (one line)."""
    warnings.warn(ConfigWarning(message), stacklevel=3)


def show(value: Any) -> str:
    """A short, one-line, always-printable description of ``value``."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**30 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple, set)):
        return "a list"
    if isinstance(value, float):
        return repr(value)
    try:
        text = repr(value)
    except Exception:  # any object: describe its type instead
        return type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------------
# The spec as a whole


def check_sizes(spec: TrainingSpec) -> None:
    """Sizes that must be positive (those ``validate`` does not already check), dropout
    probabilities, the layer count the estimator lists."""
    m, p = spec.model, spec.parallel
    for name in ("num_query_groups", "ffn_hidden_size", "kv_channels", "max_position_embeddings"):
        value = getattr(m, name)
        if value is not None and value < 1:
            raise ValueError(f"model.{name} must be positive, got {value}")
    if m.num_layers > MAX_LAYERS:
        raise ValueError(
            f"model.num_layers ({m.num_layers}) is beyond the {MAX_LAYERS} layers the static "
            "estimator lists"
        )
    for name in ("hidden_dropout", "attention_dropout"):
        value = getattr(m, name)
        if not 0.0 <= value <= 1.0:  # also false for nan
            raise ValueError(f"model.{name} must be in [0, 1], got {value}")
    if p.vpp is not None and p.vpp < 1:
        raise ValueError(f"parallel.vpp must be >= 1, got {p.vpp}")
    for tp, dp in p.stage_meshes or ():
        if tp < 1 or dp < 1:
            raise ValueError(f"parallel.stage_meshes: tp and dp must be >= 1, got ({tp}, {dp})")


def check_sharding(spec: TrainingSpec) -> None:
    """Widths Megatron's parallel linear layers and context parallelism split (megatron-core
    ``tensor_parallel.layers`` divides a sharded width by tp; Megatron's ``validate_args``
    wants the sequence split in 2 x cp chunks)."""
    m, p = spec.model, spec.parallel
    for tp in sorted({p.tp} | {tp for tp, _ in p.stage_meshes or ()}):
        if m.ffn % tp:
            raise ValueError(
                f"parallel.tp ({tp}) must divide model.ffn_hidden_size ({m.ffn}) "
                "(megatron-core shards the MLP over tp)"
            )
        if p.sequence_parallel and m.seq_length % tp:
            raise ValueError(
                f"parallel.tp ({tp}) must divide model.seq_length ({m.seq_length}) with "
                "sequence parallelism"
            )
    if p.cp > 1 and m.seq_length % (2 * p.cp):
        raise ValueError(
            f"model.seq_length ({m.seq_length}) must be a multiple of 2 x parallel.cp "
            f"({2 * p.cp}) (Megatron's load-balanced context parallelism)"
        )


def check_scale(spec: TrainingSpec) -> None:
    """Refuse what the estimator cannot list in reasonable time; warn about absurd sizes."""
    m, p = spec.model, spec.parallel
    world = p.world_size
    if world > MAX_WORLD_SIZE:
        raise ValueError(
            f"parallel: world size {world} (tp x pp x cp x dp) is beyond the {MAX_WORLD_SIZE} "
            "ranks the static report lists"
        )
    local_experts = (m.num_experts or 0) // max(p.ep, 1)
    per_layer = 16 + 3 * (0 if m.moe_grouped_gemm else local_experts)
    tensors = sum(p.stage_sizes(s)[0] for s in range(p.pp)) * (
        -(-m.num_layers // p.pp) * per_layer + 16
    )
    if tensors > MAX_PARAM_TENSORS:
        raise ValueError(
            f"model.num_layers x num_experts / parallel.ep x tp x pp: about {tensors:,} parameter "
            f"tensors to list, beyond the static estimator's {MAX_PARAM_TENSORS:,}"
        )
    values = {
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn,
        "num_attention_heads": m.num_attention_heads,
        "kv_channels": m.head_dim,
        "seq_length": m.seq_length,
        "vocab_size": m.vocab_size,
        "num_experts": m.num_experts or 0,
        "moe_ffn_hidden_size": m.moe_ffn if m.num_experts else 0,
        "micro_batch_size": spec.micro_batch_size,
    }
    for name, value in values.items():
        if value > SANE_MAX[name]:
            where = "training" if name == "micro_batch_size" else "model"
            warn(
                f"{where}.{name} ({value:,}) is larger than any real model's "
                f"(> {SANE_MAX[name]:,}); check the config"
            )


def peak_warnings(peak_bytes: int, rank: int) -> list[str]:
    """A warning when one rank's estimated peak is beyond any device's memory."""
    if peak_bytes <= SANE_PEAK_BYTES:
        return []
    pib = peak_bytes / SANE_PEAK_BYTES if peak_bytes < 1 << 1000 else math.inf
    return [
        f"the estimated peak of rank {rank} is {pib:,.3g} PiB, beyond any accelerator's "
        "memory: check the model sizes and the parallel layout"
    ]


def check_batch(gbs: int | None, mbs: int, dp: int, microbatches: int | None) -> int:
    """The number of microbatches: ``global_batch_size / (micro_batch_size x dp)``, which
    Megatron requires to be a whole number >= 1 (megatron-core
    ``num_microbatches_calculator.ConstantNumMicroBatchesCalculator``), else
    ``num_microbatches``."""
    if mbs < 1:
        raise ValueError(f"training.micro_batch_size must be >= 1, got {mbs}")
    if gbs is None:
        count = 1 if microbatches is None else microbatches
        if count < 1:
            raise ValueError(f"training.num_microbatches must be >= 1, got {count}")
        return count
    if gbs < 1:
        raise ValueError(f"training.global_batch_size must be >= 1, got {gbs}")
    if gbs % (mbs * dp):
        raise ValueError(
            f"training.global_batch_size ({gbs}) must be a multiple of micro_batch_size x "
            f"parallel.dp ({mbs} x {dp})"
        )
    return gbs // (mbs * dp)
