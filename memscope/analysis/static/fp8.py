"""FP8 and FP4 training with Transformer Engine: what the quantized GEMMs add or save.

Megatron runs every linear layer of a transformer layer (``TELayerNormColumnParallelLinear``,
``TERowParallelLinear``, ``TEGroupedLinear`` ...) under TE's autocast when ``--fp8-format`` or
``--fp4-format`` is set; embeddings, the output layer and the router stay in the activation
dtype. The terms, each from Transformer Engine's code (NVIDIA/TransformerEngine,
``transformer_engine/pytorch``) and megatron-core 0.16.1:

* **Quantized weight copies** (``module/linear.py`` ``_Linear.forward`` / ``quantize_weight``
  in ``module/base.py``): with bf16 primary weights each GEMM weight is quantized into a
  workspace that the module keeps in ``_fp8_workspaces`` for the rest of the run whenever
  ``is_first_microbatch`` is not ``None``; megatron's TE wrappers always pass it unless
  ``disable_parameter_transpose_cache`` (megatron/core/extensions/transformer_engine.py
  ``TELinear.forward``). The weight quantizer asks for row-wise and column-wise usage when
  the input needs a gradient, so the workspace holds both: ``Float8Tensor`` keeps a separate
  ``_transpose`` except where the GPU runs non-TN FP8 GEMMs (compute capability 10.x, 11.x
  and >= 13: ``utils.is_non_tn_fp8_gemm_supported``, ``Float8CurrentScalingQuantizer.
  inner_tensor_specs``), MXFP8 / block-scaled FP8 / NVFP4 always keep a column-wise copy.
  A model run under ``no_grad`` (a distillation teacher) caches the row-wise copy only.
* **Quantized primary weights** (``--fp8-param-gather`` / ``--fp4-param-gather``:
  megatron/core/fp8_utils.py ``get_fp8_context(..., is_init=True)`` enters TE's
  ``fp8_model_init``): the parameters are the quantized tensors themselves; the DDP
  parameter buffer is ``uint8`` (megatron/core/distributed/param_and_grad_buffer.py) and
  holds the row-wise data, the column-wise copy is made after each all-gather; no bf16 weight
  and no workspace. The fp32 main parameters and the fp32 gradient buffer are unchanged.
* **Scaling state** (``quantization.py`` recipe states, ``base.py`` ``set_meta_tensor``): per
  GEMM 3 forward and 2 backward quantizers; delayed scaling keeps an fp32 ``scale`` and an fp32
  ``amax_history [amax_history_len, quantizers]`` each; current scaling (tensorwise) and NVFP4
  keep an fp32 scale and amax per quantizer; MXFP8 and block scaling keep none.
* **Saved GEMM inputs**: TE saves the *quantized* input of each GEMM for the weight
  gradient (``_Linear.forward``: ``inputmat.update_usage(rowwise_usage=False,
  columnwise_usage=True)``; ``layernorm_linear.py``: the quantized norm output) instead of
  the activation-dtype tensor: one usage (column-wise, or row-wise for the sequence-parallel
  re-gather of ``Float8Tensor``s). The norm outputs (inputs of ``linear_qkv`` and
  ``linear_fc1``) and the input of ``linear_fc2`` are kept only by those GEMMs, so they shrink;
  the input of ``linear_proj`` is also the attention kernel's saved output, so the quantized
  copy comes on top.

Block scales per element (``constants.py``, each class's ``get_scale_shape``): MXFP8 one E8M0
byte per 32 elements; block-scaled FP8 an fp32 per 1x128 block for inputs and per 128x128
block for weights (megatron's ``Float8BlockScaling``); NVFP4 two 4-bit values per byte and an
E4M3 byte per 16 elements. Padding of the scale tensors to multiples of 4/128 is ignored.

Not checked on a GPU here: Transformer Engine does not install without CUDA, so these terms
are derived from its code, not measured (the coverage footer says so).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memscope.analysis.static.config import QuantSpec

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec
    from memscope.analysis.static.params import ParamTensor

FP32 = 4
# Bytes per element of one usage (row-wise or column-wise data plus its scales).
_INPUT_BYTES = {
    "delayed": 1.0,
    "tensorwise": 1.0,
    "mxfp8": 1.0 + 1 / 32,  # MXFP8_BLOCK_SCALING_SIZE: one E8M0 scale per 32
    "blockwise": 1.0 + FP32 / 128,  # 1x128 blocks, fp32 scales
    "nvfp4": 0.5 + 1 / 16,  # NVFP4_BLOCK_SCALING_SIZE: one E4M3 scale per 16
}
_WEIGHT_BYTES = {**_INPUT_BYTES, "blockwise": 1.0 + FP32 / (128 * 128)}  # 128x128 blocks
# Megatron-LM argument names read here (a YAML may spell the flags: fp8_format -> fp8).
QUANT_KEYS = frozenset(
    {
        "fp8", "fp8_format", "fp8_recipe", "fp8_param_gather", "fp8_param", "fp8_amax_history_len",
        "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
        "fp4", "fp4_format", "fp4_recipe", "fp4_param", "fp4_param_gather",
        "disable_parameter_transpose_cache",
    }
)  # fmt: skip
# Quantizers per GEMM: input, weight, output (forward) and grad_output, grad_input (backward).
QUANTIZERS_PER_GEMM = 5


def non_tn_gemm(compute_major: int) -> bool:
    """TE's ``is_non_tn_fp8_gemm_supported``: (10, 0) <= capability < (12, 0) or >= (13, 0)."""
    return 10 <= compute_major < 12 or compute_major >= 13


