"""What the static estimate of a config rests on: its assumptions, which config keys it read,
and which memory-relevant Megatron features the config turns on that it does not model.

:func:`memscope.inputs.config_files.load_config` gives the merged key mapping of a config
file as the estimator's readers build it; :func:`config_coverage` compares it with what
the estimator reads (:data:`.read_keys.READ_KEYS`) and with :data:`NOT_MODELLED`, and states the
assumptions the spec carries. Pure functions, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.cuda_graphs import eager_iterations_first, te_graphs
from memscope.analysis.static.megatron_versions import glu_fused, megatron_fsdp_loss_regather
from memscope.analysis.static.moe import imbalance_bound
from memscope.analysis.static.muon import uses_bucket_layout
from memscope.analysis.static.pipeline_layout import mtp_chunk
from memscope.analysis.static.read_keys import READ_KEYS, memscope_keys
from memscope.analysis.static.validation import show
from memscope.analysis.static.workspaces import gpu_words, te_words

# Memory-relevant Megatron / FlagScale arguments the estimator does not model: key -> what
# memory effect the estimate misses when the config sets it. A key the estimator reads
# (READ_KEYS) is never reported, so modelling a feature and adding its key to READ_KEYS takes
# it off this list without editing it (unless ``_RELEVANT`` names the values still not
# modelled: ``cuda_graph_impl=local``).
NOT_MODELLED: dict[str, str] = {
    "cuda_graph_impl": "Megatron's own CUDA graphs (cuda_graph_impl=local) keep static "
    "input/output buffers and a private memory pool per captured graph, not counted "
    "(Transformer Engine's graphs are modelled)",
    "enable_cuda_graph": "Megatron's own CUDA graphs (cuda_graph_impl=local) keep static "
    "input/output buffers and a private memory pool per captured graph, not counted "
    "(Transformer Engine's graphs are modelled)",
    "rl_training_cuda_graphs": "the RL loop's training CUDA graphs (Megatron's own, local) "
    "keep each training layer's forward output and input buffers and replay the layers' "
    "activations from their private pool: not counted (the estimate keeps them eager)",
    "use_dualpipev": "the DualPipeV schedule (two chunks per stage, its own in-flight "
    "micro-batches) is not modelled; the 1F1B/interleaved schedule is estimated instead",
    "distribute_saved_activations": "full-recompute checkpoints split over the tensor-parallel "
    "ranks: the estimate keeps each checkpoint whole on every rank (too high)",
    "moe_shared_expert_overlap": "the shared expert overlapped with the token dispatch keeps "
    "extra tensors alive, not counted",
    "recompute_granularity_per_stage_micro_batch": "FlagScale per-stage/micro-batch recompute: "
    "the global recompute settings are applied to every stage and micro-batch",
    "recompute_method_per_stage_micro_batch": "FlagScale per-stage/micro-batch recompute: the "
    "global recompute settings are applied to every stage and micro-batch",
    "recompute_num_layers_per_stage_micro_batch": "FlagScale per-stage/micro-batch recompute: "
    "the global recompute settings are applied to every stage and micro-batch",
}
# ``finetune`` is not listed: Megatron's --finetune only skips loading optimizer/RNG state.
# Keys by prefix (LoRA / PEFT adapters).
_ADAPTERS = (
    "LoRA/PEFT adapters: their parameters, gradients and optimizer state are not counted, and "
    "the frozen base weights are counted with gradients and optimizer state"
)
NOT_MODELLED_PREFIXES: dict[str, str] = {"lora": _ADAPTERS, "peft": _ADAPTERS}

# Values that mean "off" (Megatron's defaults), compared in lower case.
_OFF = frozenset(
    {"", "false", "no", "off", "0", "none", "null", "no_shard", "fp32", "float32",
     "torch.float32", "allgather"}
)  # fmt: skip
# Per-key defaults beyond _OFF (megatron-core TransformerConfig).
_DEFAULTS: dict[str, Any] = {"fp8_recipe": "delayed", "recompute_modules": ["core_attn"]}


# Keys that only matter together with another setting (else Megatron ignores them).
# A key the estimator reads is still reported when its predicate here says the value set is
# one it does not model.
_RELEVANT: dict[str, Callable[[Mapping[str, Any], TrainingSpec], bool]] = {
    "distribute_saved_activations": lambda merged, spec: spec.recompute == "full",
    "cuda_graph_impl": lambda merged, spec: _training_local_graphs(merged, spec),
    "enable_cuda_graph": lambda merged, spec: _training_local_graphs(merged, spec),
    # read (the rollout keeps the gradient buffers), its graphs still not modelled
    "rl_training_cuda_graphs": lambda merged, spec: True,
}


def _training_local_graphs(merged: Mapping[str, Any], spec: TrainingSpec) -> bool:
    """Whether Megatron's own CUDA graphs capture the training layers: ``local`` graphs,
    except in the RL loop, where they are the inference engine's (rl.py models them) unless
    ``rl_training_cuda_graphs`` graphs the training step too (its own warning)."""
    if spec.cuda_graph_impl != "local":
        return False
    return spec.rl is None


# Read by the JSON config reader besides READ_KEYS (its own names).
EXTRA_READ_KEYS = frozenset({"dtype", "model_type", "hetero_stage_layers", "hetero_stage_meshes"})
CUDA_ALLOWANCE = "CUDA context, NCCL buffers and allocator fragmentation (see allowance)"


@dataclass(frozen=True)
class NotModelled:
    """A memory-relevant key the config sets that the estimate does not model."""

    key: str
    value: str  # as written in the config (short, printable)
    reason: str  # the memory effect the estimate misses

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "reason": self.reason}

    def message(self) -> str:
        """One warning line."""
        return f"{self.key}={self.value} is not modelled: {self.reason}"


@dataclass(frozen=True)
class ConfigCoverage:
    """Assumptions of the estimate and how much of the config it covers."""

    unused_keys: tuple[str, ...]  # keys of the config the estimator does not read, sorted
    not_modelled: tuple[NotModelled, ...]  # memory-relevant keys set but not modelled
    assumptions: tuple[str, ...]
    modelled: tuple[str, ...]
    approximated: tuple[str, ...]
    not_modelled_features: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready data for the reports."""
        return {
            "assumptions": list(self.assumptions),
            "modelled": list(self.modelled),
            "approximated": list(self.approximated),
            "not_modelled_features": list(self.not_modelled_features),
            "not_modelled": [n.to_dict() for n in self.not_modelled],
            "unused_keys": list(self.unused_keys),
        }


