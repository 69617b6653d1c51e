"""Exact per-rank parameter inventory of a megatron-core ``GPTModel`` (local layer spec).

Each entry is one parameter tensor as this rank holds it (tensor-parallel shard, pipeline
stage, virtual chunks), so both bytes and tensor counts follow from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from memscope.analysis.static.config import TrainingSpec


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor on one rank."""

    name: str
    numel: int


@dataclass(frozen=True)
class RankPosition:
    """Where a rank sits in the grid (ranks within TP/DP share the parameter layout)."""

    tp_rank: int = 0
    pp_rank: int = 0


def layers_per_chunk(spec: TrainingSpec) -> int:
    p = spec.parallel
    return spec.model.num_layers // (p.pp * (p.vpp or 1))


def _norm(prefix: str, size: int, normalization: str) -> list[ParamTensor]:
    out = [ParamTensor(f"{prefix}.weight", size)]
    if normalization == "LayerNorm":
        out.append(ParamTensor(f"{prefix}.bias", size))
    return out


def layer_params(spec: TrainingSpec, prefix: str = "layer") -> list[ParamTensor]:
    """One transformer layer's tensors on one tensor-parallel rank."""
    m, tp = spec.model, spec.parallel.tp
    h, d = m.hidden_size, m.head_dim
    qkv_out = (m.num_attention_heads + 2 * m.query_groups) * d // tp
    proj_in = m.num_attention_heads * d // tp
    fc1_out = m.ffn * (2 if m.gated_linear_unit else 1) // tp
    fc2_in = m.ffn // tp
    out = _norm(f"{prefix}.input_layernorm", h, m.normalization)
    out.append(ParamTensor(f"{prefix}.self_attention.linear_qkv.weight", qkv_out * h))
    if m.add_bias_linear or m.add_qkv_bias:
        out.append(ParamTensor(f"{prefix}.self_attention.linear_qkv.bias", qkv_out))
    if m.qk_layernorm:
        out += _norm(f"{prefix}.self_attention.q_layernorm", d, m.normalization)
        out += _norm(f"{prefix}.self_attention.k_layernorm", d, m.normalization)
    out.append(ParamTensor(f"{prefix}.self_attention.linear_proj.weight", h * proj_in))
    if m.add_bias_linear:
        out.append(ParamTensor(f"{prefix}.self_attention.linear_proj.bias", h))
    out += _norm(f"{prefix}.pre_mlp_layernorm", h, m.normalization)
    out.append(ParamTensor(f"{prefix}.mlp.linear_fc1.weight", fc1_out * h))
    if m.add_bias_linear:
        out.append(ParamTensor(f"{prefix}.mlp.linear_fc1.bias", fc1_out))
    out.append(ParamTensor(f"{prefix}.mlp.linear_fc2.weight", h * fc2_in))
    if m.add_bias_linear:
        out.append(ParamTensor(f"{prefix}.mlp.linear_fc2.bias", h))
    return out


def rank_params(spec: TrainingSpec, pos: RankPosition) -> list[ParamTensor]:
    """Every parameter tensor the rank at ``pos`` holds, over all its virtual chunks."""
    m, p = spec.model, spec.parallel
    chunks = p.vpp or 1
    per_chunk = layers_per_chunk(spec)
    out: list[ParamTensor] = []
    for chunk in range(chunks):
        first = pos.pp_rank == 0 and chunk == 0
        last = pos.pp_rank == p.pp - 1 and chunk == chunks - 1
        tag = f"chunk{chunk}." if chunks > 1 else ""
        if first:
            out.append(
                ParamTensor(
                    f"{tag}embedding.word_embeddings.weight", m.vocab_size // p.tp * m.hidden_size
                )
            )
            if m.position_embedding_type == "learned_absolute":
                positions = m.max_position_embeddings or m.seq_length
                out.append(
                    ParamTensor(
                        f"{tag}embedding.position_embeddings.weight", positions * m.hidden_size
                    )
                )
        start = (chunk * p.pp + pos.pp_rank) * per_chunk
        for i in range(per_chunk):
            out += layer_params(spec, f"{tag}decoder.layers.{start + i}")
        if last:
            out += _norm(f"{tag}decoder.final_layernorm", m.hidden_size, m.normalization)
            shared = m.tie_embeddings and first
            if not shared:  # with pp > 1 the last stage keeps its own tied copy
                out.append(
                    ParamTensor(f"{tag}output_layer.weight", m.vocab_size // p.tp * m.hidden_size)
                )
    return out


def rank_param_count(spec: TrainingSpec, pos: RankPosition) -> int:
    return sum(t.numel for t in rank_params(spec, pos))
