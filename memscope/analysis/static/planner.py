"""Which Megatron settings fit a memory budget, and which of those should train fastest.

:func:`plan` searches the layouts a Megatron job of a given world size can take: tensor,
pipeline, virtual-pipeline and context parallel sizes; for MoE models expert parallel sizes
and expert-tensor parallelism (TP or 1); a lighter first or last stage; sequence parallelism;
the micro-batch size at the same global batch; activation recompute (selective, block or
uniform full); the distributed optimizer. It estimates every pipeline stage of each with the
same per-rank estimator as ``analyze-static`` (:func:`.estimate_rank`: every term derived from
what megatron-core allocates), keeps those whose worst stage fits the budget, and ranks them
by :class:`CostModel`, a stated model of the step time. Megatron's constraints are the
estimator's own validation (heads, query groups and vocabulary divisible by TP, layers by
PP x VPP, VPP needing PP > 1, experts by EP, EP x ETP dividing TP x CP x DP, ...) plus the
schedule's: interleaving needs the number of microbatches to be a multiple of PP.

Within one layout, its memory savers (recompute granularity, method and modules; the
precision-aware optimizer; activation and optimizer CPU offload) are ordered by the cost
model and tried cheapest first; the first that fits is the layout's plan (the others would
rank after it). A layout whose strongest savers (full recompute, the lightest optimizer
state searched, all of the optimizer offloaded) do not fit is skipped without trying the
rest. The precision-aware optimizer is searched at its lossless level (fp32 state, master
weights as bf16 + int16 remainders) unless bf16 moments and main gradients are allowed
(``bf16_state``, ``--bf16-optimizer-state``): they change Adam's numerics.

Deterministic: the same inputs give the same plans in the same order.

The user's own config is the baseline: costed by the same model and ranked among the
layouts that fit (its data-parallel size rescaled to the planned world size where its other
sizes allow; else it is said to need its own number of GPUs). A config with a
``pipeline_model_parallel_layout`` keeps it on the baseline: estimated and costed stage by
stage with it (no custom layout is searched; the searched splits are ranked against it).
Plans with offload state the
host memory per node they need, and ``host_memory_bytes`` bounds it. The world size is
factored (bounded by :data:`MAX_WORLD_SIZE`) and one search costs at most
:data:`MAX_BASE_LAYOUTS` parallel layouts.

Known limitations: the precision-aware optimizer is priced at no step time (its lower
precision state is a numerics choice the cost model does not weigh); MoE all-to-all overlap
(``overlap_moe_expert_parallel_comm``) is not priced; activation-offload residency
assumes Transformer Engine's offload context moves every tensor its modules save; FlagScale's
per-stage/micro-batch recompute and fine-grained activation offloading are not searched.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.static.accuracy import gpu_benchmark_summary
from memscope.analysis.static.activations import (
    dims,
    layer_saved,
    offloadable_bytes,
    offloaded_layers,
)
from memscope.analysis.static.config import ModelSpec, TrainingSpec, chunk_layer_counts, chunk_roles
from memscope.analysis.static.estimator import RankEstimate, estimate_rank
from memscope.analysis.static.params import RankPosition, rank_param_count
from memscope.analysis.static.pipeline_layout import format_layout
from memscope.analysis.static.spec_checks import validate_spec
from memscope.analysis.static.terms import optimizer_shards

#: The estimator's worst relative error against the GPU memory NVIDIA's Megatron-LM functional
#: tests publish, over the cases that set no feature it warns it does not model, read from the
#: benchmark's committed summary (``benchmarks/static_gpu_golden.txt``, kept fresh by
#: tests/test_gpu_benchmark_fresh.py): each predicted peak is given with this band.
ESTIMATE_UNCERTAINTY = gpu_benchmark_summary().band
#: Largest tensor-parallel size searched: one node's GPUs (TP communicates every layer).
MAX_TP = 8
#: Context-parallel sizes searched (the sequence must split into 2 x CP chunks).
CP_CHOICES = (1, 2, 4, 8)
#: Expert-parallel sizes searched for MoE models (dividing the experts).
EP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
#: Precision-aware optimizer levels searched (bf16 training with the distributed optimizer's
#: Adam, as megatron-core requires): the state dtypes each sets (Megatron-LM's choices).
PRECISION_AWARE: dict[str, dict[str, str]] = {
    "fp32": {"main_grads_dtype": "fp32", "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32"},
    "bf16_moments": {"main_grads_dtype": "fp32", "exp_avg_dtype": "bf16",
                     "exp_avg_sq_dtype": "bf16"},
    "bf16": {"main_grads_dtype": "bf16", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"},
}  # fmt: skip
#: The precision-aware level that keeps Adam's numerics (searched without opting in).
LOSSLESS_LEVEL = "fp32"
#: Optimizer CPU offload fractions searched, only for layouts nothing else fits.
OFFLOAD_FRACTIONS = (0.5, 1.0)
#: Largest world size planned for (2^20 ranks, beyond any cluster built): its divisors come
#: from its prime factors, and no world size this large has more than 240 of them.
MAX_WORLD_SIZE = 1 << 20
#: Parallel layouts costed at most in one search; the rest are reported as not searched.
MAX_BASE_LAYOUTS = 20_000
#: Step-time differences below this share are within the cost model's own approximations
#: (each term is a first-order model): a plan must be cheaper than the user's config by more
#: than this to rank above it.
COST_RESOLUTION = 0.005


#: Host bytes per offloaded parameter under optimizer CPU offload: fp32 master weight,
#: ``exp_avg`` and ``exp_avg_sq`` of the CPU AdamW, and the fp32 gradient copy it steps from
#: (megatron-core ``optimizer/cpu_offloading/hybrid_optimizer.py``: ``_get_sub_optimizer_
#: param_groups`` clones the parameter to the host, ``_set_sub_optimizer_grads`` allocates its
#: pinned gradient; ``param_update_in_fp32``).
HOST_BYTES_PER_OFFLOADED_PARAM = 16
#: Bytes torch's fused CPU AdamW reads and writes per parameter and step: it reads the fp32
#: parameter, gradient, ``exp_avg`` and ``exp_avg_sq`` and writes back all but the gradient
#: (aten/src/ATen/native/cpu/FusedAdamKernel.cpp).
ADAM_BYTES_PER_PARAM = 7 * 4
#: One core's fused CPU AdamW throughput, parameters per second, measured by
#: ``tools/bench_cpu_adam.py`` (``benchmarks/cpu_adam.txt``: torch.optim.AdamW(fused=True),
#: one thread, a 64 MiB fp32 tensor beyond the cache, on this project's shared 2-core AMD
#: EPYC machine under load: a low figure). A test re-reads the benchmark.
HOST_ADAM_PARAMS_PER_S_PER_CORE = 1.2e9


@dataclass(frozen=True)
class CostModel:
    """A stated model of one training step's time, relative to the same work with no
    pipeline bubble, no recompute and free communication. Every term is a share of that
    ideal step (:meth:`breakdown`); their sum plus one is the step-time factor.

    * **bubble** (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
      GPU Clusters Using Megatron-LM", section 2.2): idle time ``(p - 1) / (v m)`` of the
      ideal time, for ``p`` stages, ``v`` virtual stages per rank, ``m`` microbatches, when
      the stages are alike. Stages differ (a lighter first or last stage, the output layer
      and its loss on the last one, MTP layers, a ``pipeline_model_parallel_layout``), so
      each rank's forward work per microbatch ``w_i`` is counted (:func:`stage_flops`): the
      heaviest sets the pace, a step takes ``m w_max + (sum w - w_max) / v`` and the ideal
      is the balanced ``m sum w / p``; the bubble is the difference (it reduces to
      ``(p - 1) / (v m)`` for alike stages).
    * **recompute** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
      Transformer Models", section 5): full recompute runs every layer's forward again, 1/3
      of forward + backward (block: the first ``recompute_num_layers`` of each chunk);
      selective recompute re-runs its modules (:func:`module_flops`).
    * **tp_comm** (Narayanan et al. 2021, section 3.2): four all-reduces (or reduce-scatter +
      all-gather pairs with sequence parallelism) of ``b s h`` elements per layer and
      microbatch, each moving ``2 (t - 1) / t`` of it per GPU, not overlapped.
    * **cp_comm** (megatron-core's ring attention, ``transformer/dot_product_attention`` via
      TE's ``attn_forward_func_with_cp`` with ``cp_comm_type p2p``): each of the ``c - 1``
      ring steps sends the K and V chunk (``2 b (s / c) g d / t`` elements) while the
      attention of the chunk already held runs (``4 b (s / c)^2 h / t`` FLOPs); only what the
      exchange takes beyond that compute is paid, forward and twice in the backward (K, V
      and their gradients).
    * **ep_comm** (megatron-core's ``transformer/moe/token_dispatcher.py`` all-to-all
      dispatcher): four all-to-alls of ``b (s / c) k h`` elements per MoE layer, ``(e - 1) / e``
      of them leaving the GPU, not overlapped; over NVLink while ``t e`` GPUs fit in a node.
    * **dp_comm** (megatron-core ``distributed/distributed_data_parallel.py`` and
      ``param_and_grad_buffer.py`` with ``overlap_grad_reduce`` / ``overlap_param_gather``):
      the gradient buffer (fp32 when gradients are kept in fp32) is reduce-scattered over the
      ``dp x cp`` ranks (all-reduced without the distributed optimizer) during the last
      microbatch's backward, when gradient sync is enabled; the distributed optimizer's
      parameter all-gather runs during the next step's first forward. What does not fit in
      those windows is paid. Over NVLink while ``t c d`` GPUs fit in a node, else the NIC.
    * **offload** (activation CPU offload): each offloaded layer's saved tensors go to the
      host and back per microbatch over PCIe, not overlapped.
    * **cpu_adam** (optimizer CPU offload, megatron-core ``optimizer/cpu_offloading/
      hybrid_optimizer.py`` ``HybridDeviceOptimizer.step`` with
      ``overlap_cpu_optimizer_d2h_h2d``): the offloaded gradients go to the host on a side
      stream, the CPU AdamW steps each parameter group as soon as its copy lands, and a
      post-step hook copies it back on another stream, so the three pipeline: the slowest of
      D2H, the CPU step and H2D is paid. The CPU step runs at ``host_adam_params_per_s``
      per GPU: one core's measured rate times the cores per GPU, capped by the node's memory
      bandwidth shared by its GPUs (the fused AdamW is bandwidth bound).

    Defaults: an H100 SXM in a DGX H100 (989 TFLOP/s dense bf16 at 50% model FLOPs
    utilisation; NVLink 4 at 450 GB/s per direction; one 400 Gb/s NIC per GPU; PCIe 5.0 x16;
    2 x 56-core Xeon Platinum 8480C, 14 cores per GPU, 16 channels of DDR5-4800 at
    38.4 GB/s each, per the DGX H100 user guide and Intel's product page).
    """

    gpu_flops_per_s: float = 989e12 * 0.5
    link_bytes_per_s: float = 450e9
    inter_node_bytes_per_s: float = 50e9  # one 400 Gb/s NIC per GPU
    gpus_per_node: int = 8
    activation_bytes: int = 2  # bf16 activations on the wire
    pcie_bytes_per_s: float = 64e9  # PCIe 5.0 x16 host link, per direction
    host_adam_params_per_s_per_core: float = HOST_ADAM_PARAMS_PER_S_PER_CORE
    host_cores_per_gpu: int = 14
    host_memory_bytes_per_s: float = 16 * 38.4e9  # per node
    tp_comm_overlap: bool = False  # TE userbuffers hide TP collectives behind their GEMMs

    def _link(self, gpus: int) -> float:
        """Bytes per second between ``gpus`` GPUs: NVLink within a node, else the NIC."""
        return self.link_bytes_per_s if gpus <= self.gpus_per_node else self.inter_node_bytes_per_s

    def host_adam_params_per_s(self) -> float:
        """Parameters per second one GPU's CPU AdamW steps (see the class docstring)."""
        cores = self.host_adam_params_per_s_per_core * self.host_cores_per_gpu
        bandwidth = self.host_memory_bytes_per_s / self.gpus_per_node / ADAM_BYTES_PER_PARAM
        return min(cores, bandwidth)

    def breakdown(self, spec: TrainingSpec) -> dict[str, float]:
        """Each of :data:`COST_TERMS` as a share of the ideal step time, and their
        ``total`` (1 + the terms)."""
        m, p = spec.model, spec.parallel
        forward = layer_flops(spec)  # one layer, one microbatch
        gpus = p.tp * p.cp
        compute_s = 3 * forward / gpus / self.gpu_flops_per_s  # forward + backward, a layer
        block = spec.recompute == "full" and spec.recompute_method == "block"
        if spec.recompute == "full":
            recompute = 1 / 3
        elif spec.recompute == "selective":
            recompute = sum(module_flops(spec).values()) / (3 * forward)
        else:
            recompute = 0.0
        ep_comm = 0.0
        if m.num_experts and p.ep > 1:
            ep_comm = _moe_share(spec) * self._a2a_s(spec) / compute_s
        per_layer = {  # shares of one layer's compute, paid by each transformer layer
            "recompute": recompute,
            "tp_comm": self._tp_exposed_s(spec) / compute_s,
            "cp_comm": self._cp_exposed_s(spec) / compute_s,
            "ep_comm": ep_comm,
        }
        # each stage's time per microbatch in layer-compute units: its work, and what each
        # of its transformer layers (MTP layers among them) pays beyond it; block recompute
        # re-runs the first recompute_num_layers of each of its chunks
        work = [w / forward for w in stage_flops(spec)]
        layers = stage_transformer_layers(spec)
        paid = {k: [n_layers * x for n_layers in layers] for k, x in per_layer.items()}
        if block:
            k = spec.recompute_num_layers
            paid["recompute"] = [sum(min(k, c) for c in chunk_layer_counts(m, p, i)) / 3
                                 for i in range(p.pp)]  # fmt: skip
        times = [w + sum(x[i] for x in paid.values()) for i, w in enumerate(work)]
        pace = max(range(p.pp), key=lambda i: times[i])
        n, v = spec.num_microbatches, len(chunk_layer_counts(m, p, pace))
        ideal = n * sum(work) / p.pp  # the same work balanced over the stages, no bubble
        # the pacing stage's own work and the fill and drain of the others, beyond the ideal
        bubble = (n * work[pace] + (sum(times) - times[pace]) / v) / ideal - 1
        step_s = ideal * compute_s
        terms = {
            "bubble": bubble,
            **{k: n * x[pace] / ideal for k, x in paid.items()},
            "dp_comm": self._dp_exposed_s(spec, times[pace] * compute_s) / step_s,
            "offload": self._activation_offload_s(spec) / step_s,
            "cpu_adam": self._cpu_adam_s(spec) / step_s,
        }
        return {**terms, "total": 1 + sum(terms.values())}

    def _tp_exposed_s(self, spec: TrainingSpec) -> float:
        """Seconds per layer and microbatch (forward + backward) of the tensor-parallel
        collectives: four all-reduces of ``b (s / c) h`` elements, two in the forward and two
        in the backward, ``2 (t - 1) / t`` of each moved per GPU (with sequence parallelism,
        eight all-gathers / reduce-scatters moving the same). Without ``tp_comm_overlap`` all
        of it is paid; with it (Transformer Engine's userbuffers, ``--tp-comm-overlap``) each
        all-gather / reduce-scatter runs under the GEMM beside it (QKV, output, fc1, fc2,
        and their backward data-gradient GEMMs of the same size) and only what outlasts
        that GEMM is paid; MoE layers' expert GEMMs are not overlapped this way, so their
        two MLP collectives are paid whole."""
        m, p = spec.model, spec.parallel
        if p.tp == 1:
            return 0.0
        b, s, h = spec.micro_batch_size, m.seq_length / p.cp, m.hidden_size
        half = (p.tp - 1) / p.tp * b * s * h * self.activation_bytes / self.link_bytes_per_s
        if not (self.tp_comm_overlap and p.sequence_parallel):
            return 4 * 2 * half
        q, kv = _attention_width(spec)
        gate = 2 if m.gated_linear_unit else 1
        per_flop = 1 / (p.tp * self.gpu_flops_per_s)
        attention = [2 * b * s * h * (q + 2 * kv), 2 * b * s * q * h]
        mlp = [2 * b * s * h * m.ffn * gate, 2 * b * s * m.ffn * h]
        dense = 1 - _moe_share(spec)
        exposed = sum(max(0.0, half - g * per_flop) for g in attention)
        exposed += dense * sum(max(0.0, half - g * per_flop) for g in mlp)
        exposed += (1 - dense) * 2 * half
        return 2 * exposed  # forward and backward

    def _a2a_s(self, spec: TrainingSpec) -> float:
        """Seconds of one MoE layer's four all-to-alls per microbatch: of the ``b (s / c) k
        h`` elements each sends, the share bound for the ranks of this node (``8 / t`` of
        the EP group) goes over NVLink and the rest over the NIC, both at once."""
        m, p = spec.model, spec.parallel
        sent = 4 * spec.micro_batch_size * (m.seq_length / p.cp) * m.moe_router_topk
        sent *= m.hidden_size * self.activation_bytes
        local = min(p.ep, max(1, self.gpus_per_node // p.tp))
        nvlink = sent * (local - 1) / p.ep / self.link_bytes_per_s
        nic = sent * (p.ep - local) / p.ep / self.inter_node_bytes_per_s
        return max(nvlink, nic)

    def _cp_exposed_s(self, spec: TrainingSpec) -> float:
        """Seconds per layer and microbatch the ring's K/V exchange takes beyond the
        attention compute it overlaps with (forward, and twice that in the backward)."""
        m, p = spec.model, spec.parallel
        if p.cp == 1:
            return 0.0
        b, chunk = spec.micro_batch_size, m.seq_length / p.cp
        kv = 2 * b * chunk * m.query_groups * m.head_dim / p.tp * self.activation_bytes
        attn = 4 * b * chunk * chunk * _attention_width(spec)[0] / p.tp / self.gpu_flops_per_s
        return 3 * (p.cp - 1) * max(0.0, kv / self._link(p.tp * p.cp) - attn)

    def _dp_exposed_s(self, spec: TrainingSpec, microbatch_s: float) -> float:
        """Seconds per step of data-parallel gradient reduction and parameter gather beyond
        the last microbatch's backward (2/3 of ``microbatch_s``) and the first one's forward
        (1/3) they overlap with."""
        p, prec = spec.parallel, spec.precision
        ranks = p.dp * p.cp
        if ranks == 1:
            return 0.0
        params = _first_stage_params(spec)
        grad = 4 if prec.grads_in_fp32 else prec.param_bytes
        link = self._link(p.tp * p.cp * p.dp)
        share = (ranks - 1) / ranks
        if prec.distributed_optimizer:
            reduce_s = share * params * grad / link
            gather_s = share * params * prec.param_bytes / link
        else:
            reduce_s, gather_s = 2 * share * params * grad / link, 0.0
        return max(0.0, reduce_s - 2 * microbatch_s / 3) + max(0.0, gather_s - microbatch_s / 3)

    def _activation_offload_s(self, spec: TrainingSpec) -> float:
        """Seconds per step of activation offload's PCIe traffic, not overlapped."""
        layers = offloaded_layers(spec)
        if not layers:
            return 0.0
        saved = offloadable_bytes(layer_saved(spec, dims(spec)))
        return 2 * layers * saved * spec.num_microbatches / self.pcie_bytes_per_s

    def _cpu_adam_s(self, spec: TrainingSpec) -> float:
        """Seconds per step of optimizer CPU offload: the slowest of the gradients' D2H, the
        CPU AdamW over the offloaded parameters and their H2D, which pipeline."""
        params = offloaded_params(spec)
        if not params:
            return 0.0
        prec = spec.precision
        grad = 4 if prec.grads_in_fp32 else prec.param_bytes
        d2h = params * grad / self.pcie_bytes_per_s
        h2d = params * prec.param_bytes / self.pcie_bytes_per_s
        return max(d2h, params / self.host_adam_params_per_s(), h2d)

    def host_bytes_per_node(self, spec: TrainingSpec) -> int:
        """Host memory one node's ranks hold for offload: the offloaded parameters'
        :data:`HOST_BYTES_PER_OFFLOADED_PARAM` each, and the activations offloaded for a
        microbatch, times the ranks per node (stage 0's, the heaviest)."""
        per_rank = offloaded_params(spec) * HOST_BYTES_PER_OFFLOADED_PARAM
        layers = offloaded_layers(spec)
        if layers:
            per_rank += layers * offloadable_bytes(layer_saved(spec, dims(spec)))
        return int(per_rank * min(self.gpus_per_node, spec.parallel.world_size))


#: The cost terms :meth:`CostModel.breakdown` gives, in the order they are printed.
COST_TERMS = ("bubble", "recompute", "tp_comm", "cp_comm", "ep_comm", "dp_comm", "offload",
              "cpu_adam")  # fmt: skip


def offloaded_params(spec: TrainingSpec) -> float:
    """Parameters of stage 0's rank whose optimizer step runs on the host: the offloaded
    fraction of its distributed-optimizer shard (0 without optimizer offload)."""
    prec = spec.precision
    if not prec.optimizer_cpu_offload or prec.optimizer_offload_fraction <= 0:
        return 0.0
    shard = _first_stage_params(spec) / (
        optimizer_shards(spec)[0] if prec.distributed_optimizer else 1
    )
    return prec.optimizer_offload_fraction * shard


_PARAM_COUNTS: dict[tuple[Any, Any], int] = {}


def _first_stage_params(spec: TrainingSpec) -> int:
    """Parameters of pipeline stage 0 (TP rank 0), remembered per model and parallel sizes
    (the planner costs many layouts that share them)."""
    key = (spec.model, spec.parallel)
    if key not in _PARAM_COUNTS:
        if len(_PARAM_COUNTS) > 4096:
            _PARAM_COUNTS.clear()
        _PARAM_COUNTS[key] = rank_param_count(spec, RankPosition())
    return _PARAM_COUNTS[key]


def stage_flops(spec: TrainingSpec) -> list[float]:
    """Forward FLOPs per microbatch of each pipeline rank, all its virtual chunks: its
    decoder layers (:func:`.chunk_layer_counts`, which follows a
    ``pipeline_model_parallel_layout``) at :func:`layer_flops` each, and what
    :func:`.chunk_roles` puts on its chunks: the output layer's logits ``2 b s h V`` where
    the loss is, and where the MTP layers are, each MTP layer's transformer layer, its
    ``eh_proj`` (``2 b s (2h) h``) and its own logits (megatron-core 0.16.1
    ``transformer/multi_token_prediction.py`` ``MultiTokenPredictionLayer``; GPTModel
    computes each MTP loss through the output layer). The embedding is a lookup: no GEMM."""
    m = spec.model
    layer = layer_flops(spec)
    b, s, h = spec.micro_batch_size, m.seq_length, m.hidden_size
    logits = 2.0 * b * s * h * m.vocab_size
    mtp = layer + 2.0 * b * s * 2 * h * h + logits  # one MTP layer
    return [n * layer + loss * logits + k * mtp for n, loss, k in _stage_parts(spec)]


def stage_transformer_layers(spec: TrainingSpec) -> list[int]:
    """Transformer layers of each pipeline rank: its decoder layers and the MTP layers
    :func:`.chunk_roles` puts there (each pays the per-layer communication)."""
    return [n + k for n, _, k in _stage_parts(spec)]


_STAGE_PARTS: dict[tuple[Any, Any], list[tuple[int, int, int]]] = {}


def _stage_parts(spec: TrainingSpec) -> list[tuple[int, int, int]]:
    """Per pipeline rank: (decoder layers, output layers, MTP layers), from
    :func:`.chunk_layer_counts` and :func:`.chunk_roles`; remembered per model and parallel
    sizes (the planner costs many savers of one layout)."""
    m, p = spec.model, spec.parallel
    key = (m, p)
    if key not in _STAGE_PARTS:
        if len(_STAGE_PARTS) > 4096:
            _STAGE_PARTS.clear()
        parts = []
        for rank in range(p.pp):
            counts = chunk_layer_counts(m, p, rank)
            roles = [chunk_roles(m, p, rank, c) for c in range(len(counts))]
            parts.append((sum(counts), sum(r.loss for r in roles),
                          (m.mtp_num_layers or 0) * sum(r.mtp for r in roles)))  # fmt: skip
        _STAGE_PARTS[key] = parts
    return _STAGE_PARTS[key]


@functools.lru_cache(maxsize=64)
def _moe_layer_share(m: ModelSpec) -> float:
    """The share of decoder layers with a MoE MLP."""
    return sum(m.is_moe_layer(i) for i in range(m.num_layers)) / m.num_layers


def _moe_share(spec: TrainingSpec) -> float:
    return _moe_layer_share(spec.model)


def _attention_width(spec: TrainingSpec) -> tuple[int, int]:
    """(query width ``a d``, key width) of the attention: heads x head dim (MLA: the query
    and key head dims with the rotary part)."""
    m = spec.model
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        return m.num_attention_heads * qk, m.num_attention_heads * qk
    return m.num_attention_heads * m.head_dim, m.query_groups * m.head_dim


def layer_flops(spec: TrainingSpec) -> float:
    """Forward FLOPs of one decoder layer for one microbatch (averaged over dense and MoE
    layers), two per multiply-add of each GEMM as megatron's
    ``num_floating_point_operations`` (megatron/training/training.py) counts them: the
    query, key-value and output projections, the attention core ``4 b s^2 (a d)`` (no
    causal discount), and the MLP: ``(2 + 2 g) b s h f`` (``g`` = 2 when gated) dense, or
    the router ``2 b s h E`` with ``k`` experts' MLPs and the shared expert."""
    m = spec.model
    b, s, h = spec.micro_batch_size, m.seq_length, m.hidden_size
    q, kv = _attention_width(spec)
    gate = 2 if m.gated_linear_unit else 1
    if m.multi_latent_attention:
        v = m.num_attention_heads * m.v_head_dim
        down = 2 * b * s * h * ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_pos_emb_head_dim)
        up = (
            2
            * b
            * s
            * (
                (m.q_lora_rank or h) * q
                + m.kv_lora_rank * (q - m.num_attention_heads * m.qk_pos_emb_head_dim + v)
            )
        )
        attention = down + up + 2 * b * s * v * h + 2 * b * s * s * (q + v)
    else:
        attention = 2 * b * s * h * (q + 2 * kv) + 2 * b * s * q * h + 4 * b * s * s * q
    dense = (2 + 2 * gate) * b * s * h * m.ffn
    shared = (2 + 2 * gate) * b * s * h * (m.moe_shared_expert_intermediate_size or 0)
    routed = (2 + 2 * gate) * b * s * h * m.moe_ffn * (m.moe_router_topk or 0)
    moe = 2 * b * s * h * (m.num_experts or 0) + routed + shared
    share = _moe_share(spec)
    return float(attention + (1 - share) * dense + share * moe)


def module_flops(spec: TrainingSpec) -> dict[str, float]:
    """Forward FLOPs per layer (averaged over dense and MoE layers) that selective recompute
    of each of ``spec.recompute_modules`` runs again in the backward.

    ``core_attn``: ``4 b s^2 (a d)`` (Korthikanti et al. 2022, section 5, with the query
    width ``a d`` for ``h``); ``mlp``: the dense MLP's two GEMMs, ``2 b s h f`` each (fc1
    twice as wide when gated); ``moe``: the router GEMM ``2 b s h E`` plus ``k`` experts'
    MLPs and the shared expert; ``shared_experts``: the shared expert's MLP;
    ``mla_up_proj``: the query and key-value up-projection GEMMs; ``layernorm`` and
    ``moe_act`` are element-wise: about 8 FLOPs per element of each norm's ``[s, b, h]``
    input and 4 per element of the experts' activation input."""
    if spec.recompute != "selective":
        return {}
    m = spec.model
    b, s, h = spec.micro_batch_size, m.seq_length, m.hidden_size
    gate = 2 if m.gated_linear_unit else 1
    moe = _moe_share(spec)
    shared = (2 + 2 * gate) * b * s * h * (m.moe_shared_expert_intermediate_size or 0)
    routed = (2 + 2 * gate) * b * s * h * m.moe_ffn * m.moe_router_topk
    flops = {
        "core_attn": 4 * b * s * s * _attention_width(spec)[0],
        "layernorm": 2 * 8 * b * s * h,
        "mlp": (1 - moe) * (2 + 2 * gate) * b * s * h * m.ffn,
        "moe": moe * (2 * b * s * h * (m.num_experts or 0) + routed + shared),
        "moe_act": moe * 4 * gate * b * s * m.moe_ffn * m.moe_router_topk,
        "shared_experts": moe * shared,
        "mla_up_proj": 2 * b * s * m.num_attention_heads * (
            (m.q_lora_rank or 0) * (m.qk_head_dim + m.qk_pos_emb_head_dim)
            + m.kv_lora_rank * (m.qk_head_dim + m.v_head_dim)
        ),
    }  # fmt: skip
    modules = set(spec.recompute_modules)
    if "moe" in modules:  # the whole MoE layer: its parts are not recomputed twice
        modules -= {"moe_act", "shared_experts"}
    return {k: float(v) for k, v in flops.items() if k in modules}


@dataclass(frozen=True)
class Layout:
    """The settings a plan chooses."""

    tp: int
    pp: int
    vpp: int | None
    dp: int
    sequence_parallel: bool
    micro_batch_size: int
    num_microbatches: int
    recompute: str | None
    distributed_optimizer: bool
    layers_per_virtual_stage: int | None = None  # how Megatron-LM's flag spells VPP
    cp: int = 1
    last_stage_layers: int | None = None  # a lighter last stage (it also holds the logits)
    first_stage_layers: int | None = None  # a lighter first stage (it holds the embedding)
    ep: int = 1
    etp: int | None = None  # expert tensor parallel (None: TP, Megatron's default)
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    recompute_modules: tuple[str, ...] = ("core_attn",)  # selective recompute's modules
    precision_aware: str | None = None  # a PRECISION_AWARE level; None: off
    optimizer_offload_fraction: float | None = None  # optimizer CPU offload; None: off
    cpu_offloading_num_layers: int | None = None  # activation CPU offload; None: off
    tp_comm_overlap: bool = False  # --tp-comm-overlap (TE userbuffers), as the cost model priced
    # the user's pipeline_model_parallel_layout (flat stages), kept only on the baseline: the
    # planner does not search custom layouts, it costs the user's against its own splits
    pipeline_layout: tuple[str, ...] | None = None

    def megatron_args(self) -> dict[str, Any]:
        """The settings as Megatron argument names (FlagScale's YAML keys)."""
        out: dict[str, Any] = {
            "tensor_model_parallel_size": self.tp,
            "pipeline_model_parallel_size": self.pp,
            "context_parallel_size": self.cp if self.cp > 1 else None,
            "expert_model_parallel_size": self.ep if self.ep > 1 else None,
            "expert_tensor_parallel_size": self.etp,
            "decoder_first_pipeline_num_layers": self.first_stage_layers,
            "decoder_last_pipeline_num_layers": self.last_stage_layers,
            "sequence_parallel": self.sequence_parallel,
            "micro_batch_size": self.micro_batch_size,
            "use_distributed_optimizer": self.distributed_optimizer,
            "tp_comm_overlap": True if self.tp_comm_overlap and self.tp > 1 else None,
        }
        if self.pipeline_layout is not None:  # it sets the virtual stages itself
            out["pipeline_model_parallel_layout"] = format_layout(self.pipeline_layout)
        elif self.vpp:
            out["num_layers_per_virtual_pipeline_stage"] = self.layers_per_virtual_stage
        if self.recompute == "selective":
            out["recompute_granularity"] = "selective"
            if self.recompute_modules != ("core_attn",):
                out["recompute_modules"] = list(self.recompute_modules)
        elif self.recompute == "full":
            out.update(recompute_granularity="full", recompute_method=self.recompute_method,
                       recompute_num_layers=self.recompute_num_layers)  # fmt: skip
        if self.precision_aware is not None:
            out["use_precision_aware_optimizer"] = True
            out.update({k: v for k, v in PRECISION_AWARE[self.precision_aware].items()
                        if v != "fp32"})  # fmt: skip
        if self.optimizer_offload_fraction is not None:
            out.update(optimizer_cpu_offload=True,
                       optimizer_offload_fraction=self.optimizer_offload_fraction)  # fmt: skip
        if self.cpu_offloading_num_layers is not None:
            # Megatron-LM's only flag for it (cpu_offloading itself is not a flag: the parser
            # sets it when this is > 0; core_v0.16.1 megatron/training/arguments.py)
            out["cpu_offloading_num_layers"] = self.cpu_offloading_num_layers
        return {k: v for k, v in out.items() if v is not None}

    def flags(self) -> str:
        """The exact Megatron-LM command-line flags."""
        parts = []
        for key, value in self.megatron_args().items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                parts.append(flag)
            elif isinstance(value, list):
                parts.append(" ".join([flag, *map(str, value)]))
            elif value is not False:
                parts.append(f"{flag} {value}")
        return " ".join(parts)


@dataclass
class Plan:
    """One layout with its per-stage predicted peaks, cost and change against the user's."""

    layout: Layout
    stages: list[dict[str, Any]]  # per stage: pp_rank, peak_bytes, components
    worst_stage: int
    peak_bytes: int
    cost: dict[str, float]
    term_changes: dict[str, int] = field(default_factory=dict)  # worst rank, vs the user's
    host_bytes_per_node: int = 0  # offload's host memory on one node (CostModel)

    def to_dict(self, budget_bytes: int) -> dict[str, Any]:
        layout_text = self.layout.megatron_args().get("pipeline_model_parallel_layout")
        return {
            # the pipeline layout as megatron-core's string (--pipeline-model-parallel-layout)
            "layout": dataclasses.asdict(self.layout) | {"pipeline_layout": layout_text},
            "flags": self.layout.flags(),
            "flagscale_yaml": self.layout.megatron_args(),
            "peak_bytes": self.peak_bytes,
            "peak_range_bytes": [
                int(self.peak_bytes * (1 - ESTIMATE_UNCERTAINTY)),
                int(self.peak_bytes * (1 + ESTIMATE_UNCERTAINTY)),
            ],
            "headroom_bytes": budget_bytes - self.peak_bytes,
            "binding_stage": self.worst_stage,
            "binding_term": max(
                self.stages[self.worst_stage]["components"].items(), key=lambda kv: kv[1]
            )[0],
            "fits": self.peak_bytes <= budget_bytes,
            "cost": self.cost,
            "host_bytes_per_node": self.host_bytes_per_node,
            "term_changes": self.term_changes,
            "stages": self.stages,
        }


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in ascending order, from its prime factors (trial division up to
    the square root: ``n`` is at most :data:`MAX_WORLD_SIZE`)."""
    assert 1 <= n <= MAX_WORLD_SIZE, n
    out, rest, f = [1], n, 2
    while f * f <= rest:
        power = 0
        while rest % f == 0:
            rest //= f
            power += 1
        out = [d * f**k for d in out for k in range(power + 1)]
        f += 1 if f == 2 else 2
    if rest > 1:
        out += [d * rest for d in out]
    return sorted(out)


def _powers_of_two_dividing(n: int) -> list[int]:
    """1, 2, 4, ... while they divide ``n``."""
    out = [1]
    while n % (out[-1] * 2) == 0:
        out.append(out[-1] * 2)
    return out


def _stage_splits(layers: int, pp: int) -> list[tuple[int | None, int | None]]:
    """(first, last) stage layer counts to try: even ``(None, None)`` when PP divides the
    layers; a last stage one or two layers lighter, a first stage one lighter, or both one
    lighter than the others, which split the rest evenly (megatron-core's
    ``decoder_first/last_pipeline_num_layers``)."""
    out: list[tuple[int | None, int | None]] = [(None, None)] if layers % pp == 0 else []
    for first_less, last_less in ((0, 1), (0, 2), (1, 0), (1, 1)):
        uneven = (first_less > 0) + (last_less > 0)
        if pp <= uneven:
            continue
        even, left = divmod(layers + first_less + last_less, pp)
        if left or even - max(first_less, last_less) < 1:
            continue
        out.append((even - first_less if first_less else None,
                    even - last_less if last_less else None))  # fmt: skip
    return out


def layouts(spec: TrainingSpec, world_size: int) -> Iterator[Layout]:
    """Every layout of ``world_size`` ranks at the user's global batch (deterministic order):
    each parallel layout (:func:`base_layouts`) with each of its memory savers
    (:func:`saver_variants`)."""
    for base in base_layouts(spec, world_size):
        yield from saver_variants(spec, base)


def base_layouts(spec: TrainingSpec, world_size: int) -> Iterator[Layout]:
    """Every parallel layout (sizes, stage split, micro-batch size) of ``world_size`` ranks at
    the user's global batch, without recompute or offload (deterministic order)."""
    p = spec.parallel
    global_batch = spec.micro_batch_size * spec.num_microbatches * p.dp
    layers, seq = spec.model.num_layers, spec.model.seq_length
    experts = spec.model.num_experts or 0
    for tp in [d for d in _divisors(world_size) if d <= MAX_TP]:
        for pp in _divisors(world_size // tp):
            for split in _stage_splits(layers, pp):
                for cp in [c for c in CP_CHOICES if (world_size // (tp * pp)) % c == 0]:
                    if cp > 1 and seq % (2 * cp):
                        continue
                    dp = world_size // (tp * pp * cp)
                    if global_batch % dp:
                        continue
                    eps = [e for e in EP_CHOICES if experts % e == 0] if experts else [p.ep]
                    etps = [None, 1] if experts and tp > 1 else [p.etp]
                    for ep in eps:
                        for etp in etps:
                            yield from _batch_layouts(
                                spec, (tp, pp, cp, dp, ep), split, global_batch // dp, etp
                            )


def _batch_layouts(
    spec: TrainingSpec,
    sizes: tuple[int, int, int, int, int],
    split: tuple[int | None, int | None],
    per_dp: int,
    etp: int | None = None,
) -> Iterator[Layout]:
    tp, pp, cp, dp, ep = sizes
    first, last = split
    layers = spec.model.num_layers
    vpps: list[int | None] = [None]
    if split == (None, None):  # interleaving with an uneven split is left out
        vpps += [v for v in (2, 4, 8) if pp > 1 and layers % (pp * v) == 0]
    for mbs in _powers_of_two_dividing(per_dp):
        m = per_dp // mbs
        for vpp in vpps:
            if vpp is not None and m % pp:
                continue  # interleaving needs microbatches in multiples of PP
            yield Layout(
                tp, pp, vpp, dp, tp > 1, mbs, m, None, dp > 1,
                layers_per_virtual_stage=layers // (pp * vpp) if vpp else None,
                cp=cp, last_stage_layers=last, first_stage_layers=first, ep=ep, etp=etp,
            )  # fmt: skip


def module_sets(spec: TrainingSpec) -> list[tuple[str, ...]]:
    """The ``recompute_modules`` sets searched for selective recompute, lightest first:
    ``core_attn`` (megatron's default) alone, then with each other module the model has
    (``layernorm`` where a norm is a module of its own: the local spec, or a MoE layer's
    pre-MLP norm; ``mlp`` or the MoE ones; ``mla_up_proj`` with MLA), then all of them."""
    m = spec.model
    moe = m.num_experts is not None
    extra: list[str] = []
    if m.transformer_impl == "local" or moe:
        extra.append("layernorm")
    if moe:
        extra += ["moe_act"] if m.moe_grouped_gemm else []
        extra += ["shared_experts"] if m.moe_shared_expert_intermediate_size else []
        extra.append("moe")
    else:
        extra.append("mlp")
    if m.multi_latent_attention:
        extra.append("mla_up_proj")
    heaviest = [x for x in extra if x not in ("moe_act", "shared_experts")]
    out = [("core_attn",), *[("core_attn", x) for x in extra], ("core_attn", *heaviest)]
    return list(dict.fromkeys(out))


def _precision_aware_levels(spec: TrainingSpec, bf16_state: bool) -> list[str]:
    """The precision-aware optimizer levels Megatron allows for ``spec``: bf16 training with
    Adam (megatron-core OptimizerConfig: adam and the distributed optimizer, which these
    layouts then use; TE's FusedAdam is assumed present). Only the lossless level (fp32
    state, master weights as bf16 + int16 remainders) unless ``bf16_state``: bf16 moments
    and main gradients change the numerics, which no memory figure prices."""
    prec = spec.precision
    ok = prec.params_dtype in ("bfloat16", "bf16") and prec.optimizer == "adam"
    if not ok or prec.torch_optimizer or spec.device != "cuda":  # TE's FusedAdam: CUDA only
        return []
    return list(PRECISION_AWARE) if bf16_state else [LOSSLESS_LEVEL]


def saver_variants(spec: TrainingSpec, base: Layout, bf16_state: bool = False) -> Iterator[Layout]:
    """``base`` with each memory saver choice: recompute (none; selective over
    :func:`module_sets`; full, block over half of each chunk's layers or uniform) each with
    the precision-aware optimizer off or at each level; activation offload of half or all
    but one of the layers (PP = 1 only, without recompute, as megatron-core requires); and
    optimizer CPU offload (:data:`OFFLOAD_FRACTIONS`, with the precision-aware optimizer it
    needs) without or with full recompute."""
    r = dataclasses.replace
    layers = spec.model.num_layers
    per_chunk = layers // (base.pp * (base.vpp or 1))
    recomputes: list[dict[str, Any]] = [{}]
    recomputes += [{"recompute": "selective", "recompute_modules": ms} for ms in module_sets(spec)]
    count = max(1, per_chunk // 2)
    if count < per_chunk:  # else the same as recomputing every layer
        recomputes.append({"recompute": "full", "recompute_method": "block",
                           "recompute_num_layers": count})  # fmt: skip
    recomputes.append({"recompute": "full"})
    levels = _precision_aware_levels(spec, bf16_state)
    aware: list[dict[str, Any]] = [{}]
    aware += [{"precision_aware": lv, "distributed_optimizer": True} for lv in levels]
    for rec in recomputes:
        for pa in aware:
            yield r(base, **rec, **pa)
    if base.pp == 1 and layers > 1 and spec.device == "cuda":  # TE's offload: CUDA only
        for k in sorted({layers // 2, layers - 1}):
            for pa in aware:
                yield r(base, cpu_offloading_num_layers=k, **pa)
    for fraction in OFFLOAD_FRACTIONS if levels else ():
        for rec in (recomputes[0], recomputes[-1]):
            for lv in dict.fromkeys((levels[0], levels[-1])):  # the heaviest and lightest
                yield r(base, **rec, precision_aware=lv, distributed_optimizer=True,
                        optimizer_offload_fraction=fraction)  # fmt: skip


def _strongest(spec: TrainingSpec, base: Layout, bf16_state: bool) -> Layout:
    """The saver variant of ``base`` with the least memory: full uniform recompute, the
    lightest precision-aware level and all of the optimizer offloaded where allowed (every
    other variant keeps at least as many bytes on the GPU: activation offload keeps a layer
    and its reload, more than full recompute's layer inputs)."""
    strongest = dataclasses.replace(base, recompute="full")
    levels = _precision_aware_levels(spec, bf16_state)
    if levels:
        strongest = dataclasses.replace(strongest, precision_aware=levels[-1],
                                        distributed_optimizer=True,
                                        optimizer_offload_fraction=1.0)  # fmt: skip
    return strongest


def apply(spec: TrainingSpec, layout: Layout) -> TrainingSpec:
    """``spec`` with ``layout``'s settings (raises ``ValueError`` where Megatron would)."""
    r = dataclasses.replace
    parallel = r(spec.parallel, tp=layout.tp, pp=layout.pp, vpp=layout.vpp, dp=layout.dp,
                 cp=layout.cp, ep=layout.ep, etp=layout.etp,
                 last_stage_layers=layout.last_stage_layers,
                 first_stage_layers=layout.first_stage_layers,
                 sequence_parallel=layout.sequence_parallel, dp_assumed=False,
                 layout=layout.pipeline_layout)  # fmt: skip
    aware = PRECISION_AWARE.get(layout.precision_aware or "", {})
    bf16 = spec.precision.params_dtype in ("bfloat16", "bf16")
    grads_fp32 = (bf16 and aware.get("main_grads_dtype", "fp32") == "fp32") or (
        not bf16 and spec.precision.grads_in_fp32
    )
    offload = layout.optimizer_offload_fraction
    precision = r(spec.precision, distributed_optimizer=layout.distributed_optimizer,
                  precision_aware=layout.precision_aware is not None,
                  main_grads_dtype=aware.get("main_grads_dtype", "fp32"),
                  exp_avg_dtype=aware.get("exp_avg_dtype", "fp32"),
                  exp_avg_sq_dtype=aware.get("exp_avg_sq_dtype", "fp32"),
                  main_params_dtype="fp32", grads_in_fp32=grads_fp32,
                  optimizer_cpu_offload=offload is not None,
                  optimizer_offload_fraction=1.0 if offload is None else offload)  # fmt: skip
    extra: dict[str, Any] = {}
    if layout.recompute == "full":
        extra = {"recompute_method": layout.recompute_method,
                 "recompute_num_layers": layout.recompute_num_layers}  # fmt: skip
    offloading = layout.cpu_offloading_num_layers
    return validate_spec(r(spec, parallel=parallel, precision=precision, recompute=layout.recompute,
             recompute_modules=layout.recompute_modules,
             cpu_offloading=offloading is not None,
             cpu_offloading_num_layers=offloading or 0,
             micro_batch_size=layout.micro_batch_size,
             num_microbatches=layout.num_microbatches,
             tp_comm_overlap=layout.tp_comm_overlap and layout.tp > 1, **extra))  # fmt: skip


def calibration(comparisons: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-term correction from real runs: for each term, the measured bytes over the
    predicted ones, summed over the ranks' ``comparisons.components`` (a runtime report's
    static-versus-runtime table), and the residuals (measured - predicted) behind them."""
    sums: dict[str, list[int]] = {}
    ranks = 0
    for comp in comparisons:
        if comp.get("status") != "ok":
            continue
        ranks += 1
        for row in comp.get("components") or []:
            static, runtime = row.get("static_bytes"), row.get("runtime_bytes")
            if isinstance(static, int) and isinstance(runtime, int):
                both = sums.setdefault(str(row["component"]), [0, 0])
                both[0] += static
                both[1] += runtime
    if not ranks:
        raise ValueError("no rank report with a static comparison to calibrate from")
    return {
        "ranks": ranks,
        "factors": {k: round(r / s, 6) for k, (s, r) in sorted(sums.items()) if s > 0},
        "residual_bytes": {k: r - s for k, (s, r) in sorted(sums.items())},
    }


def calibrated_peak(peak: int, components: Mapping[str, int], factors: Mapping[str, float]) -> int:
    """The peak with each of its terms scaled by its calibration factor."""
    return peak + sum(round(v * factors.get(k, 1.0)) - v for k, v in components.items())


def _stage_estimates(
    spec: TrainingSpec, budget: int | None, factors: Mapping[str, float] | None = None
) -> list[tuple[RankEstimate, int]] | None:
    """Each stage's estimate (TP rank 0: TP shards are alike) and its peak, calibrated by
    ``factors`` when given; with ``budget``, ``None`` as soon as a stage exceeds it (the first
    and last stages, the usual peaks, go first)."""
    pp = spec.parallel.pp
    order = list(dict.fromkeys([0, pp - 1, *range(pp)]))
    found: dict[int, tuple[RankEstimate, int]] = {}
    for stage in order:
        est = estimate_rank(spec, RankPosition(tp_rank=0, pp_rank=stage))
        peak = est.peak_memory_bytes
        if factors:
            peak = calibrated_peak(peak, est.components(), factors)
        if budget is not None and peak > budget:
            return None
        found[stage] = (est, peak)
    return [found[s] for s in range(pp)]


def stage_peaks(spec: TrainingSpec) -> list[int]:
    """Each pipeline stage's predicted peak (TP rank 0), in stage order."""
    estimates = _stage_estimates(spec, None)
    assert estimates is not None  # no budget: every stage is estimated
    return [peak for _, peak in estimates]


def evaluate(
    spec: TrainingSpec,
    layout: Layout,
    budget: int | None,
    cost_model: CostModel,
    factors: Mapping[str, float] | None = None,
) -> Plan | None:
    """The plan of one layout; ``None`` when Megatron refuses it or, with ``budget``, when
    it does not fit. With calibration ``factors`` each stage's peak is its calibrated sum of
    terms (the estimator's own peak kept as ``estimated_bytes``)."""
    try:
        changed = apply(spec, layout)
    except ValueError:
        return None
    return _evaluate_applied(changed, layout, budget, cost_model, factors)


def _evaluate_applied(
    changed: TrainingSpec,
    layout: Layout,
    budget: int | None,
    cost_model: CostModel,
    factors: Mapping[str, float] | None,
) -> Plan | None:
    """:func:`evaluate` of the spec ``layout`` was already applied to."""
    estimates = _stage_estimates(changed, budget, factors)
    if estimates is None:
        return None
    stages: list[dict[str, Any]] = []
    for i, (e, peak) in enumerate(estimates):
        stage = {"pp_rank": i, "peak_bytes": peak, "components": e.components(),
                 "peak_stage": e.peak_stage}  # fmt: skip
        if factors:
            stage["estimated_bytes"] = e.peak_memory_bytes
        stages.append(stage)
    worst = max(range(len(stages)), key=lambda i: (estimates[i][1], -i))
    return Plan(layout, stages, worst, estimates[worst][1], cost_model.breakdown(changed),
                host_bytes_per_node=cost_model.host_bytes_per_node(changed))  # fmt: skip


def current_layout(spec: TrainingSpec) -> Layout:
    """The user's own settings as a :class:`Layout`."""
    p, prec = spec.parallel, spec.precision
    per = spec.model.num_layers // (p.pp * p.vpp) if p.vpp and p.layout is None else None
    return Layout(p.tp, p.pp, p.vpp, p.dp, p.sequence_parallel, spec.micro_batch_size,
                  spec.num_microbatches, spec.recompute,
                  spec.precision.distributed_optimizer, layers_per_virtual_stage=per,
                  cp=p.cp, last_stage_layers=p.last_stage_layers,
                  first_stage_layers=p.first_stage_layers, ep=p.ep, etp=p.etp,
                  recompute_method=spec.recompute_method,
                  recompute_num_layers=spec.recompute_num_layers,
                  recompute_modules=spec.recompute_modules,
                  precision_aware=_user_level(spec),
                  optimizer_offload_fraction=prec.optimizer_offload_fraction
                  if prec.optimizer_cpu_offload else None,
                  cpu_offloading_num_layers=spec.cpu_offloading_num_layers
                  if spec.cpu_offloading else None, pipeline_layout=p.layout)  # fmt: skip


def _user_level(spec: TrainingSpec) -> str | None:
    """The :data:`PRECISION_AWARE` level of the user's precision-aware optimizer settings
    (refused when it is none of them: the planner would not reproduce it)."""
    prec = spec.precision
    if not prec.precision_aware:
        return None
    mine = {k: getattr(prec, k) for k in PRECISION_AWARE["fp32"]}
    for name, level in PRECISION_AWARE.items():
        if level == mine and prec.main_params_dtype == "fp32":
            return name
    raise ValueError(
        "the planner keeps precision-aware optimizer dtypes among its levels "
        f"({', '.join(f'{k}: {v}' for k, v in PRECISION_AWARE.items())}) and fp32 main params"
    )


def plan(
    spec: TrainingSpec,
    world_size: int,
    budget_bytes: int,
    cost_model: CostModel | None = None,
    top: int = 10,
    calibrated: Mapping[str, Any] | None = None,
    bf16_state: bool = False,
    host_memory_bytes: int | None = None,
) -> dict[str, Any]:
    """The user's layout judged against ``budget_bytes`` (the baseline, with its cost and
    its rank among the layouts that fit), and the ``top`` layouts that fit, cheapest first
    (ties: less context parallelism, then more headroom, then the layout's own order).
    ``calibrated`` (from :func:`calibration`) corrects every term by what real runs
    measured. ``bf16_state`` lets the precision-aware optimizer keep bf16 moments and main
    gradients. ``host_memory_bytes`` bounds each node's host memory for offload."""
    if world_size < 1 or budget_bytes < 1:
        raise ValueError("the world size and the memory budget must be positive")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(
            f"world size {world_size} is beyond the {MAX_WORLD_SIZE:,} ranks the planner searches"
        )
    model = cost_model or CostModel()
    factors = (calibrated or {}).get("factors") or None
    baseline, baseline_note = _baseline(spec, world_size)
    mine = evaluate(spec, baseline, None, model, factors)
    assert mine is not None, "the user's spec was validated before planning"
    searched = dominated = 0
    over_host = 0
    truncated = False
    fitting: list[tuple[float, int, int, tuple[int, int], Plan]] = []
    for index, base in enumerate(base_layouts(spec, world_size)):
        if model.tp_comm_overlap and base.tp > 1:
            base = dataclasses.replace(base, tp_comm_overlap=True)
        if index >= MAX_BASE_LAYOUTS:
            truncated = True
            break
        searched += 1
        if evaluate(spec, _strongest(spec, base, bf16_state), budget_bytes, model, factors) is None:
            dominated += 1  # not even the strongest savers fit: no option of it is costed
            continue
        costed = []
        for order, option in enumerate(saver_variants(spec, base, bf16_state)):
            try:
                changed = apply(spec, option)
                total = model.breakdown(changed)["total"]
            except ValueError:
                continue  # Megatron refuses this combination
            costed.append((round(total, 9), order, option, changed))
        costed.sort(key=lambda t: t[:2])
        for tried, (_, order, option, changed) in enumerate(costed):
            searched += 1
            found = _evaluate_applied(changed, option, budget_bytes, model, factors)
            if (
                found is not None
                and host_memory_bytes is not None
                and (found.host_bytes_per_node > host_memory_bytes)
            ):
                over_host += 1
                continue  # offload that the nodes' host memory cannot hold
            if found is not None:  # the costlier options of this layout would rank after it
                fitting.append((round(found.cost["total"], 9), base.cp, found.peak_bytes,
                                (index, order), found))  # fmt: skip
                dominated += len(costed) - tried - 1
                break
    fitting.sort(key=lambda t: t[:4])
    chosen = [t[4] for t in fitting[:top]]
    for p in chosen:
        p.term_changes = _term_changes(mine, p)
    current = mine.to_dict(budget_bytes)
    needed = baseline.tp * baseline.pp * baseline.cp * baseline.dp
    mine_total = round(mine.cost["total"], 9)
    current.update(
        world_size=needed,
        note=baseline_note,
        host_fits=host_memory_bytes is None or mine.host_bytes_per_node <= host_memory_bytes,
        rank=1 + sum(t[0] < mine_total - COST_RESOLUTION for t in fitting)
        if needed == world_size
        else None,
    )
    current["fits"] = bool(current["fits"] and current["host_fits"] and needed == world_size)
    return {
        "budget_bytes": budget_bytes,
        "host_memory_bytes": host_memory_bytes,
        "world_size": world_size,
        "uncertainty": ESTIMATE_UNCERTAINTY,
        "cost_model": dataclasses.asdict(model),
        "cost_terms": list(COST_TERMS),
        "cost_resolution": COST_RESOLUTION,
        "calibration": dict(calibrated) if calibrated else None,
        "searched": searched,
        "dominated": dominated,
        "over_host_memory": over_host,
        "truncated": truncated,
        "fitting": len(fitting),
        "bf16_optimizer_state": bf16_state,
        "current": current,
        "plans": [p.to_dict(budget_bytes) | {"vs_current": _cost_changes(mine, p)}
                  for p in chosen],
    }  # fmt: skip


def _baseline(spec: TrainingSpec, world_size: int) -> tuple[Layout, str]:
    """The user's layout at ``world_size`` ranks, and what was changed to get there: the
    data-parallel size rescaled (the global batch kept) where the model-parallel sizes divide
    the world size and the batch allows; else the layout as it is, which needs its own
    number of GPUs (said in the note)."""
    mine = current_layout(spec)
    own = mine.tp * mine.pp * mine.cp * mine.dp
    if own == world_size:
        return mine, ""
    model_parallel = mine.tp * mine.pp * mine.cp
    batch = mine.micro_batch_size * mine.num_microbatches * mine.dp
    dp = world_size // model_parallel
    if world_size % model_parallel == 0 and batch % (dp * mine.micro_batch_size) == 0:
        rescaled = dataclasses.replace(
            mine, dp=dp, num_microbatches=batch // (dp * mine.micro_batch_size),
            distributed_optimizer=mine.distributed_optimizer and dp > 1)  # fmt: skip
        try:
            apply(spec, rescaled)
        except ValueError:
            pass
        else:
            return (
                rescaled,
                f"DP {mine.dp} -> {dp} to fill {world_size} ranks ({own} in the config)",
            )
    return mine, (
        f"needs {own} GPUs (TP {mine.tp} x PP {mine.pp} x CP {mine.cp} x DP {mine.dp}), not "
        f"the {world_size} planned for"
    )


def _cost_changes(mine: Plan, other: Plan) -> dict[str, float]:
    """Per cost term (and the total), ``other``'s share minus the user's: by which terms
    a plan is cheaper or dearer than the baseline."""
    return {k: other.cost[k] - mine.cost[k] for k in (*COST_TERMS, "total")}


def _term_changes(mine: Plan, other: Plan) -> dict[str, int]:
    """Per term, the binding stage's bytes of ``other`` minus the user's binding stage's."""
    a = mine.stages[mine.worst_stage]["components"]
    b = other.stages[other.worst_stage]["components"]
    return {k: int(b.get(k, 0)) - int(a.get(k, 0)) for k in sorted(set(a) | set(b))}
