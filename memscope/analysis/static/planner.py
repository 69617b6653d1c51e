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

Within one layout, more recompute only costs more: once the cheapest recompute choice of a
layout fits, its heavier ones are not estimated (they would rank after it).

Deterministic: the same inputs give the same plans in the same order.

Known limitations: recompute of chosen modules, activation and optimizer offload and the
precision-aware optimizer keep the user's setting and are not searched (the estimator does
not model the last three yet).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.estimator import RankEstimate, estimate_rank
from memscope.analysis.static.params import RankPosition

#: The estimator's worst relative error against the GPU memory NVIDIA's Megatron-LM functional
#: tests publish (``benchmarks/static_gpu_golden.txt``, 115 cases): each predicted peak is
#: given with this band.
ESTIMATE_UNCERTAINTY = 0.064
#: Largest tensor-parallel size searched: one node's GPUs (TP communicates every layer).
MAX_TP = 8
#: Context-parallel sizes searched (the sequence must split into 2 x CP chunks).
CP_CHOICES = (1, 2, 4, 8)
#: Expert-parallel sizes searched for MoE models (dividing the experts).
EP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
#: Recompute, cheapest first: (granularity, method); "block" recomputes the first half of
#: each stage's (or virtual chunk's) layers, "uniform" every layer, one per checkpoint.
RECOMPUTE_CHOICES: tuple[tuple[str | None, str], ...] = (
    (None, "uniform"),
    ("selective", "uniform"),
    ("full", "block"),
    ("full", "uniform"),
)