def is_set(key: str, value: Any) -> bool:
    """Whether ``value`` turns ``key`` on: truthy and not Megatron's default (False, None, 0,
    ``"none"``, ``"no_shard"``, ``"fp32"``, ``"allgather"``, an empty list, ...)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if key in _DEFAULTS and value == _DEFAULTS[key]:
        return False
    if isinstance(value, (int, float)):
        return value > 0  # a negative capacity factor turns it off, as in Megatron
    if isinstance(value, str):
        return value.strip().lower() not in _OFF
    if isinstance(value, (list, tuple, dict, set)):
        return len(value) > 0
    return True


def _display(value: Any) -> str:
    if isinstance(value, str):
        text = value.strip()
        return text if len(text) <= 60 and text.isprintable() else show(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        text = "[" + ", ".join(_display(v) for v in value) + "]"
        return text if len(text) <= 60 else text[:56] + "...]"
    return show(value)


def _reason(key: str) -> str | None:
    if key in NOT_MODELLED:
        return NOT_MODELLED[key]
    for prefix, reason in NOT_MODELLED_PREFIXES.items():
        if key.startswith(prefix):
            return reason
    return None


def not_modelled(merged: Mapping[str, Any], spec: TrainingSpec) -> tuple[NotModelled, ...]:
    """The memory-relevant keys ``merged`` sets that the estimate does not model (in key
    order); keys the estimator reads are skipped."""
    out = []
    for key in sorted(merged):
        if key in READ_KEYS and key not in _RELEVANT:
            continue
        reason = _reason(key)
        value = merged[key]
        if reason is None or not is_set(key, value):
            continue
        relevant = _RELEVANT.get(key)
        if relevant is not None and not relevant(merged, spec):
            continue
        out.append(NotModelled(key, _display(value), reason))
    return tuple(out)


def _by_reason(items: tuple[NotModelled, ...]) -> list[list[NotModelled]]:
    """``items`` grouped by reason (LoRA's many keys, the CUDA-graph switches), in order."""
    groups: dict[str, list[NotModelled]] = {}
    for item in items:
        groups.setdefault(item.reason, []).append(item)
    return list(groups.values())


def warning_lines(items: tuple[NotModelled, ...]) -> list[str]:
    """One warning line per not-modelled key; keys that share a reason share one line."""
    out = []
    for group in _by_reason(items):
        if len(group) == 1:
            out.append(group[0].message())
        else:
            keys = ", ".join(f"{n.key}={n.value}" for n in group)
            out.append(f"{keys} are not modelled: {group[0].reason}")
    return out


def assumptions(spec: TrainingSpec, world_source: str | None = None) -> tuple[str, ...]:
    """What the estimate assumes that the config may not say."""
    m, p, prec = spec.model, spec.parallel, spec.precision
    out = []
    if spec.device == "cpu":
        out.append("device: cpu (dropout masks in the activation dtype; no GPU allowance)")
    else:
        out.append(f"device: cuda, GPU {gpu_words(spec.gpu)}")
        out.append(f"Transformer Engine {te_words(spec.transformer_engine_version)}")
    impl = (
        "Transformer Engine layers" if m.transformer_impl == "transformer_engine"
        else "megatron-core local-spec layers"
    )  # fmt: skip
    if spec.flash_attention:
        out.append(f"attention: a flash/fused kernel (no [b, a, s, s] scores kept); {impl}")
    else:
        out.append(f"attention: unfused, the [b, a, s, s] scores are kept; {impl}")
    if p.dp_assumed:
        out.append(
            f"world size not given: data-parallel size {p.dp} assumed (the least the grid "
            f"allows), world size {p.world_size}"
        )
    else:
        where = world_source or "the config"
        out.append(f"world size {p.world_size} (from {where}), data-parallel size {p.dp}")
    grads = "fp32" if prec.grads_in_fp32 else prec.params_dtype
    state = f"{prec.optimizer} state in fp32"
    if prec.optimizer == "sgd" and not prec.sgd_momentum:
        state = "no optimizer state (SGD without momentum)"
    master = ", fp32 master weights" if prec.mixed_precision else ""
    if prec.precision_aware and not prec.optimizer_cpu_offload:
        state = f"adam exp_avg {prec.exp_avg_dtype}, exp_avg_sq {prec.exp_avg_sq_dtype}"
        master = f", {prec.main_params_dtype} master weights" if prec.mixed_precision else ""
        if prec.mixed_precision and prec.store_param_remainders and prec.params_dtype in (
            "bfloat16", "bf16"
        ) and prec.main_params_dtype == "fp32":  # fmt: skip
            master = ", master weights as int16 remainders of the bf16 parameters"
        master += " (TE FusedAdam; Transformer Engine >= 2.1 assumed)"
    out.append(
        f"precision: {prec.params_dtype} parameters, {grads} gradient buffer, {state}{master}"
    )
    if prec.optimizer_cpu_offload:
        out.append(
            f"optimizer CPU offload: {prec.optimizer_offload_fraction:g} of the optimizer's "
            "fp32 parameter copies and Adam state in pinned host memory (exactly that "
            "fraction; the hybrid optimizer splits at whole tensors)"
        )
    if spec.cpu_offloading:
        out.append(
            "activation offload: Transformer Engine's offload context moves every tensor its "
            "modules save in the first cpu_offloading_num_layers layers (not megatron's "
            "dropout masks) and reloads one layer ahead; the local spec offloads nothing; "
            "weights stay on the GPU"
        )
    if te_graphs(spec) and not eager_iterations_first(spec):
        out.append(
            "CUDA graphs captured before the first optimizer step: no checkpoint loaded (Adam "
            "allocates its moments at its first step; a loaded checkpoint brings them earlier)"
        )
    return tuple(out)


def modelled_features(spec: TrainingSpec) -> tuple[str, ...]:
    """The features of this config the estimate models."""
    m, p, prec = spec.model, spec.parallel, spec.precision
    out = [
        "Transformer Engine layers" if m.transformer_impl == "transformer_engine"
        else "local-spec layers",
        "flash attention" if spec.flash_attention else "unfused attention",
    ]  # fmt: skip
    if not spec.flash_attention and getattr(m, "masked_softmax_fusion", False):
        out.append("fused scale-mask-softmax")
    if m.gated_linear_unit:
        out.append("fused bias-SwiGLU" if glu_fused(m) else "SwiGLU")
    cross_entropy = getattr(spec, "cross_entropy", None)  # "unfused" | "native" | "te"
    if cross_entropy not in (None, "unfused"):
        out.append(f"fused cross entropy ({cross_entropy})")
    elif getattr(spec, "cross_entropy_fusion", False):
        out.append("fused cross entropy")
    if prec.distributed_optimizer:
        instances = getattr(prec, "distributed_optimizer_instances", 1)
        more = f" ({instances} instances)" if instances > 1 else ""
        out.append(f"distributed optimizer{more}")
    if p.tp > 1:
        out.append(f"tensor parallel (tp={p.tp})")
    if p.pp > 1:
        out.append(f"interleaved pipeline (vpp={p.vpp})" if p.vpp else f"1F1B pipeline (pp={p.pp})")
    if p.stage_meshes is not None:
        out.append("heterogeneous stage meshes")
    if p.layout is not None:
        out.append(
            "pipeline_model_parallel_layout (per-chunk decoder layers; embedding, final norm, "
            "MTP and output layer placed as megatron-core builds them)"
        )
    if spec.recompute == "full":
        out.append(f"full recompute ({spec.recompute_method}, {spec.recompute_num_layers})")
    elif spec.recompute == "selective":
        out.append(f"selective recompute ({', '.join(spec.recompute_modules) or 'nothing'})")
    if prec.precision_aware:
        out.append("precision-aware optimizer (modelled from source, not measured on a GPU here)")
    if prec.optimizer in ("muon", "dist_muon"):
        shards = ", whole tensors per data-parallel rank" if prec.optimizer == "dist_muon" else ""
        if uses_bucket_layout(spec):
            shards = (
                ", whole Muon tensors bin-packed per DDP bucket onto the data-parallel ranks "
                "and the rest's Adam state byte-sharded (megatron-core's layer-wise layout)"
            )
        out.append(
            "Muon on 2-D tensors (one fp32 momentum), Adam on norms, biases, embedding and "
            f"output layer{shards}"
        )
    if prec.optimizer_cpu_offload:
        out.append(
            f"optimizer CPU offload (fraction {prec.optimizer_offload_fraction:g}; modelled "
            "from source, not measured on a GPU here)"
        )
    if spec.cpu_offloading:
        out.append(
            f"activation CPU offload ({spec.cpu_offloading_num_layers} layers; modelled from "
            "source, not measured on a GPU here)"
        )
    fsdp = "torch FSDP2" if spec.torch_fsdp2 else (
        f"Megatron-FSDP ({spec.fsdp})" if spec.fsdp is not None else None
    )  # fmt: skip
    if fsdp is not None:
        out.append(
            f"{fsdp}: parameters, gradients and optimizer state each whole or sharded over "
            "data parallel as its strategy says"
        )
    if spec.fine_grained_offloading:
        out.append(
            f"fine-grained activation offloading ({', '.join(spec.offload_modules)}; tensors of "
            f"at least {spec.min_offloaded_tensor_size:,} elements; modelled from source, not run "
            "here: it needs CUDA streams)"
        )
    if te_graphs(spec):
        scope = ", ".join(spec.cuda_graph_modules) or "whole layers"
        capture = (
            "after the eager warm-up" if eager_iterations_first(spec)
            else "before the first optimizer step"
        )  # fmt: skip
        out.append(
            f"Transformer Engine CUDA graphs ({scope}; captured {capture}): static inputs, "
            "the capture's high-water mark, replayed tensors in the private pool (derived from "
            "Megatron-LM's and Transformer Engine's code; CUDA graphs do not run on CPU, so "
            "not measured here)"
        )
    if p.sequence_parallel:
        out.append("sequence parallel")
    if p.cp > 1:
        out.append(f"context parallel (cp={p.cp}, {p.cp_comm_type})")
    if m.qk_layernorm:
        out.append("qk_layernorm")
    if m.num_experts:
        out.append(f"MoE ({m.num_experts} experts, top-{m.moe_router_topk}, ep={p.ep})")
    if m.multi_latent_attention:
        out.append("MLA")
    if m.mtp_num_layers:
        depths = f"{m.mtp_num_layers} layer{'s' if m.mtp_num_layers > 1 else ''}"
        out.append(f"MTP ({depths}: activations, logits and losses on the last stage)")
    out += _quant_and_kd_modelled(spec)
    return tuple(out)


def _quant_and_kd_modelled(spec: TrainingSpec) -> list[str]:
    """FP8/FP4 (fp8.py) and ModelOpt distillation (distillation.py): what is modelled."""
    out = []
    q = getattr(spec, "quant", None)
    if q is not None:
        out.append(
            f"{q.label()}: quantized weight copies and transposes, scaling state, quantized "
            "saved GEMM inputs (derived from Transformer Engine's code; TE does not install "
            "without CUDA, so not measured here)"
        )
    kd = getattr(spec, "distillation", None)
    if kd is not None:
        t = kd.teacher.model
        loss = f"top-{kd.logit_topk} logits KL" if kd.logit_topk else "logits KL"
        out.append(
            f"knowledge distillation: frozen teacher ({t.num_layers} layers, hidden "
            f"{t.hidden_size}, from {kd.teacher_source}) weights, its stage inputs and logits, "
            f"the {loss} loss{'' if kd.skip_lm_loss else ' beside the LM loss'} (derived from "
            "ModelOpt's and Megatron-LM's code and measured on CPU by tools/measure_kd_cpu.py; "
            "intermediate-layer losses and the teacher's checkpoint load not run here)"
        )
    out += _rl_modelled(spec)
    return out


def _rl_modelled(spec: TrainingSpec) -> list[str]:
    """Megatron-LM's RL loop (rl.py): what of its inference engine is modelled."""
    rl = spec.rl
    if rl is None:
        return []
    kv = (
        f"its KV-cache buffer ({rl.buffer_size_gib:g} GiB in whole blocks), counted while training"
        if rl.kv_resident
        else "its KV-cache buffer deleted for training (not counted)"
    )
    model = "; a separate inference model's weights at its own sizes" if rl.separate_model else ""
    graphs = (
        "; the layer outputs and first-layer inputs its inference CUDA graphs keep"
        if rl.inference_cuda_graphs is not None
        else ""
    )
    return [
        f"RL loop (--perform-rl-step): the training step as estimated, beside the inference "
        f"engine: {kv}{model}{graphs} (derived from Megatron-LM's dynamic inference context, "
        "CUDA graph and RL loop code, not measured here; the rollout's own peak is not "
        "estimated); the loss's full-vocabulary log-probabilities instead of the "
        "vocab-parallel cross entropy (measured on CPU by tools/measure_rl_logprobs.py)"
    ]


def _imbalance(spec: TrainingSpec) -> str:
    value = spec.model.moe_token_imbalance
    return f"{value:g}" + (" (balanced)" if value == 1.0 else "")


def approximated_features(spec: TrainingSpec) -> tuple[str, ...]:
    """What the estimate models only to first order for this config."""
    m = spec.model
    out = []
    if m.num_experts:
        out.append(
            f"MoE routing: the busiest rank gets moe_token_imbalance={_imbalance(spec)} x the "
            f"balanced tokens x top-k rows (bound {imbalance_bound(spec):g} when every token's "
            "top-k lands on one rank's experts; set moe_token_imbalance to move within it)"
        )
        if m.moe_token_dispatcher == "flex":
            out.append("the flex (DeepEP) dispatcher as alltoall: its buffers are not counted")
    if m.multi_latent_attention:
        out.append("MLA activations (first order)")
    if spec.fine_grained_offloading:
        plain_pipeline = spec.parallel.pp > 1 and not spec.parallel.moe_a2a_overlap
        out.append(
            "fine-grained offload residency: every layer's selected tensors but each chunk's last "
            "layer leave the GPU, one layer reloaded ahead in the backward"
            + (
                "; the next chunk's last layer comes back during the forward before its "
                "backward (priced at that forward's first attention)"
                if plain_pipeline
                else ""
            )
        )
    if spec.torch_fsdp2 or spec.fsdp is not None:
        out.append(
            "FSDP's unsharded buffers at the backward's start (Megatron-FSDP: every parameter "
            "within its 5e8-element prefetch window and the largest unit's gradient bucket; "
            "FSDP2: two units and one unit's gradient), from the source, not measured; bucket "
            "padding not counted"
        )
    if spec.fsdp == "optim_grads_params" and not spec.torch_fsdp2:
        again = megatron_fsdp_loss_regather(spec.model)
        out.append(
            "Megatron-FSDP at the loss: the embedding, output layer and final norm gathered"
            + (", and every decoder layer again (the final norm's forward prefetch, before "
               "megatron-core 0.18)" if again else "")
            + ", as megatron-core's Megatron-FSDP holds them on CPU"
            + ("" if spec.fsdp_overlap_param_gather else "; not counted: the prefetch of "
               "every bucket after the optimizer step, which Megatron-FSDP issues under "
               "optim_grads_params even without overlap_param_gather (the code leaves them "
               "allocated, the published steady allocations of such runs do not show it)")
        )  # fmt: skip
    if spec.precision.optimizer in ("muon", "dist_muon"):
        out.append(
            "Muon step temporaries (three fp32 copies of the largest Muon tensor; the all-gather "
            "after a dist_muon step) from megatron-core's source: Muon needs emerging_optimizers, "
            "not run here"
        )
    if uses_bucket_layout(spec):
        out.append(
            "dist_muon's bucket layout pads the DDP gradient and parameter buffers' shards to "
            "the fullest one: that padding is not counted"
        )
    mtp_at = mtp_chunk(spec.parallel.pp, 1, spec.parallel.layout)
    if m.mtp_num_layers and mtp_at is not None and mtp_at[0] != spec.parallel.pp - 1:
        out.append(
            "MTP on another pipeline stage than the loss: its layers' activations are counted "
            "there, the (1 + depth) hidden states it sends on in the loss stage's input"
        )
    if spec.cpu_offloading:
        out.append(
            "activation offload residency: Transformer Engine's offload context is assumed "
            "to move all TE-module tensors of the offloaded layers and keep one reloaded layer"
        )
    q = getattr(spec, "quant", None)
    if q is not None:
        out.append(
            "FP8/FP4 saved activations: MoE expert and MLA projection inputs and the layers "
            "kept in bf16 (first_last_layers_bf16) are counted at the activation dtype; "
            "block-scale padding is ignored"
        )
    kd = getattr(spec, "distillation", None)
    if kd is not None and kd.intermediate_pairs:
        out.append(
            f"knowledge distillation: {kd.intermediate_pairs} intermediate-layer losses as two "
            "fp32 teacher-hidden-sized tensors saved per pair and microbatch"
        )
    if spec.parallel.cp > 1:
        out.append(
            f"context-parallel attention buffers ({spec.parallel.cp_comm_type}; from Transformer "
            "Engine's code, not measured)"
        )
    return tuple(out)


def config_coverage(
    merged: Mapping[str, Any], spec: TrainingSpec, world_source: str | None = None
) -> ConfigCoverage:
    """Coverage of the config keys ``merged`` (as
    :func:`memscope.inputs.config_files.load_config` gives them) by the estimate of ``spec``;
    ``world_source`` says where the world size came from (``None`` or empty: the config)."""
    read = READ_KEYS | EXTRA_READ_KEYS | memscope_keys()  # MemScope's own: the tracer's
    missing = not_modelled(merged, spec)
    features = [
        f"{group[0].key}={group[0].value}" if len(group) == 1 else ", ".join(n.key for n in group)
        for group in _by_reason(missing)
    ]
    if spec.device != "cpu":
        features.append(CUDA_ALLOWANCE)
    return ConfigCoverage(
        unused_keys=tuple(sorted(k for k in merged if k not in read)),
        not_modelled=missing,
        assumptions=assumptions(spec, world_source),
        modelled=modelled_features(spec),
        approximated=approximated_features(spec),
        not_modelled_features=tuple(features),
    )
