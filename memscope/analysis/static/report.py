"""Builds the ``static_report.json`` document: the original Phase-1 schema plus per-rank estimates.

``summary`` / ``operators`` / ``metadata`` keep the original keys and describe the selected
rank; ``ranks`` holds every distinct rank position of the job (with the global ranks that
share it: data- and context-parallel peers hold the same shard), ``allowance`` what the
estimate leaves out on a GPU. ``peak_memory_bytes`` = ``persistent_memory_bytes`` +
``workspace_memory_bytes`` (fixed cuBLAS / Transformer Engine workspaces on a GPU, and the
RL loop's inference KV cache and CUDA-graph buffers) +
``activation_memory_bytes`` + ``temporary_memory_bytes`` at ``peak_stage`` (activations are
zero when the optimizer step is the peak, as in the original).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from memscope._version import __version__
from memscope.analysis.static.activations import dims
from memscope.analysis.static.allowance import allowance
from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.estimator import (
    SOURCE,
    RankEstimate,
    estimate_rank,
    ranks_by_position,
)
from memscope.analysis.static.moe import imbalance_range
from memscope.events.schema import SCHEMA_VERSION
from memscope.units import format_bytes

REPORT_TYPE_STATIC = "static"
APPROXIMATE = (
    "parameters, gradients and optimizer state are exact for megatron-core GPTModel (local "
    "spec; the distributed optimizer's bucket padding is not modelled); activations follow "
    "the tensors megatron-core's unfused local-spec layers keep, the 1F1B/interleaved "
    "in-flight microbatches and the backward working set, checked against exact CPU "
    "measurement (tools/bench_static_accuracy.py); CUDA context, NCCL buffers and allocator "
    "fragmentation are a separate allowance"
)
# per-layer item -> (shape in the notation, formula) for the operator records
LAYER_ITEMS = {
    "norm_outputs": ("[s/sp, b, h] x2", "2 s b h e / sp"),
    "norm_statistics": ("[s/sp, b] x2 per norm", "2 x stats x s b 4 / sp"),
    "attention_residual": ("[s/sp, b, h]", "s b h e / sp"),
    "layer_output": ("[s/sp, b, h]", "s b h e / sp"),
    "attention_qkv": ("[s, b, a/t, d] x3", "3 s b a d e / t"),
    "attention_context": ("[s, b, a/t, d]", "s b a d e / t"),
    "attention_scores": ("[b, a/t, s, s]", "b a s^2 e / t"),
    "attention_dropout": ("[b, a/t, s, s] x2", "b a s^2 (e + mask) / t"),
    "attention_softmax_lse": ("[b, a/t, s]", "4 b a s / t"),
    "attention_mask_recompute": ("[]", "4"),
    "mlp": ("[s, b, f/t] x2 (SwiGLU x5)", "(2 | 5) s b f e / t"),
    "residual_dropout_masks": ("[s/sp, b, h] x2", "2 s b h mask / sp"),
}


def _op(
    name: str,
    category: str,
    phase: str,
    memory: int,
    persistent: bool,
    formula: str,
    notes: str,
    shape: str = "",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    outputs = [{"name": name, "shape": shape, "dtype": "", "bytes": memory}] if shape else []
    return {
        "name": name,
        "category": category,
        "phase": phase,
        "inputs": [],
        "outputs": outputs,
        "memory_bytes": memory,
        "persistent": persistent,
        "formula": formula,
        "notes": notes,
        "extra": extra or {},
    }


# RankEstimate.weight_terms: where each comes from
WEIGHT_TERM_NOTES = {
    "quantized_primary_weights_delta": "FP8/FP4 parameters instead of 16-bit ones (fp8.py)",
    "quantized_weight_copies": "Transformer Engine's cached FP8/FP4 weight copies (fp8.py)",
    "scaling_state": "FP8/FP4 scales and amax histories (fp8.py)",
    "teacher_weights": "the frozen distillation teacher (distillation.py)",
    "teacher_quantized_weights": "the teacher's row-wise FP8/FP4 weight copies (distillation.py)",
    "rl_inference_model_weights": "the RL loop's separate inference model (rl.py)",
}
# RankEstimate.workspaces that are not GEMM workspaces: (formula, notes)
BUFFER_NOTES = {
    "rl_inference_kv_cache": (
        "[2, L/pp, blocks, block_size, kv_heads/tp, head_dim] x dtype, blocks = buffer GiB x "
        "2^30 // block bytes",
        "the RL loop's inference KV-cache buffer, kept while the trainer steps (rl.py)",
    ),
    "rl_inference_cuda_graphs": (
        "per captured batch dimension: (layers + 1) x [T, 1, h] x dtype",
        "the layer outputs and first-layer inputs the RL engine's inference CUDA graphs keep "
        "(rl.py)",
    ),
}
GEMM_WORKSPACE = (
    "torch: 2 x CUBLAS_WORKSPACE_CONFIG or the GPU's default; TE: 32 MiB (sm >= 9) or 4 MiB",
    "fixed GPU workspace allocated at the first GEMM and kept "
    "(memscope/analysis/static/workspaces.py names the sources)",
)


def operator_records(spec: TrainingSpec, est: RankEstimate) -> list[dict[str, Any]]:
    """Operator-level records of one rank (notation: see memscope.analysis.static.activations).

    Per-layer records are per layer and microbatch; ``extra`` says how often they count.
    """
    per, act = est.persistent, est.activations
    x = dims(spec)
    dtype = spec.precision.params_dtype
    ops = [
        _op(
            "parameters",
            "weights",
            "persistent",
            per.weight_bytes - sum(est.weight_terms.values()),  # the rest: weight_terms below
            True,
            "param_count x e",
            f"{per.param_count:,} parameters in {len(est.params)} tensors on this rank",
            extra={"tensors": {t.name: t.numel for t in est.params}},
        ),
        _op(
            "gradients",
            "gradients",
            "backward",
            per.grad_bytes,
            True,
            "param_count x (4 if fp32 grads else e)",
            "Megatron DDP gradient buffer",
        ),
        _op(
            "optimizer_state",
            "optimizer",
            "optimizer_step",
            per.optimizer_bytes,
            True,
            "param_count x (8 [Adam m, v] + 4 [fp32 master under bf16/fp16]) / dp if distributed",
            f"{spec.precision.optimizer}, distributed={spec.precision.distributed_optimizer}",
        ),
    ]
    ops += [
        _op(
            f"parameters.{name}",
            "weights",
            "persistent",
            size,
            False,
            "",
            WEIGHT_TERM_NOTES.get(name, ""),
        )
        for name, size in est.weight_terms.items()
    ]
    counts = {"in_flight": act.in_flight, "dtype": dtype}
    for key, value in act.per_layer.items():
        shape, formula = LAYER_ITEMS.get(key, ("", ""))
        ops.append(
            _op(
                f"transformer_layer.{key}",
                "activations",
                "forward",
                value,
                False,
                formula,
                f"per layer and microbatch (recompute={spec.recompute})",
                shape,
                counts,
            )
        )
    for key, value in act.detail.items():
        ops.append(
            _op(
                f"chunk.{key}",
                "activations",
                "forward",
                value,
                False,
                "",
                "per (chunk-)microbatch in flight"
                if key != "layers"
                else "all layers of the chunk as stored (recompute applied)",
                extra=counts,
            )
        )
    ops += [
        _op(
            "backward.working_set",
            "temporary",
            "backward",
            act.backward_working_bytes,
            False,
            "gradients alive minus saved tensors released",
            f"peak at {act.peak_moment}",
        ),
        _op(
            "megatron.global_buffer",
            "temporary",
            "forward",
            act.buffer_bytes,
            False,
            "max(b a s^2 e / t, s b h e if SP)",
            "reused for attention scores / SP all-gather",
            f"[{x.b}, {x.a}, {x.s}, {x.s}]",
        ),
        _op(
            "optimizer_step.temporaries",
            "temporary",
            "optimizer_step",
            est.optimizer_step_bytes,
            False,
            "2 x largest parameter x 4 (torch Adam)",
            "sqrt and division of one parameter's denominator",
        ),
    ]
    ops += [
        _op(
            f"workspace.{name}",
            "other",
            "forward",
            size,
            True,
            *BUFFER_NOTES.get(name, GEMM_WORKSPACE),
        )
        for name, size in est.workspaces.items()
    ]
    return ops + rollout_records(est)


def rollout_records(est: RankEstimate) -> list[dict[str, Any]]:
    """The RL rollout's moment (:mod:`.rl_rollout`): the engine's step and what the offload
    moves to the host; none outside the RL loop."""
    r = est.rollout
    if r is None:
        return []
    records = [
        _op(
            "rl_rollout.logits",
            "temporary",
            "rl_rollout",
            r.logits_bytes,
            False,
            "rows x V x max(gather, e + sampling, e + log-probabilities)",
            f"the engine's fullest step ({r.requests} requests): full-vocabulary logits, "
            "gathered over the tensor ranks, sampled, their fp32 log-probabilities",
        ),
        _op(
            "rl_rollout.forward",
            "temporary",
            "rl_rollout",
            r.forward_bytes,
            False,
            "T x (2 h + one layer's working set) x e",
            f"the largest eager step: {r.tokens} tokens"
            if r.tokens
            else "every step replays a captured CUDA graph",
        ),
    ]
    if r.kv_cache_bytes:
        records.append(
            _op(
                "rl_rollout.kv_cache",
                "other",
                "rl_rollout",
                r.kv_cache_bytes,
                False,
                "the KV buffer",
                "allocated for the rollout, deleted for the training step (recompute mode)",
            )
        )
    if r.capture_bytes:
        records.append(
            _op(
                "rl_rollout.cuda_graph_capture",
                "temporary",
                "rl_rollout",
                r.capture_bytes,
                False,
                "max(the layers' eager warm-ups, the largest graph's gathered logits)",
                "the engine's CUDA graphs captured at its first rollout (and at each resume "
                "outside persist mode)",
            )
        )
    host = (
        ("optimizer", r.offloaded_optimizer_bytes, "the optimizer's tensors"),
        ("gradients", r.offloaded_grad_bytes, "model chunk 0's gradient buffers"),
    )
    records += [
        _op(
            f"rl_rollout.{category}_on_host",
            category,
            "rl_rollout",
            -size,
            False,
            "moved to the host for the rollout",
            f"{what} (--rl-offload-optimizer-during-inference)",
        )
        for category, size, what in host
        if size
    ]
    return records


def summary(est: RankEstimate) -> dict[str, Any]:
    """The original summary keys for one rank."""
    per, act = est.persistent, est.activations
    forward_backward = est.peak_stage == "forward_backward"
    activations = act.saved_bytes if forward_backward else 0
    return {
        "param_count": per.param_count,
        "weight_memory_bytes": per.weight_bytes,
        "grad_memory_bytes": per.grad_bytes,
        "optimizer_memory_bytes": per.optimizer_bytes,
        "activation_memory_bytes": activations,
        "temporary_memory_bytes": est.transient_bytes - activations,
        "persistent_memory_bytes": per.total_bytes,
        "workspace_memory_bytes": est.workspace_bytes,
        "steady_memory_bytes": est.steady_bytes,
        "peak_memory_bytes": est.peak_memory_bytes,
        "peak_stage": est.peak_stage,
    }


def device_total(allowance_doc: dict[str, Any], rank_summary: dict[str, Any]) -> dict[str, Any]:
    """The allowance with ``device_total_bytes``: the selected rank's estimated PyTorch peak
    plus the CUDA context and NCCL buffers outside the caching allocator (what decides
    whether it fits near the limit; fragmentation still comes on top)."""
    total = int(rank_summary["peak_memory_bytes"]) + int(allowance_doc["total_bytes"])
    formulas = {
        **allowance_doc["formulas"],
        "device_total_bytes": "peak_memory_bytes + cuda_context_bytes + nccl_buffer_bytes "
        "(before allocator rounding and fragmentation)",
    }
    return {**allowance_doc, "device_total_bytes": total, "formulas": formulas}


def build_static_report(
    spec: TrainingSpec,
    estimates: list[RankEstimate],
    selected: RankEstimate,
    config_path: str | None = None,
    coverage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report as a JSON-ready dict; ``summary``/``operators`` describe ``selected``.

    ``coverage`` (plain data, ``ConfigCoverage.to_dict()`` of :mod:`.coverage`) becomes the
    top-level ``coverage`` block: assumptions, unused and not-modelled config keys."""
    peers = ranks_by_position(spec)
    ranks = [
        {**est.to_dict(), **summary(est), "global_ranks": peers[est.position]} for est in estimates
    ]
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "report_type": REPORT_TYPE_STATIC,
        "tool": {"name": "memscope", "version": __version__},
        "world_size": spec.parallel.world_size,
        "summary": {
            **summary(selected),
            "tp_rank": selected.position.tp_rank,
            "pp_rank": selected.position.pp_rank,
            "global_ranks": peers[selected.position],
        },
        "operators": operator_records(spec, selected),
        "ranks": ranks,
        "allowance": device_total(allowance(spec).to_dict(), summary(selected)),
        "metadata": {
            "mode": "static",
            "model_type": "gpt",
            "dtype": spec.precision.params_dtype,
            "source": SOURCE,
            "config_path": config_path,
            "spec": asdict(spec),
            "world_size": spec.parallel.world_size,
            "approximations": APPROXIMATE,
        },
    }
    imbalance = imbalance_range(
        spec, lambda s: estimate_rank(s, selected.position).peak_memory_bytes
    )
    if imbalance is not None:
        report["summary"]["moe_token_imbalance"] = imbalance
    if coverage is not None:
        report["coverage"] = coverage
        if imbalance is not None:  # the MoE assumption's range, beside the assumption itself
            low, high = imbalance["peak_bytes_balanced"], imbalance["peak_bytes_at_bound"]
            report["coverage"] = {
                **coverage,
                "approximated": [
                    *coverage.get("approximated", []),
                    f"this rank's peak ranges from {format_bytes(low)} (balanced routing) to "
                    f"{format_bytes(high)} (imbalance bound {imbalance['bound']:g})",
                ],
            }
    return report
