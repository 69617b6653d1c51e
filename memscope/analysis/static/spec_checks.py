"""The whole-spec check: every refusal of a :class:`~.config.TrainingSpec` in one call.

:func:`validate_spec` runs the spec's own checks (sizes, tensor-parallel splits, the layer
split megatron-core's ``TransformerConfig.__post_init__`` asserts) and each feature's
(:mod:`.feature_checks`, :mod:`.fsdp_checks`, :mod:`.muon`, :mod:`.offload`,
:mod:`.validation`, the GPU name of :mod:`.workspaces`). It sits above them all, so the spec
types in :mod:`.config` import none of them.
"""

from __future__ import annotations

from memscope.analysis.static.config import (
    CROSS_ENTROPY,
    DTYPE_BYTES,
    NORMALIZATIONS,
    OPTIMIZERS,
    POSITION_EMBEDDINGS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    TRANSFORMER_IMPLS,
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
)
from memscope.analysis.static.feature_checks import (
    validate_mla_mtp,
    validate_moe,
    validate_savers,
)
from memscope.analysis.static.fsdp_checks import validate_fsdp
from memscope.analysis.static.muon import validate_muon
from memscope.analysis.static.offload import validate_offload
from memscope.analysis.static.pipeline_layout import validate_layout
from memscope.analysis.static.rl import inference_spec, validate_rl
from memscope.analysis.static.validation import check_scale, check_sharding, check_sizes
from memscope.analysis.static.workspaces import check_machine


def validate_spec(spec: TrainingSpec) -> TrainingSpec:
    """``spec`` checked as a whole (what Megatron would refuse, what the estimator cannot
    list), returned unchanged; a ``ValueError`` names the first problem."""
    _check_shape(spec)
    _check_grid(spec)
    _check_schedule(spec)
    _check_names(spec)
    _check_runtime(spec)
    validate_moe(spec.model, spec.parallel)
    validate_mla_mtp(spec.model, spec.parallel)
    validate_savers(spec)
    validate_muon(spec)
    validate_fsdp(spec)
    validate_offload(spec)
    _check_rl(spec)
    check_scale(spec)
    return spec


def _check_rl(spec: TrainingSpec) -> None:
    """The RL loop's engine (rl.py), its separate inference model checked as a spec."""
    if spec.rl is None:
        return
    if spec.rl.separate_model:
        try:
            validate_spec(inference_spec(spec))
        except ValueError as exc:
            raise ValueError(f"RL inference model: {exc}") from None
    validate_rl(spec)


def _check_shape(spec: TrainingSpec) -> None:
    """Positive sizes; heads dividing the hidden size, query groups the heads."""
    m = spec.model
    for name in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "seq_length",
    ):
        if getattr(m, name) <= 0:
            raise ValueError(f"model.{name} must be positive, got {getattr(m, name)}")
    check_sizes(spec)
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        raise ValueError(
            f"model.num_attention_heads ({m.num_attention_heads}) must divide "
            f"model.hidden_size ({m.hidden_size})"
        )
    if m.num_attention_heads % m.query_groups:
        raise ValueError(
            f"model.num_query_groups ({m.query_groups}) must divide "
            f"model.num_attention_heads ({m.num_attention_heads})"
        )


def _check_grid(spec: TrainingSpec) -> None:
    """Parallel sizes, tensor-parallel splits and the pipeline's layer split."""
    m, p = spec.model, spec.parallel
    for name in ("tp", "pp", "dp", "cp", "ep"):
        if getattr(p, name) < 1:
            raise ValueError(f"parallel.{name} must be >= 1, got {getattr(p, name)}")
    for tp in sorted({p.tp} | {tp for tp, _ in p.stage_meshes or ()}):
        _validate_tp(m, tp)
    check_sharding(spec)
    _validate_stage_layers(m, p)