@dataclass(frozen=True)
class CostModel:
    """A stated model of one training step's time, relative to the same work with no
    pipeline bubble, no recompute and free tensor-parallel communication.

    * **Pipeline bubble** (Narayanan et al. 2021, "Efficient Large-Scale Language Model
      Training on GPU Clusters Using Megatron-LM", section 2.2): idle time ``(p - 1) / (v m)``
      of the ideal time, for ``p`` stages, ``v`` virtual stages per rank, ``m`` microbatches.
    * **Recompute** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
      Transformer Models", section 5): full recompute runs every layer's forward again, 1/3
      of forward + backward; selective recompute re-runs the attention core only, whose
      forward is ``4 b s^2 h`` of the layer's ``24 b s h^2 + 4 b s^2 h`` FLOPs.
    * **Tensor parallelism** (Narayanan et al. 2021, section 3.2): four all-reduces (or
      reduce-scatter + all-gather pairs with sequence parallelism) of ``b s h`` elements per
      layer and microbatch, each moving ``2 (t - 1) / t`` of it per GPU, not overlapped;
      timed at ``link_bytes_per_s`` against the layer's FLOPs at ``gpu_flops_per_s``.
    * **Expert parallelism** (megatron-core's ``transformer/moe/token_dispatcher.py``
      all-to-all dispatcher): each MoE layer sends every token's hidden state to its
      ``k`` experts and back, forward and backward (four all-to-alls of ``b (s / c) k h``
      elements, ``(e - 1) / e`` of them leaving the GPU), not overlapped; over NVLink while
      ``t e`` GPUs fit in a node, else at ``inter_node_bytes_per_s``. Timed against the dense
      layer's FLOPs, for the share of layers that are MoE.
    * **Context parallelism** (megatron-core's ring attention,
      ``transformer/dot_product_attention`` with ``cp_comm_type p2p``): each GPU passes its
      K and V chunk (``2 b (s / c) g d / t`` elements) round the ring ``c - 1`` times in the
      forward and twice that in the backward, taken as not overlapped; over NVLink while
      ``t c`` GPUs fit in a node, else at ``inter_node_bytes_per_s``.

    Data-parallel gradient reduction is taken to overlap with backward (Megatron's
    ``--overlap-grad-reduce``), and is the same for every layout at one world size up to the
    DP size, so it is left out. Defaults: an H100 SXM (989 TFLOP/s dense bf16 at 50% model
    FLOPs utilisation; NVLink 4 at 450 GB/s per direction).
    """

    gpu_flops_per_s: float = 989e12 * 0.5
    link_bytes_per_s: float = 450e9
    inter_node_bytes_per_s: float = 50e9  # one 400 Gb/s NIC per GPU
    gpus_per_node: int = 8
    activation_bytes: int = 2  # bf16 activations on the wire

    def _link(self, gpus: int) -> float:
        """Bytes per second between ``gpus`` GPUs: NVLink within a node, else the NIC."""
        return self.link_bytes_per_s if gpus <= self.gpus_per_node else self.inter_node_bytes_per_s

    def breakdown(self, spec: TrainingSpec) -> dict[str, float]:
        """``bubble``, ``recompute``, ``tp_comm``, ``cp_comm`` and ``ep_comm`` as shares of
        the ideal step time, and their ``total`` (1 + the five)."""
        m, p = spec.model, spec.parallel
        b, s, h = spec.micro_batch_size, m.seq_length, m.hidden_size
        layer_flops = 24 * b * s * h * h + 4 * b * s * s * h  # forward, one layer
        bubble = (p.pp - 1) / ((p.vpp or 1) * spec.num_microbatches)
        if spec.recompute == "full" and spec.recompute_method == "block":
            per_chunk = max(1, m.num_layers // (p.pp * (p.vpp or 1)))
            recompute = min(1.0, spec.recompute_num_layers / per_chunk) / 3
        elif spec.recompute == "full":
            recompute = 1 / 3
        elif spec.recompute == "selective":
            recompute = (4 * b * s * s * h) / (3 * layer_flops)
        else:
            recompute = 0.0
        gpus = p.tp * p.cp
        compute_s = 3 * layer_flops / gpus / self.gpu_flops_per_s  # forward + backward
        tp_bytes = 4 * 2 * (p.tp - 1) / p.tp * b * (s / p.cp) * h * self.activation_bytes
        tp_comm = (tp_bytes / self.link_bytes_per_s) / compute_s
        kv = 2 * b * (s / p.cp) * m.query_groups * m.head_dim / p.tp * self.activation_bytes
        cp_comm = (3 * (p.cp - 1) * kv / self._link(gpus)) / compute_s
        ep_comm = 0.0
        if m.num_experts and p.ep > 1:
            moe_share = sum(m.is_moe_layer(i) for i in range(m.num_layers)) / m.num_layers
            a2a = 4 * (p.ep - 1) / p.ep * b * (s / p.cp) * m.moe_router_topk * h
            a2a_s = a2a * self.activation_bytes / self._link(p.tp * p.ep)
            ep_comm = moe_share * a2a_s / compute_s
        return {
            "bubble": bubble,
            "recompute": recompute,
            "tp_comm": tp_comm,
            "cp_comm": cp_comm,
            "ep_comm": ep_comm,
            "total": 1 + bubble + recompute + tp_comm + cp_comm + ep_comm,
        }


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
        }
        if self.vpp:
            out["num_layers_per_virtual_pipeline_stage"] = self.layers_per_virtual_stage
        if self.recompute == "selective":
            out["recompute_granularity"] = "selective"
        elif self.recompute == "full":
            out.update(recompute_granularity="full", recompute_method=self.recompute_method,
                       recompute_num_layers=self.recompute_num_layers)  # fmt: skip
        return {k: v for k, v in out.items() if v is not None}

    def flags(self) -> str:
        """The exact Megatron-LM command-line flags."""
        parts = []
        for key, value in self.megatron_args().items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                parts.append(flag)
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

    def to_dict(self, budget_bytes: int) -> dict[str, Any]:
        return {
            "layout": dataclasses.asdict(self.layout),
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
            "term_changes": self.term_changes,
            "stages": self.stages,
        }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


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
    """Every layout of ``world_size`` ranks at the user's global batch (deterministic order;
    within one layout, its recompute choices cheapest first)."""
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
    for mbs in [b for b in _divisors(per_dp) if b & (b - 1) == 0]:
        m = per_dp // mbs
        for vpp in vpps:
            if vpp is not None and m % pp:
                continue  # interleaving needs microbatches in multiples of PP
            per_chunk = layers // (pp * (vpp or 1))
            for granularity, method in RECOMPUTE_CHOICES:
                count = max(1, per_chunk // 2) if method == "block" else 1
                if method == "block" and count >= per_chunk:
                    continue  # the same as recomputing every layer
                yield Layout(
                    tp, pp, vpp, dp, tp > 1, mbs, m, granularity, dp > 1,
                    layers_per_virtual_stage=layers // (pp * vpp) if vpp else None,
                    cp=cp, last_stage_layers=last, first_stage_layers=first, ep=ep, etp=etp,
                    recompute_method=method, recompute_num_layers=count,
                )  # fmt: skip


def apply(spec: TrainingSpec, layout: Layout) -> TrainingSpec:
    """``spec`` with ``layout``'s settings (raises ``ValueError`` where Megatron would)."""
    r = dataclasses.replace
    parallel = r(spec.parallel, tp=layout.tp, pp=layout.pp, vpp=layout.vpp, dp=layout.dp,
                 cp=layout.cp, ep=layout.ep, etp=layout.etp,
                 last_stage_layers=layout.last_stage_layers,
                 first_stage_layers=layout.first_stage_layers,
                 sequence_parallel=layout.sequence_parallel, dp_assumed=False)  # fmt: skip
    precision = r(spec.precision, distributed_optimizer=layout.distributed_optimizer)
    extra: dict[str, Any] = {}
    if layout.recompute == "full":
        extra = {"recompute_method": layout.recompute_method,
                 "recompute_num_layers": layout.recompute_num_layers}  # fmt: skip
    return r(spec, parallel=parallel, precision=precision, recompute=layout.recompute,
             micro_batch_size=layout.micro_batch_size,
             num_microbatches=layout.num_microbatches, **extra).validate()  # fmt: skip


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
    return Plan(layout, stages, worst, estimates[worst][1], cost_model.breakdown(changed))


def current_layout(spec: TrainingSpec) -> Layout:
    """The user's own settings as a :class:`Layout`."""
    p = spec.parallel
    per = spec.model.num_layers // (p.pp * p.vpp) if p.vpp else None
    return Layout(p.tp, p.pp, p.vpp, p.dp, p.sequence_parallel, spec.micro_batch_size,
                  spec.num_microbatches, spec.recompute,
                  spec.precision.distributed_optimizer, layers_per_virtual_stage=per,
                  cp=p.cp, last_stage_layers=p.last_stage_layers,
                  first_stage_layers=p.first_stage_layers, ep=p.ep, etp=p.etp,
                  recompute_method=spec.recompute_method,
                  recompute_num_layers=spec.recompute_num_layers)  # fmt: skip


def plan(
    spec: TrainingSpec,
    world_size: int,
    budget_bytes: int,
    cost_model: CostModel | None = None,
    top: int = 10,
    calibrated: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The user's layout judged against ``budget_bytes``, and the ``top`` layouts that fit,
    cheapest first (ties: more headroom first, then the layout's own order). ``calibrated``
    (from :func:`calibration`) corrects every term by what real runs measured."""
    if world_size < 1 or budget_bytes < 1:
        raise ValueError("the world size and the memory budget must be positive")
    model = cost_model or CostModel()
    factors = (calibrated or {}).get("factors") or None
    mine = evaluate(spec, current_layout(spec), None, model, factors)
    assert mine is not None, "the user's spec was validated before planning"
    searched = dominated = 0
    fitting: list[tuple[float, int, int, Plan]] = []
    settled: set[Layout] = set()  # layouts (recompute aside) whose cheapest fit is found
    for index, layout in enumerate(layouts(spec, world_size)):
        group = dataclasses.replace(layout, recompute=None, recompute_method="uniform",
                                    recompute_num_layers=1)  # fmt: skip
        if group in settled:
            dominated += 1
            continue
        searched += 1
        found = evaluate(spec, layout, budget_bytes, model, factors)
        if found is not None:
            settled.add(group)
            fitting.append((round(found.cost["total"], 9), found.peak_bytes, index, found))
    fitting.sort(key=lambda t: t[:3])
    chosen = [t[3] for t in fitting[:top]]
    for p in chosen:
        p.term_changes = _term_changes(mine, p)
    return {
        "budget_bytes": budget_bytes,
        "world_size": world_size,
        "uncertainty": ESTIMATE_UNCERTAINTY,
        "cost_model": dataclasses.asdict(model),
        "calibration": dict(calibrated) if calibrated else None,
        "searched": searched,
        "dominated": dominated,
        "fitting": len(fitting),
        "current": mine.to_dict(budget_bytes),
        "plans": [p.to_dict(budget_bytes) for p in chosen],
    }


def _term_changes(mine: Plan, other: Plan) -> dict[str, int]:
    """Per term, the binding stage's bytes of ``other`` minus the user's binding stage's."""
    a = mine.stages[mine.worst_stage]["components"]
    b = other.stages[other.worst_stage]["components"]
    return {k: int(b.get(k, 0)) - int(a.get(k, 0)) for k in sorted(set(a) | set(b))}
