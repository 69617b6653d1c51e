"""Which megatron-core release the static estimate follows (``ModelSpec.megatron_core_version``).

The terms are read from megatron-core 0.15 (FlagScale 0.8.0's bundled Megatron-LM) and 0.16.
Where a later release allocates or builds differently, the term asks :func:`at_least` for the
release that changed it. Each change, with where it is in megatron-core's source:

- **0.5: SwiGLU can be fused** (:data:`SWIGLU_FUSION`). Megatron-LM commit 6b3b8844e5
  (2024-01-09, first in core_r0.5.0) added ``--no-bias-swiglu-fusion`` and passed
  ``bias_activation_fusion=args.bias_swiglu_fusion`` to the ``TransformerConfig``; before it
  ``core_transformer_config_from_args`` set ``bias_gelu_fusion = False`` under ``--swiglu``,
  and the legacy model's ``megatron/model/transformer.py`` ``ParallelMLP`` ran the plain
  ``F.silu(x[0]) * x[1]``: SwiGLU was never fused, whatever ``bias_gelu_fusion`` said.
- **0.8: the cross entropy shifts the logits in place** (:data:`INPLACE_LOGITS_SHIFT`).
  Up to 0.7 the caller upcast the logits (``logits.float()`` in ``models/common/
  language_module/language_module.py`` ``compute_language_model_loss``, ``output.float()`` in
  Megatron-LM's legacy ``gpt_model.py`` ``post_language_model_processing``) and
  ``tensor_parallel/cross_entropy.py`` ``_VocabParallelCrossEntropy.forward`` subtracted the
  maximum out of place (``vocab_parallel_logits - logits_max.unsqueeze(-1)``): while the loss
  is computed the 16-bit logits, their fp32 copy and the shifted fp32 copy (kept as the
  softmax) are all alive. Megatron-LM commit 9634c0e4a3 (2024-06-13, "Reduce logit memory
  pressure by using in-place operation", first in core_r0.8.0) subtracts in place, and 0.8
  moved the upcast into ``calculate_logits_max``: one fp32 copy fewer.

- **0.13: the routing probabilities are applied inside the experts**
  (:data:`PROBS_IN_EXPERTS`). The same commit 2659630721 hands the permuted probabilities to
  the experts, which weight their activation (``fused_bias_swiglu.py``
  ``weighted_bias_swiglu_impl``, ``mlp.py``'s ``permuted_probs``). Before, the experts ran
  unweighted and the dispatcher weighted their ``[n, h]`` output on the way back (0.12
  ``token_dispatcher.py`` allgather ``token_unpermutation``: ``hidden_states *
  permuted_probs``; ``moe_utils.py`` ``unpermute(probs=...)``: ``permuted_tokens *
  permuted_probs``), which keeps that output for backward instead of a weighted ``f``-wide
  copy inside the experts (``moe.py`` ``_expert_rows``).
- **0.13: MoE experts without biases** (:data:`MOE_BIAS_REFUSED`). Megatron-LM 2659630721
  (2025-04-09, "Memory efficient token permutation", first in core_v0.13.0rc0) added
  ``assert not self.add_bias_linear, "Bias is not supported for MoE"`` to
  ``TransformerConfig.__post_init__``; a329dd6da5 (2025-09-22, "Enable bias in expert mlp",
  first in core_v0.15.0rc6: FlagScale 0.8.0's 0.15.0rc5 still refuses) relaxed it to expert
  tensor parallelism 1 (:data:`MOE_BIAS_ETP1`). Before
  0.13 the experts carried biases at any expert TP: ``SequentialMLP.forward`` (0.12
  ``moe/experts.py``) expands each local expert's fc2 bias over its tokens and concatenates
  them, and the allgather dispatcher's ``token_unpermutation`` weights that ``[n, h]`` tensor
  by the routing probabilities (``bias * permuted_probs``), which keeps it for backward
  (:func:`moe_expert_bias_saved`); the alltoall dispatcher refused a bias there.
- **0.14.0rc4: Megatron's linear layers take Transformer Engine's cached placeholder
  gradient** (:data:`MEGATRON_DUMMY_WGRAD`). Megatron-LM e7c55de99e (2025-08-01, "Changes to
  enable full iteration CUDA graph", first in core_v0.14.0rc4) makes
  ``tensor_parallel/layers.py`` ``LinearWithGradAccumulationAndAsyncCommunication.backward``
  return ``get_dummy_wgrad(...)`` (Transformer Engine's ``_dummy_wgrads`` cache) under
  ``gradient_accumulation_fusion`` whenever Transformer Engine imports; before, a fresh
  ``torch.empty`` that the DDP hook freed. See ``dummy_wgrads.py``. (Main-line commits
  that already said ``rc4`` before it landed read as having it.)
- **0.15.0rc2: a pipeline layout places the MTP layers** (:data:`MTP_IN_LAYOUT`). Megatron-LM
  d7bf5aaaa8 (2025-08-26, "Support EP A2A overlap for interleaved PP and MTP", first in
  core_v0.15.0rc2) lets ``pipeline_model_parallel_layout`` hold ``m`` and counts the MTP layers
  there; before, ``PipelineParallelLayerLayout.validate_layer_layout`` raised
  ``NotImplementedError`` for an ``m`` and ``multi_token_prediction.py``
  ``get_mtp_num_layers_to_build`` built every MTP layer on the last pipeline stage (its last
  virtual chunk) whatever the layout said. The args reader places them there
  (``pipeline_layout.with_mtp_on_last_chunk``).
- **0.15: the unfused GLU copies its linear half** (:data:`GLU_LINEAR_COPY`).
  ``transformer/mlp.py`` ``MLP.forward``'s ``glu`` (and ``moe/experts.py``'s) returns
  ``activation(x_glu) * (x_linear + glu_linear_offset)``: the sum is a new ``f``-wide tensor
  that the product keeps for backward. Megatron-LM commit 2e29a5e1e3 (2025-09-09, "Add quick
  geglu activation for gpt-oss", first in core_v0.15.0) added the offset; before it ``glu``
  was ``activation(x[0]) * x[1]``, whose product keeps a view of the fc1 output instead: one
  ``[s, b, f/t]`` fewer per unfused gated MLP.
- **0.17: argsort permute** (:data:`ARGSORT_PERMUTE`). ``transformer/moe/moe_utils.py``
  ``permute`` (dropless, unfused) picks the routed rows with an ``argsort`` of the flattened
  ``[E, T]`` routing mask instead of ``masked_select``, and gathers the probabilities by
  indexing with a slice of that int64 result: their backward keeps the whole ``[E, T]`` int64
  sort instead of the transposed probabilities and mask that ``masked_select`` kept.
- **0.17: no legacy GroupedMLP** (:data:`NO_LEGACY_GROUPED_MLP`). ``transformer/moe/
  experts.py`` has no ``GroupedMLP``; ``models/backends.py``
  ``LocalSpecProvider.grouped_mlp_modules`` builds ``SequentialMLP`` for ``moe_grouped_gemm``
  and ``models/gpt/moe_module_specs.py`` no longer passes ``moe_use_legacy_grouped_gemm`` on
  (Transformer Engine's spec builds ``TEGroupedMLP``).
- **0.17: MTP's inner layer renamed** (:data:`MTP_MODEL_LAYER`). ``transformer/
  multi_token_prediction.py`` ``MultiTokenPredictionLayer`` holds its transformer layer as
  ``mtp_model_layer`` (it may be a Mamba stack), before as ``transformer_layer``: the
  parameters' names change, not their sizes.
- **0.18: MTP's embedding copy tagged** (:data:`MTP_EMBEDDING_TAGGED`). ``models/common/
  language_module/language_module.py`` ``LanguageModule.setup_embeddings_and_output_layer``
  tags the word embedding of the MTP stage (``mtp_process``) ``is_embedding_or_output_parameter``
  like the first stage's (before: only ``pre_process``'s): Muon's split (``optimizer/muon.py``)
  gives the copy to Adam instead of Muon.
- **0.18: Megatron-FSDP's final norm no longer re-gathers the decoder layers**
  (:data:`FSDP_NO_LOSS_REGATHER`). Every module outside an FSDP unit all-gathers its own
  parameters in a forward pre-hook with forward prefetch (``distributed/fsdp/src/
  megatron_fsdp/megatron_fsdp.py`` ``_pre_forward_param_unshard``). The final norm's (and an
  untied output layer's) parameters sit in the first bucket, with the embedding, ahead of the
  layers' (``param_and_grad_buffer.py`` ``_get_parameter_groups`` groups the non-unit
  parameters by attributes, in ``named_parameters`` order), so its prefetch all-gathers again
  every layer bucket within ``suggested_AG_prefetch_size`` that the layers' ``_post_forward``
  had released: at the loss they are all unsharded until their own backward. Megatron-LM
  41f3b6f308 (2026-04-02, "Fix M-FSDP MXFP8 related BUGs", first in core_v0.18.0) makes
  ``_root_pre_backward`` mark every submodule ``PRE_BACKWARD`` (before: the units only), and
  nothing sets a non-unit module back, so from the second step its forward pre-hook no
  longer prefetches. Seen on CPU with megatron-core 0.16.1 and 0.19.2
  (``tests/test_static_fsdp.py``) and in the published golden values: the ZeRO-3 GPT case
  peaked higher at febd25e3fb (0.16.0rc0) than from 4e85d74ae9 (0.18.0) on, by about its
  layers' bf16 weights.
- **0.18: layer-wise Muon shards by bucket layout** (:data:`LAYER_WISE_PARAM_LAYOUT`).
  ``optimizer/layer_wise_optimizer.py`` ``LayerWiseDistributedOptimizer.shard_params`` takes
  the DDP chunks' ``full_param_layout`` (``compute_full_param_layout``: per bucket, whole Muon
  tensors bin-packed onto the data-parallel shards; the other tensors byte-sharded by a
  ``DistributedOptimizer``), which Megatron-LM builds unless ``--no-use-layer-wise-param-layout``;
  the size-sorted ping-pong split is its fallback. Modelled in ``muon.py``
  (``bucket_layout_owned``); the buffers' shard padding is not counted (said so).
- **0.19: MLA's query norm needs a query latent or a fused norm** (:data:`MLA_QK_NORM_RESOLVER`).
  ``transformer/mla_qk_norm_config.py`` ``QKNormConfigResolver`` (called from
  ``MLASelfAttention.__init__``): with ``qk_layernorm`` and no ``q_lora_rank`` the query
  projection becomes the backend's fused norm+linear, which the local spec does not have
  (``LocalSpecProvider.column_parallel_layer_norm_linear`` is ``None``), so megatron-core
  refuses to build it; up to 0.18 the query was simply not normalised. With Transformer
  Engine (:func:`mla_fused_q_norm`) the estimate counts that norm's weights
  (``params.py``) and its saved output and statistics (``mla.py``).
- **0.19: distributed Muon is spelled ``muon`` + ``--use-distributed-optimizer``**
  (:data:`MUON_DISTRIBUTED_IS_LAYER_WISE`). Megatron-LM ``megatron/training/arguments.py``
  ``validate_args`` ("emerging optimizer check", core_r0.19.0) turns ``--optimizer muon`` with
  ``--use-distributed-optimizer`` into the layer-wise distributed optimizer (and
  ``dist_muon`` into ``muon`` with it, deprecated); megatron-core 0.16's Muon refuses the
  distributed optimizer. 0.17 and 0.18 are not checked: read as 0.16.
- **0.19: Megatron-FSDP's gradient dtype** (:data:`MEGATRON_FSDP_GRADS_DTYPE`).
  ``distributed/fsdp/mcore_fsdp_adapter.py`` takes the main-gradient dtype from
  ``megatron_fsdp_main_grads_dtype`` alone (Megatron-LM's ``--megatron-fsdp-main-grads-dtype``,
  default ``auto``: the parameters' dtype); up to 0.18 ``grad_reduce_in_fp32`` made it fp32.

- **0.16: Transformer Engine's CUDA graphs are captured after the warm-up iterations**
  (:data:`TE_GRAPHS_AFTER_WARMUP`). Megatron-LM 2b343d739f ("Refactor cuda_graph_scope",
  first in core_v0.16.0) captures them in the training loop once ``cuda_graph_warmup_steps``
  eager iterations have run; before, ``--external-cuda-graph`` captured them before the loop
  (0.15 ``megatron/training/training.py``: ``cuda_graph_helper.create_cudagraphs()`` right
  after building the helper). See ``cuda_graphs.py``.

An unknown version (no megatron-core installed where the spec was read) follows 0.16.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (config imports the checks that import this module)
    from memscope.analysis.static.config import ModelSpec, TrainingSpec

Release = tuple[int, ...]  # (major, minor) or (major, minor, release candidate)

SWIGLU_FUSION: Release = (0, 5)
INPLACE_LOGITS_SHIFT: Release = (0, 8)
GLU_LINEAR_COPY: Release = (0, 15)
MTP_IN_LAYOUT: Release = (0, 15, 2)
MOE_BIAS_REFUSED: Release = (0, 13)
MEGATRON_DUMMY_WGRAD: Release = (0, 14, 4)
PROBS_IN_EXPERTS: Release = (0, 13)
MOE_BIAS_ETP1: Release = (0, 15, 6)
ARGSORT_PERMUTE: Release = (0, 17)
NO_LEGACY_GROUPED_MLP: Release = (0, 17)
MTP_MODEL_LAYER: Release = (0, 17)
MTP_EMBEDDING_TAGGED: Release = (0, 18)
LAYER_WISE_PARAM_LAYOUT: Release = (0, 18)
FSDP_NO_LOSS_REGATHER: Release = (0, 18)
MEGATRON_FSDP_GRADS_DTYPE: Release = (0, 19)
MLA_QK_NORM_RESOLVER: Release = (0, 19)
MUON_DISTRIBUTED_IS_LAYER_WISE: Release = (0, 19)
TE_GRAPHS_AFTER_WARMUP: Release = (0, 16)
#: Every release above: where the estimate's terms or checks change.
TERM_RELEASES: tuple[Release, ...] = (
    SWIGLU_FUSION, INPLACE_LOGITS_SHIFT, GLU_LINEAR_COPY, MTP_IN_LAYOUT, MOE_BIAS_REFUSED,
    MEGATRON_DUMMY_WGRAD, PROBS_IN_EXPERTS, MOE_BIAS_ETP1, ARGSORT_PERMUTE,
    NO_LEGACY_GROUPED_MLP, MTP_MODEL_LAYER, MTP_EMBEDDING_TAGGED, LAYER_WISE_PARAM_LAYOUT,
    FSDP_NO_LOSS_REGATHER,
    MEGATRON_FSDP_GRADS_DTYPE, MLA_QK_NORM_RESOLVER, MUON_DISTRIBUTED_IS_LAYER_WISE,
    TE_GRAPHS_AFTER_WARMUP,
)  # fmt: skip

_RELEASE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.\d+)?(?:rc(\d+))?")
#: The third field of a version without ``rcN``: later than every candidate of its release.
FINAL = 99


def release(version: str | None) -> Release | None:
    """``(major, minor, candidate)`` of a version string: ``0.15.0rc5`` -> ``(0, 15, 5)``,
    ``0.19.2+9fbc6af`` -> ``(0, 19, FINAL)``. A two-field constant such as ``(0, 15)`` is
    reached by every candidate of 0.15; a three-field one (:data:`MOE_BIAS_ETP1`) only by its
    candidate and later. A main-line commit between releases carries the next release's
    number and the candidate its ``package_info.py`` names (``0.15.0rc0``, often for months:
    read as that candidate); without a candidate it reads as the release."""
    match = _RELEASE.match(version or "")
    if not match:
        return None
    return (int(match[1]), int(match[2]), int(match[3]) if match[3] else FINAL)


def at_least(model: ModelSpec, first: Release) -> bool:
    """Whether the spec's megatron-core is ``first`` or later (unknown: no)."""
    return release_at_least(model.megatron_core_version, first)


