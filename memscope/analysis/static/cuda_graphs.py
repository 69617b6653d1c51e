"""Transformer Engine CUDA graphs (``cuda_graph_impl=transformer_engine``; before megatron-core
0.16 ``--external-cuda-graph``): what they change in ``torch.cuda.memory_allocated``.

Read from Megatron-LM d98e8a64 (megatron-core 0.20) ``megatron/core/transformer/cuda_graphs.py``
(``TECudaGraphHelper``) and ``transformer_layer.py``, ``megatron/training/training.py``, and
Transformer Engine's ``transformer_engine/pytorch/graph.py`` (``make_graphed_callables``):

- **What is graphed.** Each decoder layer's graphed modules (``cuda_graph_modules``; empty:
  the whole layer): with ``attn`` the input norm, the self-attention and its bias-dropout-add
  (``TransformerLayer._te_cuda_graph_capture`` runs ``_forward_attention`` only), with ``mlp``
  a dense layer's pre-MLP norm and MLP too. MoE parts (``moe``, ``moe_router``,
  ``moe_preprocess``) are counted as eager here (their router and dispatch preprocessing are a
  small part of a MoE layer's tensors).
- **When.** One forward and one backward graph per (graphed layer, microbatch) of the step,
  captured in the pipeline schedule's own order (``_order`` from ``get_schedule_table``), all
  in one private memory pool: the capture's high-water mark holds the graphed part of every
  layer-microbatch the schedule has in flight, plus the first captured backward's working set.
  From 0.16 the capture runs after ``cuda_graph_warmup_steps`` eager iterations
  (``training.py``: ``iteration - start_iteration == args.cuda_graph_warmup_steps``, Megatron-LM
  2b343d739f); before, ``--external-cuda-graph`` captured before the training loop. A capture
  before the first optimizer step runs without the optimizer's moments: Adam allocates them
  at its first ``step()`` (``megatron/core/optimizer``: ``init_state_fn`` runs only when a
  checkpoint is loaded).
- **What stays allocated.** The static inputs (``[s/(cp sp), b, h]`` hidden states and, with
  ``attn``, the ``[b, 1, s/cp, s]`` bool mask the batch carries), built before the capture and
  reused by layer-microbatches that are never in flight together (``_get_sample_arguments``):
  one set per graphed layer-microbatch in flight; one gradient-output buffer
  (``_reuse_graph_input_output_buffers``) and the last captured gradient-input set.
  Everything the graphs save or return lives in the private pool, whose blocks the allocator
  marks free after the capture: reserved, not allocated (``make_weak_ref`` outputs; replay
  calls no allocator). So at replay the graphed part's saved tensors and the layer's output
  (copied into the next layer's static input) leave ``memory_allocated``.

The run's peak is the highest of: the eager warm-up iterations (when there are any), the
capture, and the replayed steps. Not counted: the private pool itself (reserved memory, about
the capture's graphed high-water mark, which eager allocations cannot reuse:
:attr:`CudaGraphTerms.pool_bytes` says how much), RoPE tables shared by the graphs, cuBLAS
workspaces of the capture and warm-up streams; at a capture before the first step the FP8
weight caches and grouped-GEMM workspaces of modules outside the graphs are counted although
they do not exist yet (a few hundred MiB at most, on the safe side).
"""

from __future__ import annotations

from dataclasses import dataclass

from memscope.analysis.static.activations import (
    Dims,
    attention_backward_work,
    dataloader_mask,
    dims,
    kept_halves,
    layer_saved,
    mlp_half_saved,
    schedule_moments,
)
from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.megatron_versions import TE_GRAPHS_AFTER_WARMUP, older_than

TE = "transformer_engine"


@dataclass(frozen=True)
class CudaGraphTerms:
    """Bytes one rank's Transformer Engine CUDA graphs add or move (see the module)."""

    static_bytes: int  # static inputs and gradient buffers: allocated from the capture on
    graphed_per_layer: int  # one layer-microbatch's graphed saved tensors (and its output)
    capture_bytes: int  # at the capture's high-water mark, above persistent and workspaces
    capture_lazy_bytes: int  # persistent bytes not yet allocated then (optimizer moments)
    replay_removed_bytes: int  # at the eager peak moment, what replaying leaves in the pool
    eager_warmup: bool  # eager iterations run before the capture
    pool_bytes: int  # the private pool's reserved size (not allocated; not in the peak)


