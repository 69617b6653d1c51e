"""Activation memory of a mixture-of-experts MLP (megatron/core/transformer/moe/).

Per microbatch, what one ``MoELayer`` keeps for backward on one rank, itemised, for the
busiest rank under an assumed token imbalance (``moe_token_imbalance``, 1.0 = balanced).
Each term follows what megatron-core 0.15 (FlagScale 0.8.0's bundled Megatron-LM) and 0.16
save, and the held bytes were measured exactly on CPU for the
allgather and alltoall dispatchers, bf16 and fp32, ep 1 and 2, capacity padding, an fp32
router and the aux loss (``tests/test_static_moe_activations.py``).

Notation: ``T`` tokens entering the layer on this rank (``s/sp * b``: MoE under TP needs
sequence parallelism), ``k`` top-k, ``E`` experts, ``E_l = E / ep`` local experts, ``etp``
expert tensor parallel, ``G = etp * ep`` (the dispatcher's token group), ``r`` bytes of the
router dtype (``moe_router_dtype``, else the activation dtype), ``n`` rows reaching this
rank's experts.

- **Routed rows.** Every dispatcher brings ``n = T k etp`` rows to a rank under balanced
  routing (token_dispatcher.py: allgather gathers over ``G``; alltoall permutes ``T k`` rows,
  exchanges them over EP and all-gathers over expert TP). Dropless routing is not balanced:
  the busiest rank gets ``n = ceil(T k etp * moe_token_imbalance)`` rows, an assumption the
  report states with its bound ``ep * min(k, E_l) / k`` (:func:`imbalance_bound`); the
  experts' saved tensors and their backward scale with it, the local permute does not. With
  ``moe_pad_expert_input_to_capacity`` every local expert gets its capacity
  ``C = ceil(T k / E * capacity_factor)`` from each of the ``G`` sources: ``n = C E etp``
  (moe_utils.py ``get_capacity``). A capacity factor below one drops tokens beyond it.
- **Router** (router.py, moe_utils.py ``topk_routing_with_score_function``): the gating
  linear keeps the layer's input (already counted) and not the ``[T, E]`` logits; softmax
  top-k keeps the int64 top-k indices and the fp32 top-k softmax (``12 T k``); sigmoid
  scoring keeps the fp32 ``[T, E]`` scores as well; an aux loss (a load-balancing type with a
  positive ``moe_aux_loss_coeff``) keeps the fp32 ``[T, E]`` scores, the int64 tokens per
  expert and the loss scalar; the z-loss (``moe_z_loss_coeff``, router.py ``apply_z_loss``,
  moe_utils.py ``z_loss_func``) keeps the router-dtype ``[T, E]`` logits (``logsumexp``'s
  input), its ``[T]`` result and the scalar ``MoEAuxLossAutoScaler`` saves.
- **Dispatcher** (token_dispatcher.py, moe_utils.py ``permute``): allgather keeps the int64
  sort indices of its ``n`` rows, the transposed probabilities and routing mask that
  ``masked_select`` saves over the gathered ``T G`` tokens, and holds the local routing map;
  alltoall keeps the sort indices of its ``T k`` local rows, the transposed probabilities and
  mask over ``T`` tokens (from megatron-core 0.17 the int64 ``[E, T]`` argsort instead:
  megatron_versions.py), and holds ``probs``, ``routing_map`` and (``E_l > 1``) the per-expert
  token counts as attributes; padded to capacity it keeps two int64 index vectors of
  ``C E`` instead of the transposed copies. With ``moe_permute_fusion`` (Transformer Engine)
  the fused permute keeps one int32 ``[E, T]`` row map instead of the sort indices (and, for
  alltoall, the transposed copies: allgather makes its own outside ``permute``), read from
  TE's permutation.py, not measurable on CPU. The allgather
  dispatcher with ``G > 1`` gathers the hidden states into megatron's global memory buffer
  (``T G h`` at the activation dtype, one buffer per process, counted with the global buffer).
- **Experts** (experts.py): the permuted tokens (``n h``), the probabilities applied inside
  the experts (``r n``) and ``A n f_e / etp`` activation-dtype elements of the expert MLP:
  ``A = 6`` gated unfused (fc1's ``2f`` output, silu, the linear branch plus its offset, their
  product), 3 gated with the fused weighted bias-SwiGLU (fusions/fused_bias_swiglu.py) and
  for the legacy ``GroupedMLP`` whose ``torch.compile``d activation keeps fc1's output only,
  3 not gated (fc1 output, activation, the probability-weighted product). The legacy
  ``GroupedMLP`` also keeps the int64 tokens per local expert. Before megatron-core 0.13,
  experts with biases behind the allgather dispatcher keep their ``[n, h]`` per-row fc2 bias
  too (``megatron_versions.moe_expert_bias_saved``); and, whatever the bias, the experts ran
  unweighted, the dispatcher keeping their ``[n, h]`` output to weight it instead
  (``megatron_versions.PROBS_IN_EXPERTS``).
- **Shared experts** (shared_experts.py): a dense TP-sharded MLP of its own width over the
  whole sequence. With ``moe_shared_expert_overlap`` under sequence parallelism fc1 keeps the
  all-gathered ``[s, b, h]`` input (``pre_forward_comm``) instead of the local norm output.

The ``flex`` dispatcher (DeepEP) is estimated as alltoall: its communication buffers are not
counted (stated in the report's approximations).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.megatron_versions import (
    ARGSORT_PERMUTE,
    at_least,
    dense_mlp_tensors,
    glu_fused,
    glu_linear_copies,
    legacy_grouped_mlp,
    moe_expert_bias_saved,
    probs_in_experts,
)

FP32 = 4
INT32 = 4
INT64 = 8
ROUTER_DTYPE_BYTES = {"fp32": 4, "fp64": 8}


def router_bytes(spec: TrainingSpec, element: int) -> int:
    """Bytes of one router-dtype element (``moe_router_dtype``, else the activations')."""
    dtype = spec.model.moe_router_dtype
    return ROUTER_DTYPE_BYTES[dtype] if dtype else element


def imbalance_bound(spec: TrainingSpec) -> float:
    """The largest possible ``moe_token_imbalance`` under dropless routing: every token of the
    ``ep`` ranks that exchange tokens (token_dispatcher.py's alltoall over the EP group, or the
    allgather over it) sends its top-k rows to the experts of one rank, at most
    ``min(k, E_l)`` rows each (top-k picks distinct experts). Balanced is ``k`` rows per token,
    so the bound is ``ep * min(k, E_l) / k``."""
    m, p = spec.model, spec.parallel
    assert m.num_experts is not None
    k = m.moe_router_topk
    return p.ep * min(k, m.num_experts // p.ep) / k


def routing_drift(spec: TrainingSpec, tokens: int, layers: int, iterations: int) -> float:
    """The ``moe_token_imbalance`` that independent per-token routing reaches at most, in
    expectation, at the busiest of ``iterations`` logged steps: a stated assumption of
    statistics, not what a trained router does (it learns preferences no config gives).

    Each of the ``T etp ep`` tokens whose rows a rank's experts may receive (``tokens`` is
    ``T``, the dispatcher exchanges them over ``G``) picks ``k`` distinct experts; under
    exchangeable routing the picks landing on the rank's ``E_l`` of ``E`` experts are
    hypergeometric: mean ``k q`` and variance ``k q (1 - q) (E - k) / (E - 1)``, ``q = E_l / E``.
    The peak holds at least one microbatch of ``layers`` MoE layers, whose independent routings
    add up; the expected maximum of ``iterations`` normal draws is at most ``sqrt(2 ln R)``
    standard deviations, so the factor is ``1 + sqrt(2 ln R) sqrt(var / (N layers)) / mean``
    (more in-flight microbatches only shrink it). The per-token law is checked against
    megatron-core's ``TopKRouter`` at init in ``tests/test_static_moe_terms.py``."""
    m, p = spec.model, spec.parallel
    assert m.num_experts is not None
    experts, k = m.num_experts, m.moe_router_topk
    q = (experts // p.ep) / experts
    if q >= 1 or layers < 1 or iterations < 2:
        return 1.0
    mean = k * q
    var = k * q * (1 - q) * (experts - k) / (experts - 1)
    n = tokens * p.expert_tp * p.ep * layers
    return 1 + math.sqrt(2 * math.log(iterations)) * math.sqrt(var / n) / mean


def imbalance_range(
    spec: TrainingSpec, peak: Callable[[TrainingSpec], int]
) -> dict[str, float] | None:
    """The assumed ``moe_token_imbalance``, its bound and ``peak`` (a rank's peak bytes of a
    spec) at balanced routing and at the bound; None without experts or with capacity."""
    m = spec.model
    factor = m.moe_expert_capacity_factor
    if m.num_experts is None or (factor is not None and factor >= 0):
        return None
    bound = imbalance_bound(spec)

    def at(value: float) -> int:
        return peak(
            dataclasses.replace(spec, model=dataclasses.replace(m, moe_token_imbalance=value))
        )

    return {
        "assumed": m.moe_token_imbalance,
        "bound": bound,
        "peak_bytes_balanced": at(1.0),
        "peak_bytes_at_bound": at(bound),
    }


def routed_rows(spec: TrainingSpec, tokens: int) -> int:
    """Rows reaching one rank's local experts per microbatch: balanced routing times the
    assumed ``moe_token_imbalance`` of the busiest rank (dropless), capped by the capacity."""
    m, p = spec.model, spec.parallel
    assert m.num_experts is not None
    etp, k, experts = p.expert_tp, m.moe_router_topk, m.num_experts
    busiest = math.ceil(tokens * k * etp * m.moe_token_imbalance)
    factor = m.moe_expert_capacity_factor
    if factor is None or factor < 0:  # dropless (a negative factor turns capacity off)
        return busiest
    capacity = math.ceil(tokens * k / experts * factor)
    if m.moe_pad_expert_input_to_capacity:
        return capacity * experts * etp
    return min(busiest, capacity * experts * etp)


def _expert_rows(spec: TrainingSpec) -> tuple[bool, int]:
    """(legacy ``GroupedMLP``, f-wide rows an expert keeps per routed row): 3 not gated, with
    the fused weighted SwiGLU or the compiled legacy activation, else 6 (the ``2f``-wide fc1
    output, the activation, the linear half's copy, the product and its probability-weighted
    copy; 5 before 0.15, :func:`.glu_linear_copies`).

    Before megatron-core 0.13 (:func:`.probs_in_experts`) the experts ran unweighted: fc1's
    output and the activation not gated (the fused ``bias_gelu`` keeps its input, fc2 its
    input); gated, fc1's ``2f`` output and the product when fused (``bias_swiglu``) or
    compiled (legacy ``GroupedMLP``'s ``glu``), with the ``silu`` output between unfused."""
    m = spec.model
    legacy = legacy_grouped_mlp(m)
    if not probs_in_experts(m):
        if not m.gated_linear_unit:
            return legacy, 2
        return legacy, 3 if glu_fused(m) or legacy else 4
    if not m.gated_linear_unit or glu_fused(m) or legacy:
        return legacy, 3
    return legacy, 5 + glu_linear_copies(m)


def _permute_saved(spec: TrainingSpec, r: int, cells: int) -> int:
    """What moe_utils.py ``permute`` (dropless, unfused, with probabilities) keeps for the
    probabilities' backward over the ``[E, T]`` routing mask of ``cells`` entries: up to 0.16
    ``masked_select`` keeps the transposed probabilities and the mask; from 0.17 the index
    into the probabilities is a slice of the int64 ``argsort`` of the whole flattened mask,
    which keeps that sort's storage (megatron_versions.ARGSORT_PERMUTE)."""
    if at_least(spec.model, ARGSORT_PERMUTE):
        return INT64 * cells
    return (r + 1) * cells


def _dispatcher_parts(spec: TrainingSpec, tokens: int, r: int, n: int) -> tuple[int, int]:
    """The dispatcher term of :func:`moe_layer_saved` in two parts: (what the token
    dispatcher holds through its own attributes after the forward, what only autograd keeps).

    Read from megatron-core 0.16.1 transformer/moe/token_dispatcher.py. The alltoall
    dispatcher's ``dispatch_preprocess`` sets ``self.probs`` and ``self.routing_map`` (the
    router's ``[T, E]`` outputs, lines 610-611) and
    ``self.reversed_local_input_permutation_mapping`` (lines 634-644: what moe_utils.py
    ``permute`` returns, the int64 sort indices that its ``index_select`` also saves, TE's
    int32 row map when fused), and ``preprocess`` sets
    ``self.num_global_tokens_per_local_expert`` (line 578 for ``E_l > 1``; padded to capacity
    line 502 sets it always, on the host unless fused, line 404; unfused dropless it is moved
    to the host at the device-to-host point, lines 891-894: counted as device bytes here as
    in the layer's term, measured so on CPU). None of them is cleared: they live until the
    next forward. The allgather dispatcher's ``dispatch_postprocess`` sets ``self.local_map``
    (line 287, the bool ``[T G, E_l]`` local routing map), the reversed mapping (line 297)
    and ``self.local_probs`` (line 304, the experts' probabilities, counted with the experts:
    see :func:`dispatcher_held`), and clears ``self.routing_map`` (line 307). The held part
    counts each such storage once; the autograd part is what else the backward keeps."""
    m, p = spec.model, spec.parallel
    assert m.num_experts is not None
    k, experts = m.moe_router_topk, m.num_experts
    local, etp = experts // p.ep, p.expert_tp
    gathered = tokens * etp * p.ep
    padded = m.moe_pad_expert_input_to_capacity and m.moe_expert_capacity_factor is not None
    fused = m.moe_permute_fusion and m.transformer_impl == "transformer_engine"
    counts = INT64 * experts * etp if local > 1 else 0  # num_global_tokens_per_local_expert
    if m.moe_token_dispatcher == "allgather":
        # local_map, then the reversed mapping: Transformer Engine's fused permute
        # (moe_utils.permute -> TE moe_permute, permutation.py _moe_permute_mask_map) returns
        # and saves its int32 [E_l, T G] row map; unfused, the int64 sort indices of n rows
        mapping = INT32 * local * gathered if fused else INT64 * n
        held = gathered * local + mapping
        # local_probs.T.contiguous().masked_select(local_map.T.contiguous()) keeps the
        # transposed probabilities and mask, fused or not (it runs outside permute)
        return held, (r + 1) * gathered * local
    probs_and_map = (r + 1) * tokens * experts  # self.probs and self.routing_map
    if fused:
        # TE's moe_permute_with_probs saves only its int32 [E, T] row map, which is the
        # reversed mapping held (not measurable on CPU: needs Transformer Engine)
        return INT32 * experts * tokens + probs_and_map + counts, 0
    if padded:
        # moe_utils.permute with drop_and_pad: the sort indices of C E rows (held, and saved
        # by the tokens' index_select) and the probabilities' int64 index (autograd only)
        capacity = math.ceil(tokens * k / experts * (m.moe_expert_capacity_factor or 1.0))
        return INT64 * capacity * experts + probs_and_map + counts, INT64 * capacity * experts
    # alltoall (and flex, estimated alike): the sort indices of the T k local rows held
    # (from 0.17 argsort-based: the held part is not checked past 0.16), the probabilities'
    # backward in permute's masked_select (or the 0.17 argsort) kept by autograd only
    return INT64 * tokens * k + probs_and_map + counts, _permute_saved(spec, r, tokens * experts)


def dispatcher_held(spec: TrainingSpec, s: int, b: int, sp: int, e: int) -> int:
    """Bytes one MoE layer's token dispatcher still holds through its attributes after its
    forward (:func:`_dispatcher_parts`), which a checkpointed MoE layer (``recompute_modules``
    ``moe``) cannot drop: they outlive the layer's backward too. For the allgather dispatcher
    this includes ``local_probs``, the ``r n`` probabilities :func:`moe_layer_saved` counts
    with the experts. Measured for the unfused alltoall dispatcher
    (``tests/test_static_recompute_measured.py``); the rest is read from the source."""
    m = spec.model
    tokens = s // sp * b
    r, n = router_bytes(spec, e), routed_rows(spec, tokens)
    held = _dispatcher_parts(spec, tokens, r, n)[0]
    if m.moe_token_dispatcher == "allgather":
        held += r * n  # self.local_probs (token_dispatcher.py dispatch_postprocess)
    return held


def moe_layer_saved(
    spec: TrainingSpec, s: int, b: int, sp: int, e: int, rows: int | None = None
) -> dict[str, int]:
    """What one MoE MLP keeps for backward per microbatch, itemised (sequence ``s`` per
    rank before the sequence-parallel split ``sp``, micro batch ``b``, activation bytes
    ``e``; ``rows`` reaching the local experts when known, else :func:`routed_rows`)."""
    m, p = spec.model, spec.parallel
    assert m.num_experts is not None
    h, k, experts = m.hidden_size, m.moe_router_topk, m.num_experts
    local, etp = experts // p.ep, p.expert_tp
    tokens = s // sp * b
    r = router_bytes(spec, e)
    n = routed_rows(spec, tokens) if rows is None else rows

    router = (INT64 + FP32) * tokens * k
    if m.moe_router_score_function == "sigmoid":
        router += FP32 * tokens * experts
    if m.moe_aux_loss:
        router += FP32 * tokens * experts + INT64 * experts + FP32
    if m.moe_z_loss:  # logsumexp keeps the [T, E] logits and its [T] result; the scaler the loss
        router += r * tokens * experts + r * tokens + r

    held, autograd_only = _dispatcher_parts(spec, tokens, r, n)
    dispatcher = held + autograd_only

    legacy_grouped, per_row = _expert_rows(spec)
    experts_bytes = n * h * e + r * n + per_row * n * (m.moe_ffn // etp) * e
    if legacy_grouped:
        experts_bytes += INT64 * local
    if not probs_in_experts(m):
        # before 0.13 the dispatcher weights the experts' output by the probabilities, which
        # keeps it for backward: the allgather dispatcher on the experts' side, the n rows
        # (token_unpermutation); alltoall in moe_utils.unpermute after the output came back,
        # this rank's T k rows
        weighted = n if m.moe_token_dispatcher == "allgather" else tokens * k
        experts_bytes += weighted * h * e
    if moe_expert_bias_saved(m, local):  # before 0.13: bias * permuted_probs keeps the bias
        experts_bytes += n * h * e
    out = {"moe_router": router, "moe_dispatcher": dispatcher, "moe_experts": experts_bytes}
    shared = m.moe_shared_expert_intermediate_size
    if shared:
        out["moe_shared_experts"] = dense_mlp_tensors(m) * s * b * (shared // p.tp) * e
        if m.moe_shared_expert_overlap and sp > 1:
            # shared_experts.py pre_forward_comm: the input is all-gathered outside fc1 (whose
            # parallel_mode is cleared), so fc1 keeps the whole-sequence [s, b, h] input
            # instead of the [s/sp, b, h] norm output the layer keeps anyway
            out["moe_shared_experts"] += (s - s // sp) * b * h * e
    return out


def expert_offload_bytes(spec: TrainingSpec, s: int, b: int, sp: int, e: int) -> int:
    """What fine-grained offloading's ``expert_fc1`` and ``moe_act`` groups move to the host
    per MoE layer (megatron-core 0.20 transformer/moe/experts.py ``TEGroupedMLP.forward``,
    unfused experts only):

    * ``expert_fc1``: fc1's input, the ``[A, h]`` permuted tokens, which Transformer Engine's
      ``GroupedLinear`` saves split per local expert (each split checked against
      ``min_offloaded_tensor_size``);
    * ``moe_act``: what the activation saves inside its group: fc1's ``2f``-wide output (``f``
      not gated) when ``moe_act`` is recomputed (the checkpoint's input) or the fused
      weighted SwiGLU runs, else every f-wide row it keeps but fc2's input."""
    m, p = spec.model, spec.parallel
    assert m.num_experts is not None
    n = routed_rows(spec, s // sp * b)
    f, local = m.moe_ffn // p.expert_tp, max(1, m.num_experts // p.ep)
    threshold, out = spec.min_offloaded_tensor_size, 0
    if "expert_fc1" in spec.offload_modules and n // local * m.hidden_size >= threshold:
        out += n * m.hidden_size * e
    if "moe_act" in spec.offload_modules:
        width = 2 if m.gated_linear_unit else 1
        inside = width if spec.recomputes("moe_act") or glu_fused(m) else _expert_rows(spec)[1] - 1
        if n * width * f >= threshold:
            out += inside * n * f * e
    return out


def moe_act_discarded(spec: TrainingSpec, s: int, b: int, sp: int, e: int) -> int:
    """What ``recompute_modules`` ``moe_act`` drops per MoE layer (megatron/core/transformer/
    moe/experts.py ``activation_recompute``: the activation runs under
    ``CheckpointWithoutOutput`` and its output is discarded once fc2 has consumed it): of the
    experts' ``A`` f-wide rows (:func:`moe_layer_saved`) all but fc1's output (``2f`` gated,
    ``f`` otherwise) are gone until the backward recomputes them."""
    m, p = spec.model, spec.parallel
    n = routed_rows(spec, s // sp * b)
    per_row = _expert_rows(spec)[1]
    kept = 2 if m.gated_linear_unit else 1
    return (per_row - kept) * n * (m.moe_ffn // p.expert_tp) * e


def moe_global_buffer(spec: TrainingSpec, s: int, b: int, sp: int, e: int) -> int:
    """The allgather dispatcher's gathered hidden states in megatron's global memory buffer
    (``G > 1``), else 0."""
    m, p = spec.model, spec.parallel
    group = p.expert_tp * p.ep
    if m.num_experts is None or m.moe_token_dispatcher != "allgather" or group == 1:
        return 0
    return s // sp * b * group * m.hidden_size * e