def release_at_least(version: str | None, first: Release) -> bool:
    """Whether the version string names release ``first`` or later (unknown: no)."""
    have = release(version)
    return have is not None and have >= first


def older_than(model: ModelSpec, first: Release) -> bool:
    """Whether the spec's megatron-core is known to predate ``first`` (unknown: no)."""
    have = release(model.megatron_core_version)
    return have is not None and have < first


def probs_in_experts(model: ModelSpec) -> bool:
    """Whether the experts weight their activation by the routing probabilities (from
    :data:`PROBS_IN_EXPERTS`; before, the dispatcher weights their output)."""
    return not older_than(model, PROBS_IN_EXPERTS)


class MoeBias(Enum):
    """What a release allows of MoE experts with biases (``add_bias_linear``)."""

    ANY_ETP = "any expert TP"  # before MOE_BIAS_REFUSED
    REFUSED = "refused"  # 0.13 to 0.15.0rc5
    ETP1 = "expert TP 1"  # from MOE_BIAS_ETP1


def moe_bias_rule(model: ModelSpec) -> MoeBias:
    """:class:`MoeBias` of the spec's release (:data:`MOE_BIAS_REFUSED`,
    :data:`MOE_BIAS_ETP1`)."""
    if older_than(model, MOE_BIAS_REFUSED):
        return MoeBias.ANY_ETP
    if older_than(model, MOE_BIAS_ETP1):
        return MoeBias.REFUSED
    return MoeBias.ETP1


