"""Typed, validated inputs of the static estimator and their sources.

One :class:`TrainingSpec` (model + parallelism + precision/optimizer + batch) describes a
training job; :mod:`.sources` builds it from Megatron args, a FlagScale training YAML or the
original MemScope JSON config. Contradictory or missing fields raise ``ValueError`` naming
the field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from memscope.analysis.static.feature_checks import (
    validate_mla_mtp,
    validate_moe,
    validate_savers,
)
from memscope.analysis.static.fsdp_checks import validate_fsdp
from memscope.analysis.static.muon import validate_muon
from memscope.analysis.static.offload import validate_offload
from memscope.analysis.static.pipeline_layout import (
    ChunkRoles,
    mtp_chunk,
    stage_chunk,
    validate_layout,
)
from memscope.analysis.static.validation import check_scale, check_sharding, check_sizes
from memscope.analysis.static.workspaces import compute_major

if TYPE_CHECKING:
    from memscope.analysis.static.distillation import DistillationSpec
    from memscope.analysis.static.fp8 import QuantSpec

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")
OPTIMIZERS = ("adam", "sgd", "muon", "dist_muon")  # dist_muon: layer-wise distributed Muon
RECOMPUTE = (None, "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
TRANSFORMER_IMPLS = ("local", "transformer_engine")
CROSS_ENTROPY = ("unfused", "native", "te")
# --use-precision-aware-optimizer dtypes (Megatron-LM arguments.py choices; fp8 is uint8)
STATE_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
MAIN_GRADS_DTYPES = ("fp32", "bf16")
MAIN_PARAMS_DTYPES = ("fp32", "fp16")
# megatron/core/transformer/transformer_config.py recompute_modules choices
RECOMPUTE_MODULES = (
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"
)  # fmt: skip
# Megatron features whose parameters/activations this estimator does not model (refused).
UNSUPPORTED: dict[str, str] = {}


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a Megatron GPT model (before parallel sharding)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int  # already padded as the model sees it
    seq_length: int
    num_query_groups: int | None = None  # None: multi-head attention
    ffn_hidden_size: int | None = None  # None: 4 * hidden_size
    kv_channels: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int | None = None  # None: seq_length
    gated_linear_unit: bool = False  # SwiGLU
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    normalization: str = "LayerNorm"
    position_embedding_type: str = "learned_absolute"
    tie_embeddings: bool = True
    hidden_dropout: float = 0.1  # Megatron's default
    attention_dropout: float = 0.1
    # Mixture of experts (num_experts None: a dense MLP in every layer).
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None  # None: ffn_hidden_size
    moe_shared_expert_intermediate_size: int | None = None  # None: no shared expert
    moe_layer_pattern: tuple[int, ...] | None = None  # per layer, 1 MoE / 0 dense; None: all MoE
    moe_router_topk: int = 2
    moe_grouped_gemm: bool = False  # local spec: GroupedMLP (two tensors for all local experts)
    moe_use_legacy_grouped_gemm: bool = False  # TE spec: GroupedMLP instead of TEGroupedMLP
    moe_router_enable_expert_bias: bool = False  # adds router buffers, not parameters
    moe_token_dispatcher: str = "allgather"  # moe_token_dispatcher_type
    moe_router_dtype: str | None = None  # "fp32" / "fp64"; None: the activation dtype
    moe_router_score_function: str = "softmax"
    moe_aux_loss: bool = False  # an aux-loss load balancing type with a positive coefficient
    moe_z_loss: bool = False  # moe_z_loss_coeff set (router.py apply_z_loss)
    moe_expert_capacity_factor: float | None = None  # None or negative: dropless
    moe_pad_expert_input_to_capacity: bool = False
    moe_shared_expert_overlap: bool = False  # shared experts on their own stream
    moe_permute_fusion: bool = False  # Transformer Engine's fused (un)permute (moe_utils.permute)
    # Assumption, not a Megatron setting: under dropless routing, the busiest rank's routed rows
    # at the peak over the balanced ``tokens * topk`` (1.0: balanced; see moe.imbalance_bound)
    moe_token_imbalance: float = 1.0
    # Multi-latent attention (Megatron's argument defaults).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None  # None: linear_q_proj without low-rank query compression
    kv_lora_rank: int = 32
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    mtp_num_layers: int | None = None  # multi-token prediction layers on the last stage
    # "transformer_engine" only changes shapes where TE's spec differs from the local one
    # (MLA down-projections are replicated across TP ranks instead of sharded).
    transformer_impl: str = "local"
    # Megatron's kernel fusions (megatron/training/arguments.py defaults: all on)
    bias_activation_fusion: bool = True  # bias_swiglu_fusion / bias_gelu_fusion
    masked_softmax_fusion: bool = True  # unfused attention: fused scale-mask-softmax kernel
    attention_softmax_in_fp32: bool = False  # unfused softmax computed (and kept) in fp32
    rope_fusion: bool = True  # apply_rope_fusion: fused RoPE keeps no per-layer cos/sin
    # the megatron-core building the model (where releases differ: megatron_versions.py);
    # None: unknown, estimated as 0.16
    megatron_core_version: str | None = None

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def moe_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based, global) has a MoE MLP."""
        if self.num_experts is None:
            return False
        return self.moe_layer_pattern is None or self.moe_layer_pattern[index] == 1