def weight_usage_bytes(q: QuantSpec, compute_major: int) -> float:
    """Bytes per weight element of its quantized form with both usages (forward row-wise,
    backward column-wise); one buffer serves both for ``Float8Tensor`` on non-TN GPUs."""
    one = _WEIGHT_BYTES[q.recipe]
    single = q.recipe in ("delayed", "tensorwise") and non_tn_gemm(compute_major)
    return one if single else 2 * one


def input_usage_bytes(q: QuantSpec) -> float:
    """Bytes per element of a GEMM input saved for backward (one usage)."""
    return _INPUT_BYTES[q.recipe]


_GEMM_SUFFIXES = (
    "linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight",
    "linear_q_proj.weight", "linear_q_down_proj.weight", "linear_q_up_proj.weight",
    "linear_kv_down_proj.weight", "linear_kv_up_proj.weight", "experts.weight1",
    "experts.weight2",
)  # fmt: skip


def _layer_index(name: str) -> int | None:
    marker = "decoder.layers."
    at = name.find(marker)
    if at < 0:
        return None
    return int(name[at + len(marker) :].split(".", 1)[0])


def quantized_gemm_weights(spec: TrainingSpec, params: Iterable[ParamTensor]) -> list[ParamTensor]:
    """The rank's transformer-layer GEMM weights that run quantized: every linear weight of a
    decoder (or MTP) layer except the first ``bf16_layers_start`` and last ``bf16_layers_end``
    decoder layers (megatron/core/fp8_utils.py ``is_first_last_bf16_layer``). The router,
    norms, embeddings and output layer are not TE GEMMs under autocast."""
    q = spec.quant
    assert q is not None
    n = spec.model.num_layers
    out = []
    for t in params:
        if not t.name.endswith(_GEMM_SUFFIXES):
            continue
        i = _layer_index(t.name)
        if i is not None and (i < q.bf16_layers_start or i >= n - q.bf16_layers_end):
            continue
        out.append(t)
    return out


def _gemm_count(spec: TrainingSpec, weights: list[ParamTensor]) -> int:
    """GEMMs with their own quantizers: one per weight tensor, one per local expert for a
    grouped expert tensor (``TEGroupedLinear``: ``num_gemms`` = local experts)."""
    local = (spec.model.num_experts or 0) // spec.parallel.ep
    grouped = sum(1 for t in weights if t.name.endswith(("experts.weight1", "experts.weight2")))
    return len(weights) - grouped + grouped * local


@dataclass(frozen=True)
class QuantWeights:
    """Persistent bytes the quantized GEMMs change on one rank (added to the weights)."""

    primary_weights_delta: int  # quantized parameters replacing the activation-dtype ones
    weight_copies: int  # cached quantized weight workspaces (row- and column-wise)
    scaling_state: int  # scales and amax histories

    @property
    def total_bytes(self) -> int:
        return self.primary_weights_delta + self.weight_copies + self.scaling_state

    def detail(self) -> dict[str, int]:
        return {
            "quantized_primary_weights_delta": self.primary_weights_delta,
            "quantized_weight_copies": self.weight_copies,
            "scaling_state": self.scaling_state,
        }


def quantized_weight_terms(
    spec: TrainingSpec, params: Iterable[ParamTensor], compute_major: int, grad: bool = True
) -> QuantWeights:
    """The persistent FP8/FP4 terms of the rank holding ``params`` (see the module doc).

    ``grad=False``: a model run under ``no_grad`` (a distillation teacher): ``_Linear.forward``
    asks the weight quantizer for column-wise usage only when the input needs a gradient, so
    its cached copy is row-wise only. Quantized primary weights keep both usages (as built)."""
    q = spec.quant
    assert q is not None
    weights = quantized_gemm_weights(spec, params)
    numel = sum(t.numel for t in weights)
    both = weight_usage_bytes(q, compute_major)
    cached = both if grad else _WEIGHT_BYTES[q.recipe]
    delta, copies = 0, 0
    if q.primary_weights:
        delta = round(numel * both) - numel * spec.precision.param_bytes
    elif q.weight_cache:
        copies = round(numel * cached)
    quantizers = QUANTIZERS_PER_GEMM * _gemm_count(spec, weights)
    if q.recipe == "delayed":
        state = quantizers * (q.amax_history_len + 1) * FP32
    elif q.recipe in ("tensorwise", "nvfp4"):
        state = quantizers * 2 * FP32
    else:
        state = 0
    return QuantWeights(delta, copies, state)


def quantized_saved(spec: TrainingSpec, items: dict[str, int], ffn: int, e: int) -> None:
    """Adjust one layer's saved tensors (``activations.layer_saved`` items, in place) for
    quantized GEMM inputs: the two norm outputs and a dense MLP's ``linear_fc2`` input are
    kept quantized instead of in the activation dtype; ``linear_proj`` keeps a quantized copy
    of the attention output beside the one the attention kernel saves. ``ffn`` is one
    ``[s, b, f/t]`` tensor in bytes of dtype ``e``. MoE expert and MLA projection inputs are
    left at the activation dtype, and so are the layers ``--first-last-layers-bf16`` keeps in
    bf16 (approximated)."""
    q = spec.quant
    if q is None:
        return
    per = input_usage_bytes(q)
    if "norm_outputs" in items:
        items["norm_outputs"] = round(items["norm_outputs"] / e * per)
    context = items.get("attention_context", 0)
    if context:
        items["quantized_proj_input"] = round(context / e * per)
    if spec.model.num_experts is None and "mlp" in items:
        items["mlp"] += round(ffn / e * per) - ffn  # fc2's input, quantized