def moe_expert_bias_saved(model: ModelSpec, local_experts: int) -> bool:
    """Whether the experts' probability-weighted fc2 bias, ``[n, h]``, is kept for backward
    (before :data:`MOE_BIAS_REFUSED`, several local experts, :func:`moe_bias_rule`)."""
    return bool(
        model.add_bias_linear
        and moe_bias_rule(model) is MoeBias.ANY_ETP
        and model.moe_token_dispatcher == "allgather"
        and local_experts > 1
    )


def mtp_in_layout(model: ModelSpec) -> bool:
    """Whether a pipeline layout places the MTP layers (``m``); before
    :data:`MTP_IN_LAYOUT` they sit on the last stage's last chunk, outside the layout."""
    return not older_than(model, MTP_IN_LAYOUT)


def logits_shift_copy(model: ModelSpec) -> bool:
    """Whether the unfused cross entropy makes a second fp32 copy of the logits
    (:data:`INPLACE_LOGITS_SHIFT`)."""
    return older_than(model, INPLACE_LOGITS_SHIFT)


def glu_fused(model: ModelSpec) -> bool:
    """Whether a gated MLP runs the fused bias-activation (``bias_swiglu_impl``): asked with
    ``bias_activation_fusion``, from 0.5 (:data:`SWIGLU_FUSION`)."""
    return model.bias_activation_fusion and not older_than(model, SWIGLU_FUSION)