@dataclass(frozen=True)
class ParallelSpec:
    """Parallel sizes of the job."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallel; None: tp (Megatron's default)
    vpp: int | None = None
    sequence_parallel: bool = False
    first_stage_layers: int | None = None  # decoder_first_pipeline_num_layers
    last_stage_layers: int | None = None  # decoder_last_pipeline_num_layers
    stage_layers: tuple[int, ...] | None = None  # per stage (FlagScale's hetero layer split)
    stage_meshes: tuple[tuple[int, int], ...] | None = None  # hetero: (tp, dp) per stage
    # account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split: the
    # embedding (loss) counts as one layer of the first (last) stage's split
    account_for_embedding: bool = False
    account_for_loss: bool = False
    # Transformer Engine's context-parallel attention exchange (megatron's --cp-comm-type)
    cp_comm_type: str = "p2p"
    # microbatch_group_size_per_vp_stage (interleaved schedule); None: pp (Megatron's default)
    microbatch_group_size: int | None = None
    # --overlap-moe-expert-parallel-comm: the combined 1F1B schedules co-run one microbatch's
    # forward with another's backward (megatron/core/pipeline_parallel/combined_1f1b.py)
    moe_a2a_overlap: bool = False
    # nothing gave the world size or dp: dp is the least the grid allows (1 without experts)
    dp_assumed: bool = False
    # pipeline_model_parallel_layout, its flat stages unrolled (:mod:`.pipeline_layout`)
    layout: tuple[str, ...] | None = None

    @property
    def world_size(self) -> int:
        if self.stage_meshes is not None:
            return sum(tp * self.cp * dp for tp, dp in self.stage_meshes)
        return self.tp * self.pp * self.dp * self.cp

    def stage_sizes(self, pp_rank: int) -> tuple[int, int]:
        """(tp, dp) of pipeline stage ``pp_rank`` (differs per stage on hetero meshes)."""
        if self.stage_meshes is not None:
            return self.stage_meshes[pp_rank]
        return self.tp, self.dp

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of expert weights (tp x cp x dp = etp x ep x expert_dp)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)


@dataclass(frozen=True)
class PrecisionSpec:
    """Parameter dtype, gradient accumulation dtype and optimizer."""

    params_dtype: str = "float32"
    grads_in_fp32: bool = False  # Megatron's DDP buffer in fp32 (bf16 training default)
    optimizer: str = "adam"
    distributed_optimizer: bool = False
    sgd_momentum: bool = True
    torch_optimizer: bool = False  # torch.optim (keeps a 4-byte step tensor per param tensor)
    # num_distributed_optimizer_instances: the distributed optimizer shards within each
    # instance's share of the data-parallel group (megatron/core/parallel_state.py)
    distributed_optimizer_instances: int = 1
    # --use-precision-aware-optimizer (megatron/core/optimizer/optimizer_config.py): TE's
    # FusedAdam holds the master weights and the Adam moments in these dtypes
    precision_aware: bool = False
    main_grads_dtype: str = "fp32"  # the DDP gradient buffer under bf16 (arguments.py)
    # --megatron-fsdp-main-grads-dtype (Megatron-LM 0.19); None: "auto", the parameters'
    megatron_fsdp_main_grads_dtype: str | None = None
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    store_param_remainders: bool = True  # bf16: the master weight's low 16 bits only
    # --optimizer-cpu-offload (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py)
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 1.0  # Megatron-LM's default
    # Muon's tensor-parallel Newton-Schulz (megatron-core OptimizerConfig.muon_tp_mode)
    muon_tp_mode: str = "blockwise"

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.params_dtype]

    @property
    def mixed_precision(self) -> bool:
        return self.param_bytes < 4


@dataclass(frozen=True)
class TrainingSpec:
    """Everything the estimator reads."""

    model: ModelSpec
    parallel: ParallelSpec
    precision: PrecisionSpec
    micro_batch_size: int = 1
    num_microbatches: int = 1
    recompute: str | None = None  # None | "selective" | "full"
    recompute_method: str = "uniform"  # full recompute: "uniform" | "block"
    recompute_num_layers: int = 1  # full recompute: layers per checkpoint (uniform) or count
    flash_attention: bool = False  # fused/flash kernel: no [b, a, s, s] scores kept
    device: str = "cuda"  # "cpu": dropout masks have the activation dtype, not bool
    # the GPU (fixed cuBLAS / Transformer Engine workspaces depend on its architecture);
    # None on cuda: a Hopper GPU is assumed (stated in the report's assumptions)
    gpu: str | None = None
    # cross entropy: "unfused" (tensor_parallel.vocab_parallel_cross_entropy), or with
    # cross_entropy_loss_fusion its cross_entropy_fusion_impl: "native" or "te"
    cross_entropy: str = "unfused"
    defer_embedding_wgrad: bool = False  # defer_embedding_wgrad_compute (last stage)
    wgrad_deferral_limit: int = 0  # most microbatches deferred (0: all of them)
    # gradient_accumulation_fusion: weight gradients accumulate straight into main_grad
    # (no per-GEMM weight-gradient temporary)
    gradient_accumulation_fusion: bool = False
    # CUBLAS_WORKSPACE_CONFIG of the run (":SIZE_KIB:COUNT" pairs); None: torch's default
    cublas_workspace_config: str | None = None
    # selective recompute: megatron-core's recompute_modules (default ["core_attn"])
    recompute_modules: tuple[str, ...] = ("core_attn",)
    # activation offload (megatron/core/model_parallel_config.py cpu_offloading*)
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = 0
    cpu_offloading_activations: bool = True
    cpu_offloading_weights: bool = False
    # Transformer Engine FP8/FP4 training (fp8.py); None: the activation dtype throughout
    quant: QuantSpec | None = None
    # ModelOpt knowledge distillation (distillation.py); None: no teacher
    distillation: DistillationSpec | None = None
    # Megatron-FSDP's data_parallel_sharding_strategy (None: Megatron DDP) and torch FSDP2
    # (:mod:`.fsdp`)
    fsdp: str | None = None
    torch_fsdp2: bool = False
    # fine-grained activation offloading (megatron/core/transformer/transformer_config.py;
    # :mod:`.offload`)
    fine_grained_offloading: bool = False
    offload_modules: tuple[str, ...] = ()
    min_offloaded_tensor_size: int = 1024 * 1024  # elements

    def recomputes(self, module: str) -> bool:
        """Whether selective recompute covers ``module`` (a ``recompute_modules`` name)."""
        return self.recompute == "selective" and module in self.recompute_modules

    def validate(self) -> TrainingSpec:
        m, p, prec = self.model, self.parallel, self.precision
        for name in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "vocab_size",
            "seq_length",
        ):
            if getattr(m, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(m, name)}")
        check_sizes(self)
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
        for name in ("tp", "pp", "dp", "cp", "ep"):
            if getattr(p, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1, got {getattr(p, name)}")
        for tp in sorted({p.tp} | {tp for tp, _ in p.stage_meshes or ()}):
            _validate_tp(m, tp)
        check_sharding(self)
        _validate_stage_layers(m, p)
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"training.recompute must be one of {RECOMPUTE}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise ValueError(f"recompute_method must be one of {RECOMPUTE_METHODS}")
        if self.recompute_num_layers < 1:
            raise ValueError("recompute_num_layers must be >= 1")
        for name in ("micro_batch_size", "num_microbatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"training.{name} must be >= 1, got {getattr(self, name)}")
        if p.vpp is not None and p.pp < 2:
            raise ValueError("parallel.vpp needs parallel.pp >= 2")
        group = p.microbatch_group_size
        if p.vpp is not None and group is not None and not p.pp <= group <= self.num_microbatches:
            raise ValueError(  # megatron-core forward_backward_pipelining_with_interleaving
                f"microbatch_group_size_per_vp_stage ({group}) must be in [parallel.pp "
                f"({p.pp}), num_microbatches ({self.num_microbatches})]"
            )
        if p.moe_a2a_overlap:  # megatron/core/transformer/transformer_config.py
            if p.ep < 2:
                raise ValueError("overlap_moe_expert_parallel_comm needs expert parallelism > 1")
            if p.pp > 1 and p.vpp is None:
                raise ValueError(
                    "overlap_moe_expert_parallel_comm with pipeline parallelism needs a virtual "
                    "pipeline (num_layers_per_virtual_pipeline_stage)"
                )
            if self.recompute == "full":
                raise ValueError("overlap_moe_expert_parallel_comm refuses full recompute")
        if prec.params_dtype not in DTYPE_BYTES:
            raise ValueError(
                f"precision.params_dtype {prec.params_dtype!r} is unknown; use one of "
                f"{sorted(set(DTYPE_BYTES))}"
            )
        if prec.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"precision.optimizer must be one of {OPTIMIZERS}, got {prec.optimizer!r}"
            )
        if m.normalization not in NORMALIZATIONS:
            raise ValueError(f"model.normalization must be one of {NORMALIZATIONS}")
        if m.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ValueError(f"model.position_embedding_type must be one of {POSITION_EMBEDDINGS}")
        if m.transformer_impl not in TRANSFORMER_IMPLS:
            raise ValueError(f"model.transformer_impl must be one of {TRANSFORMER_IMPLS}")
        if self.cross_entropy not in CROSS_ENTROPY:
            raise ValueError(f"cross_entropy_fusion_impl must be one of {CROSS_ENTROPY[1:]}")
        if prec.distributed_optimizer_instances < 1 or p.dp % prec.distributed_optimizer_instances:
            raise ValueError(
                f"num_distributed_optimizer_instances ({prec.distributed_optimizer_instances}) "
                f"must divide the data-parallel size ({p.dp})"
            )
        if self.device == "cuda":
            compute_major(self.gpu)  # an unknown GPU name is refused
        if self.defer_embedding_wgrad and (p.pp < 2 or not self.gradient_accumulation_fusion):
            raise ValueError(  # megatron/core/model_parallel_config.py __post_init__
                "defer_embedding_wgrad_compute needs pipeline parallelism (pp > 1) and "
                "gradient_accumulation_fusion"
            )
        if self.wgrad_deferral_limit < 0:
            raise ValueError(f"wgrad_deferral_limit must be >= 0, got {self.wgrad_deferral_limit}")
        validate_moe(m, p)
        validate_mla_mtp(m, p)
        validate_savers(self)
        validate_muon(self)
        validate_fsdp(self)
        validate_offload(self)
        check_scale(self)
        return self


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


def stage_spec(spec: TrainingSpec, pp_rank: int) -> TrainingSpec:
    """``spec`` as pipeline stage ``pp_rank`` sees it (its own tp and dp on hetero meshes)."""
    p = spec.parallel
    if p.stage_meshes is None:
        return spec
    tp, dp = p.stage_meshes[pp_rank]
    sizes = replace(p, tp=tp, dp=dp, sequence_parallel=p.sequence_parallel and tp > 1)
    return replace(spec, parallel=sizes)


def chunk_layer_counts(m: ModelSpec, p: ParallelSpec, pp_rank: int) -> list[int]:
    """Decoder layers of each virtual chunk of stage ``pp_rank``: megatron-core's
    ``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py).

    Uneven first/last stages give their layers to that stage (split evenly over its
    chunks); otherwise ``num_layers`` (+1 with ``account_for_embedding_in_pipeline_split``,
    +1 with ``account_for_loss_in_pipeline_split``) is split evenly over the stages and each
    stage's layers over its chunks, then the first chunk of the first stage builds one layer
    less for the embedding and the last chunk of the last stage one less for the loss.
    FlagScale's hetero split gives each stage its own count (no virtual chunks); a
    ``pipeline_model_parallel_layout`` gives each chunk its ``t`` entries
    (``PipelineParallelLayerLayout.get_num_layers_to_build``)."""
    if p.layout is not None:
        chunks = len(p.layout) // p.pp
        return [stage_chunk(p.layout, p.pp, pp_rank, c).count("t") for c in range(chunks)]
    if p.stage_layers is not None:
        return [p.stage_layers[pp_rank]]
    vpp = p.vpp if p.vpp is not None and p.pp > 1 else 1
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        fixed = [p.first_stage_layers, p.last_stage_layers]
        middle = p.pp - sum(x is not None for x in fixed)
        rest = m.num_layers - sum(x or 0 for x in fixed)
        per_rank = rest // middle if middle > 0 else 0
        if pp_rank == 0 and p.first_stage_layers is not None:
            per_rank = p.first_stage_layers
        if pp_rank == p.pp - 1 and p.last_stage_layers is not None:
            per_rank = p.last_stage_layers
        return [per_rank // vpp] * vpp
    total = m.num_layers + int(p.account_for_embedding) + int(p.account_for_loss)
    counts = [total // p.pp // vpp] * vpp
    if p.account_for_embedding and pp_rank == 0:
        counts[0] -= 1
    if p.account_for_loss and pp_rank == p.pp - 1:
        counts[-1] -= 1
    return counts


def chunk_layer_offset(m: ModelSpec, p: ParallelSpec, pp_rank: int, chunk: int) -> int:
    """Global index of the first layer of virtual chunk ``chunk`` of stage ``pp_rank``.

    megatron-core's ``get_transformer_layer_offset`` (megatron/core/transformer/
    transformer_layer.py) numbers layers chunk-major (virtual stage, then pipeline rank); in
    every case it equals the layers of all earlier (chunk, rank) pairs, summed here."""
    per_rank = [chunk_layer_counts(m, p, r) for r in range(p.pp)]
    earlier = sum(per_rank[r][c] for c in range(chunk) for r in range(p.pp))
    return earlier + sum(per_rank[r][chunk] for r in range(pp_rank))


def chunk_roles(m: ModelSpec, p: ParallelSpec, pp_rank: int, chunk: int) -> ChunkRoles:
    """What virtual chunk ``chunk`` of stage ``pp_rank`` builds besides its decoder layers
    (:class:`.pipeline_layout.ChunkRoles`, megatron-core 0.16.1 ``GPTModel.__init__``)."""
    counts = chunk_layer_counts(m, p, pp_rank)
    chunks = len(counts)
    first = pp_rank == 0 and chunk == 0  # the layout's E is always here
    last = pp_rank == p.pp - 1 and chunk == chunks - 1  # and its L here
    mtp = bool(m.mtp_num_layers) and mtp_chunk(p.pp, chunks, p.layout) == (pp_rank, chunk)
    if m.mtp_num_layers:  # the final norm follows the last decoder layer
        start = chunk_layer_offset(m, p, pp_rank, chunk)
        final_norm = start <= m.num_layers - 1 < start + counts[chunk]
    else:
        final_norm = last
    return ChunkRoles(
        embedding=first or mtp, loss=last, mtp=mtp, final_norm=final_norm, first=first
    )


def stage_layer_counts(m: ModelSpec, p: ParallelSpec) -> list[int]:
    """Decoder layers per pipeline stage (all its virtual chunks)."""
    return [sum(chunk_layer_counts(m, p, r)) for r in range(p.pp)]


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


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding: up to a multiple of ``divisible_by * tp``."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
