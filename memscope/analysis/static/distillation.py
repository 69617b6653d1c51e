"""ModelOpt knowledge distillation in Megatron-LM: the teacher and the KD loss.

``--export-kd-teacher-load`` turns it on (Megatron-LM ``megatron/post_training/
model_provider.py``): the teacher is a second ``GPTModel`` built with the student's
``model_kwargs`` (same TP/PP/EP split, same pre/post-process), its architecture from the
teacher checkpoint's ``model_config.yaml`` (``_load_teacher_model_config``: NeMo field
names; every field it does not give is the student's), converted to the student's dtype with
it. ModelOpt (``modelopt/torch/distill/distillation_model.py``, ``plugins/megatron.py``)
freezes it (``requires_grad_(False)``: no gradient buffer, no optimizer state) and runs it
under ``torch.no_grad()`` before the student on every microbatch, so it saves nothing for
backward. What it adds on one rank:

* **Teacher weights** in the parameter dtype, sharded like the student's.
* **Teacher stage input** (pipeline stages after the first): the stage receives
  ``cat([student_hidden, teacher_hidden], -1)`` (``adjust_distillation_model_for_mcore``
  ``_forward``, ``get_tensor_shapes_adjust_fn_for_distillation``); the student's input is a
  slice of that buffer, so the teacher's ``[s, b, h_t]`` part lives as long as the student
  keeps its input, once per in-flight microbatch.
* **The KD loss** on the last stage (``LogitsKLLoss.forward``): both logits ``[s, b, V/t]``
  (the student's and the teacher's, kept by the output-capture hooks) are cast to fp32 and
  scaled; with TP > 1 the maxima are subtracted in place and ``exp`` (saved for backward)
  gives the softmax denominators, then the two log-probabilities; with TP = 1 the student's
  ``log_softmax`` output is saved. ``kl_div(..., log_target=True)`` is
  ``exp(q) * (q - p)`` (torch's ``kl_div``), which saves ``exp(q)``. So two fp32 logits-sized
  tensors are saved per microbatch, and at the product the two 16-bit logits and six (TP > 1)
  or five (TP = 1) fp32 logits-sized tensors are alive besides them. With ``skip_lm_loss``
  (the default) the student's cross entropy is replaced by zeros: no cross-entropy tensors.
  ``logit_kl_topk`` keeps only the top-k slices (``TopKLogitsKLLoss``).
* **Intermediate-layer losses** (``intermediate_layer_pairs``; cosine or MSE over
  ``[s, b, h_t]`` after the student->teacher ``ProjectionLayer``): approximated as two fp32
  hidden-sized tensors saved per pair and microbatch.

The teacher's config: ``kd_teacher_<field>`` keys of the MemScope config (Megatron argument
names: ``kd_teacher_num_layers``, ``kd_teacher_hidden_size`` ...) win; else the checkpoint's
``model_config.yaml`` when it can be read. The KD settings come from the ``export_kd_cfg``
YAML (ModelOpt's ``DistillationConfig``: ``skip_lm_loss``, ``logit_kl_topk``,
``intermediate_layer_pairs``) or ModelOpt's defaults when it is not given.
They are read by :mod:`memscope.inputs.distillation_args`; this module costs the result.

Checked on CPU by ``tools/measure_kd_cpu.py`` (ModelOpt is not a MemScope dependency, so the
test suite does not run it): a tiny real megatron-core student and teacher joined by
``mtd.convert`` and ``adjust_distillation_model_for_mcore`` as Megatron-LM does, trained with
megatron's schedule under the exact ``storage`` backend, and ModelOpt's ``LogitsKLLoss``
alone (TP 1 and the vocab-parallel path), without and with two pipeline stages. Not counted:
the teacher's part of the p2p gradients in the backward working set (under 1% of the tiny
two-stage run's peaks). Not run here: loading a teacher checkpoint (Megatron-LM's
``megatron/post_training``) and intermediate-layer losses, derived from the code only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from memscope.analysis.static.config import DistillationSpec
from memscope.analysis.static.spec_checks import validate_spec

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec
    from memscope.analysis.static.params import RankPosition


class Dims(Protocol):
    """The sizes of one microbatch this module reads, as :class:`.activations.Dims` gives
    them (the activation model passes its own in; it imports this module, not back)."""

    @property
    def s(self) -> int: ...  # sequence length
    @property
    def b(self) -> int: ...  # micro-batch size
    @property
    def h(self) -> int: ...  # hidden size
    @property
    def e(self) -> int: ...  # bytes per activation element
    @property
    def hidden(self) -> int: ...  # one [s/sp, b, h] activation in bytes
    @property
    def logits(self) -> int: ...  # one [s, b, V/t] logits tensor in bytes


FP32 = 4
INT64 = 8
TEACHER_PREFIX = "kd_teacher_"
# Megatron's _load_teacher_model_config: fields a teacher config must give.
REQUIRED_TEACHER_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads")
# Teacher fields the MemScope config may give as kd_teacher_<field>.
TEACHER_FIELDS = (
    *REQUIRED_TEACHER_FIELDS, "num_query_groups", "group_query_attention", "kv_channels",
    "swiglu", "normalization",
    "disable_bias_linear", "add_qkv_bias", "qk_layernorm", "untie_embeddings_and_output_weights",
    "position_embedding_type", "num_experts", "moe_ffn_hidden_size", "moe_router_topk",
    "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_grouped_gemm",
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
    "qk_pos_emb_head_dim", "v_head_dim", "bf16", "fp16",
)  # fmt: skip
KD_SETTINGS = ("kd_skip_lm_loss", "kd_logit_kl_topk", "kd_intermediate_layer_pairs")
KD_KEYS = frozenset(
    {"export_kd_teacher_load", "export_kd_cfg", "export_kd_teacher_ckpt_format"}
    | {TEACHER_PREFIX + f for f in TEACHER_FIELDS}
    | set(KD_SETTINGS)
)


def teacher_terms(spec: TrainingSpec, position: RankPosition, compute_major: int) -> dict[str, int]:
    """The frozen teacher's persistent bytes on this rank: its weights in the parameter dtype
    (no gradients, no optimizer state: ``teacher_model.requires_grad_(False)``) and, under
    FP8/FP4, its quantized weight copies (row-wise only: it runs under ``no_grad``) and
    scaling state (:func:`.fp8.quantized_weight_terms`)."""
    kd = spec.distillation
    if kd is None:
        return {}
    from memscope.analysis.static.fp8 import quantized_weight_terms
    from memscope.analysis.static.params import rank_params

    # the teacher is split like the student (the same model_kwargs), also when a caller such
    # as the planner changed the student's parallel sizes after reading the config
    teacher = replace(kd.teacher, parallel=spec.parallel)
    try:
        validate_spec(teacher)
    except ValueError as exc:
        raise ValueError(f"kd teacher ({kd.teacher_source}): {exc}") from None
    params = rank_params(teacher, position)
    out = {"teacher_weights": sum(t.numel for t in params) * teacher.precision.param_bytes}
    if teacher.quant is not None:
        quant = quantized_weight_terms(teacher, params, compute_major, grad=False)
        out["teacher_quantized_weights"] = quant.total_bytes
    return out


def _teacher_hidden(kd: DistillationSpec, x: Dims) -> int:
    """One ``[s/sp, b, h_t]`` teacher activation in bytes."""
    return x.hidden * kd.teacher.model.hidden_size // (x.h or 1)


def distillation_extras(
    spec: TrainingSpec, x: Dims, first: bool, last: bool, extras: dict[str, int]
) -> None:
    """One microbatch's distillation tensors of a chunk, into ``extras`` (in place): the
    teacher's part of the received stage input, and on the last stage the KD loss's saved
    tensors (the student's cross entropy removed under ``skip_lm_loss``)."""
    kd = spec.distillation
    if kd is None:
        return
    if not first:
        extras["teacher_stage_input"] = _teacher_hidden(kd, x)
    if not last:
        return
    if kd.skip_lm_loss:
        extras["cross_entropy_softmax"] = 0
        extras["cross_entropy_small"] = 0
    saved = 2 * logits_fp32(kd, x)
    saved += kd.intermediate_pairs * 2 * _teacher_hidden(kd, x) // x.e * FP32
    extras["kd_loss_saved"] = saved


def logits_fp32(kd: DistillationSpec, x: Dims) -> int:
    """One fp32 tensor over the logits the KD loss works on: ``[s, b, V/t]``, or with
    ``logit_kl_topk`` the ``[s, b, k]`` top-k slice."""
    if kd.logit_topk is not None:
        return x.s * x.b * kd.logit_topk * FP32
    return x.logits // x.e * FP32


def distillation_moments(spec: TrainingSpec, x: Dims, moments: dict[str, int]) -> None:
    """The KD loss's forward moment, into the last chunk's loss ``moments`` (in place): working
    bytes above the saved tensors while ``kl_div`` multiplies (see the module doc). Under
    ``skip_lm_loss`` the cross entropy's own moment is gone."""
    kd = spec.distillation
    if kd is None:
        return
    if kd.skip_lm_loss:
        moments["cross_entropy"] = 0
    temporaries = 6 if spec.parallel.tp > 1 else 5
    both_logits = 2 * x.logits  # the student's and the teacher's, in the activation dtype
    if kd.logit_topk is not None:  # the top-k values and indices instead of fp32 copies
        k = x.s * x.b * kd.logit_topk
        both_logits += k * (2 * x.e + INT64)
    moments["kd_loss"] = both_logits + temporaries * logits_fp32(kd, x)