def glu_linear_copies(model: ModelSpec) -> int:
    """``f``-wide copies of the linear half an unfused gated MLP's product keeps: one from
    0.15 (:data:`GLU_LINEAR_COPY`), none before."""
    return 0 if older_than(model, GLU_LINEAR_COPY) else 1


def dense_mlp_tensors(model: ModelSpec) -> int:
    """FFN-wide ``[s, b, f/t]`` tensors one dense MLP keeps (megatron/core/transformer/mlp.py;
    a layer's MLP and MoE shared experts alike).

    GeLU: fc1's output and the activation (with ``bias_activation_fusion``,
    ``bias_gelu_impl`` keeps the same two). SwiGLU unfused: the ``2f``-wide fc1 output, the
    silu output, the linear branch's copy (from 0.15, :func:`glu_linear_copies`) and the
    product (5, measured on CPU; 4 before 0.15); fused (``bias_swiglu_impl``,
    megatron/core/fusions/fused_bias_swiglu.py, from 0.5): its ``2f``-wide input and the
    product fc2 keeps (3)."""
    if not model.gated_linear_unit:
        return 2
    return 3 if glu_fused(model) else 4 + glu_linear_copies(model)


# Megatron-LM's arguments whose presence in a printed arguments block dates it: each with the
# release of the first megatron-core that its training code came with (``_print_args`` in
# megatron/training/arguments.py prints every argument, default or not).
# ``bias_swiglu_fusion``: added by commit 6b3b8844e5 (2024-01-09); first in core_r0.5.0.
# ``cross_entropy_loss_fusion``: added by commit 7b4a6d76c9 (2024-06-14, "Added cross entropy
# fusion"), the day after the in-place shift (9634c0e4a3, its ancestor); first in core_r0.8.0.
# ``glu_linear_offset``: added by commit 2e29a5e1e3 (2025-09-09) with the copy it names
# (:data:`GLU_LINEAR_COPY`); first in core_v0.15.0.
DATING_ARGUMENTS: tuple[tuple[str, Release], ...] = (
    ("bias_swiglu_fusion", SWIGLU_FUSION),
    ("cross_entropy_loss_fusion", INPLACE_LOGITS_SHIFT),
    ("glu_linear_offset", GLU_LINEAR_COPY),
)


