"""The static estimator's typed input: one :class:`TrainingSpec` describes a training job.

Model + parallelism + precision/optimizer + batch, with the optional Transformer Engine
low-precision recipe (:class:`QuantSpec`) and ModelOpt distillation teacher
(:class:`DistillationSpec`). Plain data: :mod:`memscope.inputs` builds it from Megatron args,
a FlagScale training YAML or the original MemScope JSON config, and
:func:`.spec_checks.validate_spec` checks it as a whole. This module imports no other part of
the estimator but :mod:`.pipeline_layout`, so every other module may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memscope.analysis.static.pipeline_layout import ChunkRoles, mtp_chunk, stage_chunk

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
    rotary_percent: float = 1.0  # the share of each head's channels RoPE rotates
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
    # overlap_p2p_comm (interleaved schedule): receives posted ahead of the backward
    # (megatron-core's default False; Megatron-LM's --no-overlap-p2p-communication: True)
    overlap_p2p_comm: bool = False
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
    # dist_muon from megatron-core 0.18: shard by the DDP bucket layout (Megatron-LM's
    # --no-use-layer-wise-param-layout clears it; analysis/static/muon.py)
    layer_wise_param_layout: bool = True
    # DDP buckets (megatron/training/training.py resolve_ddp_bucket_size): one bucket per
    # buffer without --overlap-grad-reduce; --ddp-bucket-size (None: Megatron's default)
    overlap_grad_reduce: bool = False
    ddp_bucket_size: int | None = None

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.params_dtype]

    @property
    def mixed_precision(self) -> bool:
        return self.param_bytes < 4


FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "mxfp8", "blockwise")
FP4_RECIPES: tuple[str, ...] = ("nvfp4",)


@dataclass(frozen=True)
class QuantSpec:
    """Transformer Engine low-precision training of one job (``None`` on the spec: off)."""

    recipe: str  # one of FP8_RECIPES + FP4_RECIPES
    primary_weights: bool = False  # --fp8-param-gather / --fp4-param-gather
    amax_history_len: int = 1  # delayed scaling (Megatron-LM's default 1)
    bf16_layers_start: int = 0  # --first-last-layers-bf16: first layers kept in bf16
    bf16_layers_end: int = 0
    weight_cache: bool = True  # False: disable_parameter_transpose_cache

    @property
    def fp4(self) -> bool:
        return self.recipe in FP4_RECIPES

    def label(self) -> str:
        kind = "FP4" if self.fp4 else "FP8"
        weights = f"{kind} primary weights" if self.primary_weights else "bf16 primary weights"
        return f"{kind} ({self.recipe} recipe, {weights})"


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
    # the Transformer Engine release the run uses ("2.14.0"); None: workspaces.ASSUMED_TE
    # (its GEMM workspaces and the placeholder gradients it caches depend on it)
    transformer_engine_version: str | None = None
    # cross entropy: "unfused" (tensor_parallel.vocab_parallel_cross_entropy), or with
    # cross_entropy_loss_fusion its cross_entropy_fusion_impl: "native" or "te"
    cross_entropy: str = "unfused"
    # create_attention_mask_in_dataloader: each batch carries GPTDataset's [b, 1, s/cp, s]
    # bool attention mask (Megatron-LM's default; off without Megatron-LM's dataloader)
    dataloader_attention_mask: bool = False
    defer_embedding_wgrad: bool = False  # defer_embedding_wgrad_compute (last stage)
    wgrad_deferral_limit: int = 0  # most microbatches deferred (0: all of them)
    # gradient_accumulation_fusion: weight gradients accumulate straight into main_grad
    # (no per-GEMM weight-gradient temporary)
    gradient_accumulation_fusion: bool = False
    # CUBLAS_WORKSPACE_CONFIG of the run (":SIZE_KIB:COUNT" pairs); None: torch's default
    cublas_workspace_config: str | None = None
    # tp_comm_overlap: Transformer Engine's userbuffer GEMMs get their own cuBLAS workspace
    # (workspaces.py)
    tp_comm_overlap: bool = False
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
    # Megatron-FSDP with overlap_param_gather: the next forward's all-gather is issued after
    # the optimizer step (fsdp.in_flight)
    fsdp_overlap_param_gather: bool = False
    torch_fsdp2: bool = False
    # fine-grained activation offloading (megatron/core/transformer/transformer_config.py;
    # :mod:`.offload`)
    fine_grained_offloading: bool = False
    offload_modules: tuple[str, ...] = ()
    min_offloaded_tensor_size: int = 1024 * 1024  # elements
    # CUDA graphs (megatron-core TransformerConfig ``cuda_graph_impl``: none, local,
    # transformer_engine; :mod:`.cuda_graphs`): the graphed modules of each layer (empty: the
    # whole layer) and the eager iterations before the capture
    cuda_graph_impl: str = "none"
    cuda_graph_modules: tuple[str, ...] = ()
    cuda_graph_warmup_steps: int = 3
    # Megatron-LM's reinforcement-learning loop (train_rl.py --perform-rl-step; :mod:`.rl`):
    # the inference engine beside the trainer; None: plain training
    rl: RlSpec | None = None

    def recomputes(self, module: str) -> bool:
        """Whether selective recompute covers ``module`` (a ``recompute_modules`` name)."""
        return self.recompute == "selective" and module in self.recompute_modules


@dataclass(frozen=True)
class RlSpec:
    """The inference engine of Megatron-LM's RL loop beside the trainer (:mod:`.rl`; the
    flags' defaults are Megatron-LM's ``megatron/training/arguments.py`` at 4e85d74ae9)."""

    # --inference-dynamic-batching-buffer-size-gb (GiB: dynamic_context.py int(gb * 1024**3))
    buffer_size_gib: float = 40.0
    # --inference-dynamic-batching-paused-buffer-size-gb (None there: 0)
    paused_buffer_size_gib: float = 0.0
    block_size_tokens: int = 256  # --inference-dynamic-batching-block-size
    unified_memory_level: int = 0  # --inference-dynamic-batching-unified-memory-level
    kv_cache_mode: str = "persist"  # --rl-kv-cache-management-mode
    persist_cuda_graphs: bool = False  # --rl-persist-cuda-graphs
    # --rl-remove-kv-cache-during-training, before the management mode (836d473f03); its
    # twin --rl-offload-kv-cache-during-training pauses the buffer, which stays counted
    remove_kv_flag: bool = False
    # --rl-inference-{tensor,pipeline,expert,expert-tensor}-model-parallel-size: a separate
    # inference model at these sizes (None each: the training model's)
    inference_tp: int | None = None
    inference_pp: int | None = None
    inference_ep: int | None = None
    inference_etp: int | None = None
    # --inference-dynamic-batching-num-cuda-graphs with Megatron's own (local) CUDA graphs;
    # None: no graphs; -1: Megatron's automatic list
    inference_cuda_graphs: int | None = None
    max_sequence_length: int = 2560  # --inference-max-seq-length
    max_requests: int | None = None  # --inference-dynamic-batching-max-requests
    max_tokens: int | None = None  # --inference-dynamic-batching-max-tokens (None: 16384)
    # --inference-dynamic-batching-cuda-graph-mixed-prefill-count
    mixed_prefill_requests: int = 16
    decode_only_cuda_graphs: bool = False  # --decode-only-cuda-graphs
    # --rl-offload-optimizer-during-inference: the optimizer's tensors, and model chunk 0's
    # gradient buffers unless the training step is graphed, are on the host for the rollout
    offload_optimizer: bool = False
    training_cuda_graphs: bool = False  # --rl-training-cuda-graphs
    # the rollouts the RL agent keeps generating at once, over all engines (:mod:`.rl_rollout`)
    requests_in_flight: int = 1024
    sampling_top_p: float = 0.0  # --rl-default-top-p (the RL client sends no top-k)
    # --return-log-probs (train_rl's inference args): logits for every token of a step
    return_log_probs: bool = False

    @property
    def separate_model(self) -> bool:
        """Whether inference runs on its own copy of the model (any inference size given)."""
        sizes = (self.inference_tp, self.inference_pp, self.inference_ep, self.inference_etp)
        return any(v is not None for v in sizes)

    @property
    def kv_resident(self) -> bool:
        """Whether the allocator still counts the KV buffer while the trainer steps.

        ``deallocate_inference_state_buffers`` (dynamic_context.py at 4e85d74ae9) returns at
        once under ``persist`` and under unified memory; with ``--rl-persist-cuda-graphs``
        the buffer lives in a ``torch_memory_saver`` region (required for ``offload``), whose
        ``pause`` unmaps the pages but leaves torch's blocks allocated; only ``recompute``
        otherwise deletes it. Before the mode (836d473f03), ``--rl-remove-kv-cache-during-
        training`` dropped it and the offload flag paused it the same way."""
        if self.remove_kv_flag:
            return False
        if self.kv_cache_mode != "recompute" or self.unified_memory_level > 0:
            return True
        return self.persist_cuda_graphs


@dataclass(frozen=True)
class DistillationSpec:
    """The teacher and the KD loss of a ModelOpt distillation run."""

    teacher: TrainingSpec  # the teacher as a spec with the student's parallel sizes
    teacher_source: str  # where its config came from
    skip_lm_loss: bool = True
    logit_topk: int | None = None
    intermediate_pairs: int = 0


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


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding: up to a multiple of ``divisible_by * tp``."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