def _check_schedule(spec: TrainingSpec) -> None:
    """Recompute, the batch, virtual stages and the MoE all-to-all overlap."""
    p = spec.parallel
    if spec.recompute not in RECOMPUTE:
        raise ValueError(f"training.recompute must be one of {RECOMPUTE}")
    if spec.recompute_method not in RECOMPUTE_METHODS:
        raise ValueError(f"recompute_method must be one of {RECOMPUTE_METHODS}")
    if spec.recompute_num_layers < 1:
        raise ValueError("recompute_num_layers must be >= 1")
    for name in ("micro_batch_size", "num_microbatches"):
        if getattr(spec, name) < 1:
            raise ValueError(f"training.{name} must be >= 1, got {getattr(spec, name)}")
    if p.vpp is not None and p.pp < 2:
        raise ValueError("parallel.vpp needs parallel.pp >= 2")
    group = p.microbatch_group_size
    if p.vpp is not None and group is not None and not p.pp <= group <= spec.num_microbatches:
        raise ValueError(  # megatron-core forward_backward_pipelining_with_interleaving
            f"microbatch_group_size_per_vp_stage ({group}) must be in [parallel.pp "
            f"({p.pp}), num_microbatches ({spec.num_microbatches})]"
        )
    if p.moe_a2a_overlap:  # megatron/core/transformer/transformer_config.py
        if p.ep < 2:
            raise ValueError("overlap_moe_expert_parallel_comm needs expert parallelism > 1")
        if p.pp > 1 and p.vpp is None:
            raise ValueError(
                "overlap_moe_expert_parallel_comm with pipeline parallelism needs a virtual "
                "pipeline (num_layers_per_virtual_pipeline_stage)"
            )
        if spec.recompute == "full":
            raise ValueError("overlap_moe_expert_parallel_comm refuses full recompute")


def _check_names(spec: TrainingSpec) -> None:
    """Every named choice among the ones the estimator knows."""
    m, prec = spec.model, spec.precision
    if prec.params_dtype not in DTYPE_BYTES:
        raise ValueError(
            f"precision.params_dtype {prec.params_dtype!r} is unknown; use one of "
            f"{sorted(set(DTYPE_BYTES))}"
        )
    if prec.optimizer not in OPTIMIZERS:
        raise ValueError(f"precision.optimizer must be one of {OPTIMIZERS}, got {prec.optimizer!r}")
    if m.normalization not in NORMALIZATIONS:
        raise ValueError(f"model.normalization must be one of {NORMALIZATIONS}")
    if m.position_embedding_type not in POSITION_EMBEDDINGS:
        raise ValueError(f"model.position_embedding_type must be one of {POSITION_EMBEDDINGS}")
    if m.transformer_impl not in TRANSFORMER_IMPLS:
        raise ValueError(f"model.transformer_impl must be one of {TRANSFORMER_IMPLS}")
    if spec.cross_entropy not in CROSS_ENTROPY:
        raise ValueError(f"cross_entropy_fusion_impl must be one of {CROSS_ENTROPY[1:]}")


def _check_runtime(spec: TrainingSpec) -> None:
    """The optimizer instances, the GPU name, the Transformer Engine release and the
    deferred weight gradients."""
    p, prec = spec.parallel, spec.precision
    if prec.distributed_optimizer_instances < 1 or p.dp % prec.distributed_optimizer_instances:
        raise ValueError(
            f"num_distributed_optimizer_instances ({prec.distributed_optimizer_instances}) "
            f"must divide the data-parallel size ({p.dp})"
        )
    if spec.device == "cuda":
        check_machine(spec.gpu, spec.transformer_engine_version)
    if spec.defer_embedding_wgrad and (p.pp < 2 or not spec.gradient_accumulation_fusion):
        raise ValueError(  # megatron/core/model_parallel_config.py __post_init__
            "defer_embedding_wgrad_compute needs pipeline parallelism (pp > 1) and "
            "gradient_accumulation_fusion"
        )
    if spec.wgrad_deferral_limit < 0:
        raise ValueError(f"wgrad_deferral_limit must be >= 0, got {spec.wgrad_deferral_limit}")


def _validate_tp(m: ModelSpec, tp: int) -> None:
    if m.num_attention_heads % tp:
        raise ValueError(
            f"parallel.tp ({tp}) must divide model.num_attention_heads ({m.num_attention_heads})"
        )
    if m.query_groups % tp:
        raise ValueError(
            f"parallel.tp ({tp}) must divide model.num_query_groups ({m.query_groups})"
        )
    if m.vocab_size % tp:
        raise ValueError(f"parallel.tp ({tp}) must divide model.vocab_size ({m.vocab_size})")