def _name(version: Release) -> str:
    """``(0, 14)`` -> ``0.14``."""
    return f"{version[0]}.{version[1]}"


def _before(first: Release) -> str:
    """The last release without ``first``'s change: ``(0, 15)`` -> ``0.14``."""
    assert first[1] >= 1, f"no release before {first} is named here"
    return f"{first[0]}.{first[1] - 1}"


@dataclass(frozen=True)
class ReleaseRange:
    """The megatron-core releases an arguments block can come from, as its
    :data:`DATING_ARGUMENTS` tell them: from ``oldest`` (None: any older release) up to, not
    including, ``excluded``, the first release that printed ``missing`` (the argument the
    block lacks that dates it most)."""

    oldest: Release | None
    excluded: Release
    missing: str

    def __post_init__(self) -> None:
        if len(self.excluded) < 2 or self.excluded[1] < 1:
            raise ValueError(f"no release before megatron-core {self.excluded} is known here")
        if self.oldest is not None and self.oldest[:2] >= self.excluded[:2]:
            raise ValueError(
                f"an empty release range: from {_name(self.oldest)} to before "
                f"{_name(self.excluded)}"
            )

    @property
    def newest(self) -> str:
        """The newest release of the range (``0.14``)."""
        return _before(self.excluded)

    @property
    def predates(self) -> str:
        """The first release past the range (``0.15``)."""
        return _name(self.excluded)

    def describe(self) -> str:
        """``0.8 to 0.14`` / ``0.4 or older``."""
        if self.oldest is None:
            return f"{self.newest} or older"
        oldest = _name(self.oldest)
        return self.newest if oldest == self.newest else f"{oldest} to {self.newest}"

    def distinct_releases(self) -> tuple[str, ...]:
        """One release for each span of the range over which the terms stay the same
        (:data:`TERM_RELEASES`, to the minor release), newest first: ``0.14`` and ``0.12``
        (before 0.13's MoE changes) for ``0.8 to 0.14``."""
        out = [self.newest]
        for first in sorted({r[:2] for r in TERM_RELEASES}, reverse=True):
            if (self.oldest is None or self.oldest[:2] < first) and first < self.excluded[:2]:
                out.append(_before(first))
        return tuple(dict.fromkeys(out))


