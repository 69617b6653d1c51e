"""Exact per-rank parameter inventory of a megatron-core ``GPTModel`` (local layer spec).

Each entry is one parameter tensor as this rank holds it (tensor-parallel shard, pipeline
stage, virtual chunks), so both bytes and tensor counts follow from it. Names follow the
local spec of megatron-core 0.16.1 (``get_gpt_decoder_block_spec`` /
``get_gpt_layer_local_spec`` / ``get_gpt_mtp_block_spec`` with ``use_transformer_engine=False``);
Transformer Engine's spec fuses the norms into the next linear layer (other names, same
sizes), keeps the MLA down-projections whole on every TP rank (``transformer_impl``) and
splits grouped experts into one tensor per expert (same total size).

Mixture of experts: the router weight ``[num_experts, h]`` is a parameter (its
``expert_bias`` and ``local_tokens_per_expert``, two fp32 ``[num_experts]`` tensors when
``moe_router_enable_expert_bias``, are buffers and not listed); each EP rank holds
``num_experts / ep`` experts whose linear layers are sharded over the expert-TP group
(``etp``); shared experts are sharded over TP like a dense MLP. Expert tensors carry
``expert=True``: the distributed optimizer shards them over ``ParallelSpec.expert_dp``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memscope.analysis.static.config import (
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    chunk_layer_counts,
    chunk_layer_offset,
    chunk_roles,
)
from memscope.analysis.static.megatron_versions import (
    embedding_tagged,
    grouped_gemm_experts,
    mla_fused_q_norm,
    mtp_inner_layer,
)


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor on one rank."""

    name: str
    numel: int
    expert: bool = False  # a routed expert's weight (replicated over expert-DP, not DP)
    ndim: int = 2  # 1: norm weights and biases
    # megatron-core LanguageModule.setup_embeddings_and_output_layer tags the word embedding
    # of the pre_process chunk and the output layer of the post_process chunk
    # (``is_embedding_or_output_parameter``); the MTP chunk's embedding copy from 0.18 on
    # (megatron_versions.MTP_EMBEDDING_TAGGED)
    embedding_or_output: bool = False
    # a linear layer's weight: its [out, in] shape, which the weight-gradient GEMM produces
    # (one expert's, for grouped experts held as one tensor); None for norms, biases,
    # embeddings and the router, whose gradients no linear layer computes
    linear: tuple[int, int] | None = None


@dataclass(frozen=True)
class RankPosition:
    """Where a rank sits in the grid (ranks within TP/DP share the parameter layout; so do
    EP ranks: each holds the same number of equally shaped local experts)."""

    tp_rank: int = 0
    pp_rank: int = 0


def layers_per_chunk(spec: TrainingSpec, pp_rank: int = 0) -> list[int]:
    """Decoder layers in each virtual chunk of pipeline stage ``pp_rank``
    (:func:`.config.chunk_layer_counts`, megatron-core's ``get_num_layers_to_build``)."""
    return chunk_layer_counts(spec.model, spec.parallel, pp_rank)


def _norm(prefix: str, size: int, normalization: str) -> list[ParamTensor]:
    out = [ParamTensor(f"{prefix}.weight", size, ndim=1)]
    if normalization == "LayerNorm":
        out.append(ParamTensor(f"{prefix}.bias", size, ndim=1))
    return out


def _linear(
    prefix: str, out_size: int, in_size: int, bias: bool, expert: bool = False
) -> list[ParamTensor]:
    """A (sharded) linear layer: ``weight [out, in]`` and optionally ``bias [out]``."""
    shape = (out_size, in_size)
    out = [ParamTensor(f"{prefix}.weight", out_size * in_size, expert=expert, linear=shape)]
    if bias:
        out.append(ParamTensor(f"{prefix}.bias", out_size, ndim=1, expert=expert))
    return out