def _validate_stage_layers(m: ModelSpec, p: ParallelSpec) -> None:
    """The layer-split checks of megatron-core ``TransformerConfig.__post_init__``
    (megatron/core/transformer/transformer_config.py), each refused with its reason."""
    if p.stage_meshes is not None and len(p.stage_meshes) != p.pp:
        raise ValueError(f"parallel.stage_meshes: {len(p.stage_meshes)} stages, pp is {p.pp}")
    uneven = p.first_stage_layers is not None or p.last_stage_layers is not None
    accounted = p.account_for_embedding or p.account_for_loss
    if p.layout is not None:
        if uneven or accounted or p.stage_layers is not None:
            raise ValueError(  # megatron-core TransformerConfig.__post_init__
                "pipeline_model_parallel_layout cannot be combined with decoder_first/last_"
                "pipeline_num_layers, account_for_embedding/loss_in_pipeline_split or a "
                "per-stage layer split"
            )
        validate_layout(p.layout, p.pp, m.num_layers, m.mtp_num_layers)
        chunks = len(p.layout) // p.pp
        if p.pp < 2 and chunks > 1:
            raise ValueError(
                f"pipeline_model_parallel_layout: {chunks} virtual stages need parallel.pp >= 2"
            )
        if (p.vpp if p.vpp is not None and p.pp > 1 else 1) != chunks:
            raise ValueError(
                f"parallel.vpp ({p.vpp}) conflicts with pipeline_model_parallel_layout "
                f"({chunks} virtual stages per pipeline rank)"
            )
        return
    if p.stage_layers is not None:
        counts = list(p.stage_layers)
        if len(counts) != p.pp or sum(counts) != m.num_layers or min(counts) < 1:
            raise ValueError(
                f"parallel.stage_layers {counts} must give each of the {p.pp} stages >= 1 "
                f"layer and add up to model.num_layers ({m.num_layers})"
            )
        if p.vpp is not None:
            raise ValueError("parallel.vpp with a per-stage layer split is not supported")
        if accounted:
            raise ValueError(
                "account_for_embedding/loss_in_pipeline_split with a per-stage layer split "
                "(hetero_pipeline_layer_split) is not supported"
            )
        return
    vpp = p.vpp if p.vpp is not None and p.pp > 1 else None
    if uneven and accounted:
        raise ValueError(
            "decoder_first/last_pipeline_num_layers cannot be combined with "
            "account_for_embedding/loss_in_pipeline_split (megatron-core TransformerConfig)"
        )
    if uneven:
        for name in ("first_stage_layers", "last_stage_layers"):
            value = getattr(p, name)
            if value is not None and value < 1:
                raise ValueError(f"parallel.{name} must be >= 1 (megatron-core), got {value}")
            if value is not None and vpp is not None and value % vpp:
                raise ValueError(
                    f"parallel.{name} ({value}) must be divisible by parallel.vpp ({vpp}) "
                    "(megatron-core TransformerConfig)"
                )
        fixed = [x for x in (p.first_stage_layers, p.last_stage_layers) if x is not None]
        middle = p.pp - len(fixed)
        rest = m.num_layers - sum(fixed)
        if p.pp < 2 or rest < 0 or (middle > 0 and rest % middle) or (middle == 0 and rest):
            raise ValueError(
                f"parallel.first_stage_layers/last_stage_layers ({p.first_stage_layers}/"
                f"{p.last_stage_layers}) do not split model.num_layers ({m.num_layers}) over "
                f"parallel.pp ({p.pp}) stages"
            )
        if middle > 0 and vpp is not None and (rest // middle) % vpp:
            raise ValueError(
                f"the {rest // middle} layers of each middle pipeline stage must be divisible "
                f"by parallel.vpp ({vpp}) (megatron-core TransformerConfig)"
            )
        return
    total = m.num_layers + int(p.account_for_embedding) + int(p.account_for_loss)
    what = "model.num_layers" + (
        f" + {int(p.account_for_embedding) + int(p.account_for_loss)} "
        "(account_for_embedding/loss_in_pipeline_split)"
        if accounted
        else ""
    )
    chunks = p.pp * (vpp or 1)
    if total % chunks:
        raise ValueError(f"parallel.pp x vpp ({chunks}) must divide {what} ({total})")
    # total % chunks == 0 leaves every chunk >= 1 layer before the embedding/loss takes one