def release_range(names: set[str]) -> ReleaseRange | None:
    """The releases an arguments block printing ``names`` can come from; None when it
    names every dating argument (its release is not told apart: the estimate follows 0.16).
    The range ends before the first release that printed the missing argument that dates
    the block most, and starts at the first release that printed the newest argument it has.
    A block with an argument as new as one it lacks (that one renamed or removed since, or a
    hand-edited block) is not dated either."""
    missing = [(first, name) for name, first in DATING_ARGUMENTS if name not in names]
    present = [first for name, first in DATING_ARGUMENTS if name in names]
    if not missing or (present and max(present) >= min(missing)[0]):
        return None
    (first, name), oldest = min(missing), max(present, default=None)
    return ReleaseRange(oldest, first, name)


def legacy_grouped_mlp(model: ModelSpec) -> bool:
    """Whether the experts are the legacy ``GroupedMLP``: ``moe_grouped_gemm`` with the local
    spec or ``moe_use_legacy_grouped_gemm``, before 0.17 (:data:`NO_LEGACY_GROUPED_MLP`)."""
    if not model.moe_grouped_gemm or at_least(model, NO_LEGACY_GROUPED_MLP):
        return False
    return model.transformer_impl == "local" or model.moe_use_legacy_grouped_gemm


def grouped_gemm_experts(model: ModelSpec) -> bool:
    """Whether ``moe_grouped_gemm`` builds grouped experts (two weight tensors for all local
    experts, or TE's grouped linears) rather than one ``SequentialMLP`` per expert: always
    before 0.17; from 0.17 the local spec builds ``SequentialMLP``."""
    if not model.moe_grouped_gemm:
        return False
    return model.transformer_impl != "local" or not at_least(model, NO_LEGACY_GROUPED_MLP)