def _attention(m: ModelSpec, tp: int, prefix: str) -> list[ParamTensor]:
    h, d = m.hidden_size, m.head_dim
    qkv_out = (m.num_attention_heads + 2 * m.query_groups) * d // tp
    out = _linear(f"{prefix}.linear_qkv", qkv_out, h, m.add_bias_linear or m.add_qkv_bias)
    if m.qk_layernorm:
        out += _norm(f"{prefix}.q_layernorm", d, m.normalization)
        out += _norm(f"{prefix}.k_layernorm", d, m.normalization)
    out += _linear(f"{prefix}.linear_proj", h, m.num_attention_heads * d // tp, m.add_bias_linear)
    return out


def _mla_attention(m: ModelSpec, tp: int, prefix: str) -> list[ParamTensor]:
    """``MLASelfAttention``: low-rank (down/up) query and key-value projections."""
    h, heads = m.hidden_size, m.num_attention_heads
    q_head = m.qk_head_dim + m.qk_pos_emb_head_dim
    down_tp = tp if m.transformer_impl == "local" else 1  # TE: TELinear, "duplicated"
    if m.q_lora_rank is None:
        out = _linear(f"{prefix}.linear_q_proj", heads * q_head // tp, h, False)
        if mla_fused_q_norm(m):  # 0.19+ TE: the query norm fused into linear_q_proj
            # TELayerNormColumnParallelLinear: layer_norm_weight [h] (and _bias for LayerNorm)
            parts = ("weight", "bias") if m.normalization == "LayerNorm" else ("weight",)
            out += [ParamTensor(f"{prefix}.linear_q_proj.layer_norm_{p}", h, ndim=1) for p in parts]
    else:
        out = _linear(f"{prefix}.linear_q_down_proj", m.q_lora_rank // down_tp, h, False)
        out += _linear(f"{prefix}.linear_q_up_proj", heads * q_head // tp, m.q_lora_rank, False)
    kv_down = (m.kv_lora_rank + m.qk_pos_emb_head_dim) // down_tp
    out += _linear(f"{prefix}.linear_kv_down_proj", kv_down, h, False)
    kv_up = heads * (m.qk_head_dim + m.v_head_dim) // tp
    out += _linear(f"{prefix}.linear_kv_up_proj", kv_up, m.kv_lora_rank, False)
    if m.qk_layernorm:  # q_layernorm only exists with the low-rank query
        if m.q_lora_rank is not None:
            out += _norm(f"{prefix}.q_layernorm", m.q_lora_rank, m.normalization)
        out += _norm(f"{prefix}.kv_layernorm", m.kv_lora_rank, m.normalization)
    out += _linear(f"{prefix}.linear_proj", h, heads * m.v_head_dim // tp, m.add_bias_linear)
    return out


def _mlp(
    m: ModelSpec, ffn: int, tp: int, prefix: str, bias: bool, expert: bool = False
) -> list[ParamTensor]:
    """``MLP`` with ``linear_fc1`` (doubled for GLU) and ``linear_fc2``, sharded ``tp`` ways."""
    fc1_out = ffn * (2 if m.gated_linear_unit else 1) // tp
    out = _linear(f"{prefix}.linear_fc1", fc1_out, m.hidden_size, bias, expert)
    fc2 = (m.hidden_size, ffn // tp)
    out.append(ParamTensor(f"{prefix}.linear_fc2.weight", fc2[0] * fc2[1], expert, linear=fc2))
    if bias:
        out.append(ParamTensor(f"{prefix}.linear_fc2.bias", m.hidden_size, expert, ndim=1))
    return out


def _moe(spec: TrainingSpec, prefix: str) -> list[ParamTensor]:
    """``MoELayer``: router, this EP rank's experts (ETP shards), shared experts (TP)."""
    m, p = spec.model, spec.parallel
    assert m.num_experts is not None
    h, ffn, etp = m.hidden_size, m.moe_ffn, p.expert_tp
    local = m.num_experts // p.ep
    router = _linear(f"{prefix}.router", m.num_experts, h, m.add_bias_linear)
    out = [replace(t, linear=None) for t in router]  # its GEMM is the router's own
    if grouped_gemm_experts(m):  # GroupedMLP: all local experts in two tensors (no bias)
        fc1 = ffn * (2 if m.gated_linear_unit else 1) // etp  # one expert's [out, in]
        out.append(
            ParamTensor(f"{prefix}.experts.weight1", local * fc1 * h, expert=True, linear=(fc1, h))
        )
        fc2 = (h, ffn // etp)
        numel = local * fc2[0] * fc2[1]
        out.append(ParamTensor(f"{prefix}.experts.weight2", numel, expert=True, linear=fc2))
    else:  # SequentialMLP: one MLP per local expert
        for j in range(local):
            name = f"{prefix}.experts.local_experts.{j}"
            out += _mlp(m, ffn, etp, name, m.add_bias_linear, expert=True)
    shared = m.moe_shared_expert_intermediate_size
    if shared is not None:
        out += _mlp(m, shared, p.tp, f"{prefix}.shared_experts", False)
    return out


def layer_params(spec: TrainingSpec, prefix: str = "layer", moe: bool = False) -> list[ParamTensor]:
    """One transformer layer's tensors on one tensor-parallel rank (``moe``: a MoE MLP)."""
    m, tp = spec.model, spec.parallel.tp
    out = _norm(f"{prefix}.input_layernorm", m.hidden_size, m.normalization)
    attention = _mla_attention if m.multi_latent_attention else _attention
    out += attention(m, tp, f"{prefix}.self_attention")
    out += _norm(f"{prefix}.pre_mlp_layernorm", m.hidden_size, m.normalization)
    if moe:
        out += _moe(spec, f"{prefix}.mlp")
    else:
        out += _mlp(m, m.ffn, tp, f"{prefix}.mlp", m.add_bias_linear)
    return out


def _embedding(spec: TrainingSpec, tag: str, tagged: bool) -> list[ParamTensor]:
    m, h = spec.model, spec.model.hidden_size
    words = m.vocab_size // spec.parallel.tp * h
    out = [ParamTensor(f"{tag}embedding.word_embeddings.weight", words, embedding_or_output=tagged)]
    if m.position_embedding_type == "learned_absolute":
        positions = m.max_position_embeddings or m.seq_length
        out.append(ParamTensor(f"{tag}embedding.position_embeddings.weight", positions * h))
    return out


def _mtp(spec: TrainingSpec, tag: str, moe: bool) -> list[ParamTensor]:
    """``MultiTokenPredictionBlock``: per depth, two norms, ``eh_proj`` ``[h / tp, 2h]``, a
    transformer layer and a final norm. The layer is built from the spec of the chunk's last
    decoder layer (``get_gpt_mtp_block_spec``: ``spec.layer_specs[-1]``); on a chunk without
    decoder layers Megatron-LM's ``gpt_builders`` uses ``_get_transformer_layer_spec``, a MoE
    layer when the model has experts (``moe``: which of the two)."""
    m, p = spec.model, spec.parallel
    h = m.hidden_size
    out: list[ParamTensor] = []
    for k in range(m.mtp_num_layers or 0):
        prefix = f"{tag}mtp.layers.{k}"
        out += _norm(f"{prefix}.enorm", h, m.normalization)
        out += _norm(f"{prefix}.hnorm", h, m.normalization)
        eh = (h // p.tp, 2 * h)
        out.append(ParamTensor(f"{prefix}.eh_proj.weight", eh[0] * eh[1], linear=eh))
        out += layer_params(spec, f"{prefix}.{mtp_inner_layer(m)}", moe)
        out += _norm(f"{prefix}.final_layernorm", h, m.normalization)
    return out


#: :func:`rank_params` by (model, parallel sizes, position), which are all it reads: the
#: planner estimates many recompute and optimizer variants of one layout. Small: one entry
#: holds every tensor of a rank.
_RANK_PARAMS: dict[tuple[ModelSpec, ParallelSpec, RankPosition], tuple[ParamTensor, ...]] = {}
_RANK_PARAMS_KEPT = 64


def rank_params(spec: TrainingSpec, pos: RankPosition) -> list[ParamTensor]:
    """Every parameter tensor the rank at ``pos`` holds, over all its virtual chunks (what
    each chunk builds besides its layers: :func:`.config.chunk_roles`)."""
    key = (spec.model, spec.parallel, pos)
    tensors = _RANK_PARAMS.get(key)
    if tensors is None:
        if len(_RANK_PARAMS) >= _RANK_PARAMS_KEPT:
            _RANK_PARAMS.clear()
        tensors = _RANK_PARAMS[key] = tuple(_build_rank_params(spec, pos))
    return list(tensors)


def _build_rank_params(spec: TrainingSpec, pos: RankPosition) -> list[ParamTensor]:
    m, p = spec.model, spec.parallel
    per_chunk = layers_per_chunk(spec, pos.pp_rank)
    chunks = len(per_chunk)
    out: list[ParamTensor] = []
    for chunk in range(chunks):
        roles = chunk_roles(m, p, pos.pp_rank, chunk)
        tag = f"chunk{chunk}." if chunks > 1 else ""
        if roles.embedding:  # MTP needs the embedding on its stage too (a tied copy)
            out += _embedding(spec, tag, tagged=embedding_tagged(m, roles.first, roles.mtp))
        start = chunk_layer_offset(m, p, pos.pp_rank, chunk)
        for i in range(start, start + per_chunk[chunk]):
            out += layer_params(spec, f"{tag}decoder.layers.{i}", m.is_moe_layer(i))
        if roles.final_norm:
            out += _norm(f"{tag}decoder.final_layernorm", m.hidden_size, m.normalization)
        if roles.mtp:
            end = start + per_chunk[chunk]
            moe = m.is_moe_layer(end - 1) if per_chunk[chunk] else m.num_experts is not None
            out += _mtp(spec, tag, moe)
        if roles.loss and not (m.tie_embeddings and roles.first):
            # with pp > 1 the last stage keeps its own tied copy (also with MTP)
            vocab_shard = m.vocab_size // p.tp
            out.append(
                ParamTensor(
                    f"{tag}output_layer.weight",
                    vocab_shard * m.hidden_size,
                    embedding_or_output=True,
                    linear=(vocab_shard, m.hidden_size),
                )
            )
    return out


def rank_param_count(spec: TrainingSpec, pos: RankPosition) -> int:
    return sum(t.numel for t in rank_params(spec, pos))