def te_graphs(spec: TrainingSpec) -> bool:
    """Whether the run captures Transformer Engine CUDA graphs of its layers."""
    return spec.cuda_graph_impl == TE


def eager_iterations_first(spec: TrainingSpec) -> bool:
    """Whether eager iterations run before the capture (0.16 on: ``cuda_graph_warmup_steps``
    of them; before, none)."""
    if older_than(spec.model, TE_GRAPHS_AFTER_WARMUP):
        return False
    return spec.cuda_graph_warmup_steps > 0


def _scope(spec: TrainingSpec) -> tuple[bool, bool]:
    """(attention graphed, MLP graphed): the whole layer without modules; ``mlp`` graphs a
    dense MLP only (a MoE layer's experts stay eager)."""
    modules = spec.cuda_graph_modules
    whole = not modules
    dense_mlp = spec.model.num_experts is None and "mlp" in modules
    return whole or "attn" in modules, whole or dense_mlp


def graphed_per_layer(spec: TrainingSpec, x: Dims) -> int:
    """One layer-microbatch's saved tensors inside the graphs (its graphed halves)."""
    kept, attention = kept_halves(spec, x)
    attn, mlp = _scope(spec)
    return (attention if attn else 0) + (kept - attention if mlp else 0)


def _graphed_working(spec: TrainingSpec, x: Dims) -> int:
    """The first captured backward's working set above the graphed saved tensors: the
    attention core's (what it releases of the MLP half is not there when the MLP is eager)."""
    full = layer_saved(spec, x)
    work = attention_backward_work(spec, x, full, output_stored=False)
    if not _scope(spec)[1]:  # (the layer's output is not released: output_stored=False)
        work += mlp_half_saved(full) - full["layer_output"]
    return max(0, work)


def _layer_microbatches(chunk_microbatches: tuple[int, ...], layer_counts: list[int]) -> int:
    """Layer-microbatches of ``chunk_microbatches`` (per chunk) of chunks of ``layer_counts``."""
    return sum(n * c for n, c in zip(chunk_microbatches, layer_counts, strict=False))


def cuda_graph_terms(
    spec: TrainingSpec,
    pp_rank: int,
    layer_counts: list[int],
    held_at_peak: tuple[int, ...],
    moments_bytes: int,
) -> CudaGraphTerms | None:
    """The terms of stage ``pp_rank`` (``layer_counts``: its chunks' decoder layers;
    ``held_at_peak``: the chunk-microbatches in flight at the eager peak;
    ``moments_bytes``: the optimizer state a first ``step()`` allocates); ``None`` without
    Transformer Engine graphs."""
    if not te_graphs(spec):
        return None
    x = dims(spec)
    graphed = graphed_per_layer(spec, x)
    if not graphed:
        return None
    in_flight = max(
        _layer_microbatches(alive, layer_counts)
        for _, alive, _, _ in schedule_moments(spec, pp_rank)
    )
    attn, mlp = _scope(spec)
    static_set = x.hidden + (dataloader_mask(spec, x) if attn else 0)
    static = in_flight * static_set + 2 * x.hidden  # + gradient-output and -input buffers
    graphed_high = in_flight * graphed + _graphed_working(spec, x)
    eager = eager_iterations_first(spec)
    # replayed: the graphed tensors are in the pool; with an eager MLP, its output is copied
    # into the next layer's static input and released
    per_layer = graphed + (0 if mlp else x.hidden)
    removed = per_layer * _layer_microbatches(held_at_peak, layer_counts)
    return CudaGraphTerms(
        static_bytes=static,
        graphed_per_layer=graphed,
        capture_bytes=static + graphed_high,
        capture_lazy_bytes=0 if eager else moments_bytes,
        replay_removed_bytes=removed,
        eager_warmup=eager,
        pool_bytes=graphed_high,
    )