def mtp_inner_layer(model: ModelSpec) -> str:
    """The attribute name of an MTP layer's transformer layer (:data:`MTP_MODEL_LAYER`)."""
    return "mtp_model_layer" if at_least(model, MTP_MODEL_LAYER) else "transformer_layer"


def embedding_tagged(model: ModelSpec, first_stage: bool, mtp: bool) -> bool:
    """Whether a chunk's word embedding is tagged ``is_embedding_or_output_parameter``: the
    first stage's always, the MTP stage's copy from 0.18 (:data:`MTP_EMBEDDING_TAGGED`)."""
    return first_stage or (mtp and at_least(model, MTP_EMBEDDING_TAGGED))


def mla_fused_q_norm(model: ModelSpec) -> bool:
    """Whether MLA's query projection is Transformer Engine's fused norm+linear
    (``TELayerNormColumnParallelLinear``): ``qk_layernorm`` without ``q_lora_rank`` from 0.19
    (:data:`MLA_QK_NORM_RESOLVER`, ``QKNormConfigResolver._resolve_mla_qk_layernorm``); the
    local spec is refused there (``spec_checks``)."""
    return (
        model.multi_latent_attention
        and model.qk_layernorm
        and model.q_lora_rank is None
        and model.transformer_impl == "transformer_engine"
        and at_least(model, MLA_QK_NORM_RESOLVER)
    )


def megatron_fsdp_loss_regather(model: ModelSpec) -> bool:
    """Whether Megatron-FSDP's final norm all-gathers the released decoder layers again at
    the end of every forward (:data:`FSDP_NO_LOSS_REGATHER`: before 0.18)."""
    return not at_least(model, FSDP_NO_LOSS_REGATHER)


def megatron_fsdp_grad_bytes(spec: TrainingSpec) -> int:
    """Bytes per element of Megatron-FSDP's main-gradient buffer
    (:data:`MEGATRON_FSDP_GRADS_DTYPE`)."""
    from memscope.analysis.static.config import STATE_DTYPE_BYTES  # (import circle)

    prec = spec.precision
    if at_least(spec.model, MEGATRON_FSDP_GRADS_DTYPE):
        named = prec.megatron_fsdp_main_grads_dtype
        return STATE_DTYPE_BYTES[named] if named else prec.param_bytes
    return 4 if prec.grads_in_fp32 else prec.param_bytes
