"""Megatron-FSDP (``use_megatron_fsdp``, ``data_parallel_sharding_strategy``) and torch FSDP2
(``use_torch_fsdp2``): what each shards over data parallel, and the unsharded buffers in
flight during forward and backward.

Megatron-FSDP, megatron-core 0.16.1 ``distributed/fsdp/src/megatron_fsdp/
param_and_grad_buffer.py`` ``ParamAndGradBuffer._init_each_parameter_group_buffers``: per
parameter group a compute-weight buffer (parameter dtype; sharded under
``optim_grads_params``), an fp32 main-weight buffer (``preserve_fp32_weights``; sharded under
every strategy but ``no_shard``) and a main-gradient buffer (fp32 with
``grad_reduce_in_fp32``, else the parameter dtype; sharded under ``optim_grads`` and
``optim_grads_params``); the optimizer's moments follow the main weights. Temporaries:
``megatron_fsdp.py`` all-gathers a unit's bucket and prefetches further buckets up to
``suggested_AG_prefetch_size`` elements, which is half of ``suggested_communication_unit_size``
and that is at least 1e9 (``max(1_000_000_000, ...)``); the backward starts with a prefetch
in backward order (``_root_pre_backward``). So a rank's whole parameter set up to 5e8 elements
is unsharded at the start of the backward. Reduce-scatter buckets are freed when the queue
passes ``suggested_RS_queue_capacity`` (the same >= 1e9), i.e. the unsharded gradients of
units already back-propagated stay until the backward ends; at the backward's start the
first unit's (the output layer's) full gradient bucket is alive.

torch FSDP2, megatron-core ``distributed/torch_fully_sharded_data_parallel.py``:
``fully_shard`` on every ``TransformerLayer``, ``LanguageModelEmbedding``,
``RotaryEmbedding``, the output ``ColumnParallelLinear`` (not with the local spec) and the
root, ``reshard_after_forward=True``: parameters, gradients and optimizer state sharded over
dp x cp; one unit unsharded plus the next one prefetched (torch
``distributed/fsdp/_fully_shard``), and a unit's unsharded gradient until its reduce-scatter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memscope.analysis.static.megatron_versions import (
    megatron_fsdp_grad_bytes,
    megatron_fsdp_loss_regather,
)

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec
    from memscope.analysis.static.params import ParamTensor

FSDP_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
AG_PREFETCH_ELEMENTS = 500_000_000  # megatron_fsdp.py: max(1e9, suggested) // 2


@dataclass(frozen=True)
class Sharding:
    """What a data-parallel rank keeps only its share of."""

    params: bool
    grads: bool
    optimizer: bool


def sharding(spec: TrainingSpec) -> Sharding | None:
    """The sharding of ``spec``'s FSDP, or None without FSDP (Megatron's DDP)."""
    if spec.torch_fsdp2:
        return Sharding(params=True, grads=True, optimizer=True)
    if spec.fsdp is None:
        return None
    level = FSDP_STRATEGIES.index(spec.fsdp)
    return Sharding(params=level >= 3, grads=level >= 2, optimizer=level >= 1)


def shard_bytes(spec: TrainingSpec, params: list[ParamTensor], per_element: float) -> int:
    """Bytes of ``params`` at ``per_element`` on one data-parallel rank: dense tensors over
    dp x cp, expert tensors over the expert-data-parallel group (the padding of each buffer
    to the group size is not counted)."""
    p = spec.parallel
    dense = sum(t.numel for t in params if not t.expert)
    expert = sum(t.numel for t in params if t.expert)
    return int(-(-dense * per_element // (p.dp * p.cp)) + -(-expert * per_element // p.expert_dp))


def _units(spec: TrainingSpec, params: list[ParamTensor]) -> list[int]:
    """Elements of each FSDP unit on this rank: one per decoder/MTP layer, the rest (the
    embedding, the output layer, norms) as Megatron-FSDP's non-unit groups or FSDP2's
    embedding/output units."""
    layers, rest = _split_units(spec, params)
    return layers + list(rest.values())


def _split_units(spec: TrainingSpec, params: list[ParamTensor]) -> tuple[list[int], dict[str, int]]:
    """:func:`_units` as (the decoder/MTP layers' units, the rest by name)."""
    layers: dict[str, int] = {}
    rest: dict[str, int] = {}
    for t in params:
        head = t.name.split(".transformer_layer")[0] if ".mtp." in t.name else t.name
        parts = head.split(".")
        if "layers" in parts:
            key = ".".join(parts[: parts.index("layers") + 2])
            layers[key] = layers.get(key, 0) + t.numel
        else:
            key = "output_layer" if "output_layer" in t.name else "embedding"
            if spec.model.transformer_impl == "local" and spec.torch_fsdp2:
                key = "root"  # the local spec's output layer is not wrapped: the root unit
            rest[key] = rest.get(key, 0) + t.numel
    return list(layers.values()), rest


@dataclass(frozen=True)
class InFlight:
    """Unsharded FSDP buffers beyond the shards :func:`.terms.persistent_terms` counts, by
    moment of the step."""

    layers: int = 0  # at the decoder layers' backward
    loss: int = 0  # at the last stage's loss (cross entropy), before any unit's backward
    output_layer: int = 0  # at the output layer's backward
    after_step: int = 0  # between steps (the next forward's parameter prefetch)


def in_flight(spec: TrainingSpec, params: list[ParamTensor]) -> InFlight:
    """FSDP's unsharded parameters and gradients at each moment (see the module docstring).

    Megatron-FSDP (megatron_fsdp.py, megatron-core 0.16.1 and 0.19.2): the decoder layers'
    backward holds every bucket in the backward prefetch window and the first unit's gradient
    (:func:`unsharded_bytes`). Each ``TransformerLayer`` unit's ``_post_forward`` releases its
    bucket after its forward (``release_module_parameters``, not lazy outside recompute), and
    its backward all-gather (``_pre_backward_param_unshard``, a grad hook on the unit's
    output) fires only once the loss and the output layer have back-propagated. The non-unit
    groups (embedding, output layer, final norm) have no release hook and stay gathered.
    Before megatron-core 0.18 the last stage's final norm all-gathers the released layers
    again, within the forward prefetch window, just before the loss
    (:func:`.megatron_versions.megatron_fsdp_loss_regather`); they stay until their own
    backward. At the output layer's backward its gradient bucket comes beside them. Between
    steps, with ``overlap_param_gather``, ``start_param_sync`` all-gathers the first bucket
    with forward prefetch (``all_gather_and_wait_parameters_ready(prefetch=True)``), i.e.
    every bucket in the window, for the next forward. torch FSDP2: its units' in-flight set at
    every moment.

    Not counted: under ``optim_grads_params`` Megatron-FSDP turns ``overlap_param_gather``
    on itself (``MegatronFSDP.__init__``), so ``start_param_sync`` prefetches every bucket
    after each step whether or not the run asked for it (megatron-core's code on CPU leaves
    them all allocated); the estimate counts that only when the run sets
    ``overlap_param_gather``, because the published steady allocations of the two runs that
    do not (the ZeRO-3 GPT and MoE functional tests) are the shards alone. And at 0.18 and
    later the first step's forward still re-gathers (no backward has marked the final norm
    yet), which their first steps' peaks do not show either."""
    shard = sharding(spec)
    if shard is None or spec.parallel.dp * spec.parallel.cp == 1:
        return InFlight()
    layers = unsharded_bytes(spec, params)
    if spec.torch_fsdp2:
        return InFlight(layers=layers, loss=layers, output_layer=layers)
    prec = spec.precision
    unit_layers, rest = _split_units(spec, params)
    units = _units(spec, params)
    root = sum(rest.values()) * prec.param_bytes if shard.params else 0
    grad_bytes = 4 if prec.grads_in_fp32 else prec.param_bytes
    output_grad = rest.get("output_layer", 0) * grad_bytes if shard.grads else 0
    gathered = min(sum(units), AG_PREFETCH_ELEMENTS + max(units)) * prec.param_bytes
    prefetched = gathered if shard.params and spec.fsdp_overlap_param_gather else 0
    again = _regathered(spec, params, unit_layers) if shard.params else 0
    loss = root + again * prec.param_bytes
    return InFlight(layers=layers, loss=loss, output_layer=loss + output_grad,
                    after_step=prefetched)  # fmt: skip


def _regathered(spec: TrainingSpec, params: list[ParamTensor], unit_layers: list[int]) -> int:
    """Elements of the decoder layers the final norm's forward prefetch all-gathers again
    before the loss (before megatron-core 0.18; on the stage that has the final norm): the
    layer buckets in order until the prefetch passes ``suggested_AG_prefetch_size``
    (``param_and_grad_buffer.py`` ``AllGatherPipeline.all_gather_params``). ``unit_layers``:
    the layers' units, :func:`_split_units`."""
    if not megatron_fsdp_loss_regather(spec.model):
        return 0
    if not any(".final_layernorm." in t.name for t in params):
        return 0
    out = 0
    for unit in unit_layers:
        if out >= AG_PREFETCH_ELEMENTS:
            break
        out += unit
    return out


def unsharded_bytes(spec: TrainingSpec, params: list[ParamTensor]) -> int:
    """Unsharded parameters and gradients in flight at the start of the backward (beyond
    the shards :func:`.terms.persistent_terms` counts)."""
    shard = sharding(spec)
    if shard is None or spec.parallel.dp * spec.parallel.cp == 1:
        return 0
    prec = spec.precision
    units = _units(spec, params)
    grad_bytes = 4 if prec.grads_in_fp32 else prec.param_bytes  # torch FSDP2's bucket
    if not spec.torch_fsdp2:
        grad_bytes = megatron_fsdp_grad_bytes(spec)
    gathered = 0
    if shard.params and spec.torch_fsdp2:  # the unit in use and the prefetched next one
        gathered = sum(sorted(units)[-2:]) * prec.param_bytes
    elif shard.params:  # every bucket within the prefetch window
        gathered = min(sum(units), AG_PREFETCH_ELEMENTS + max(units)) * prec.param_bytes
    grads = max(units) * grad_bytes if shard.grads else 0
    return gathered + grads
