"""Activation memory of multi-latent attention (transformer/multi_latent_attention.py).

What one ``MLASelfAttention`` keeps for backward per microbatch, itemised, as
``get_query_key_value_tensors`` and ``forward`` of megatron-core 0.16.1 build it. Notation as
in :mod:`.activations` (``s`` sequence, ``S = s / sp`` the local tokens under sequence
parallelism, ``b`` micro batch, ``a`` heads per TP rank, ``e`` activation bytes) plus ``ql``
``q_lora_rank``, ``kl`` ``kv_lora_rank``, ``pe`` ``qk_pos_emb_head_dim``, ``qk``
``qk_head_dim``, ``v`` ``v_head_dim``.

- **Down projections.** Both take the input norm's output (counted with the layer's norm
  outputs). Transformer Engine's spec builds them as ``TELinear`` with ``parallel_mode=
  "duplicated"``: whole weights, local ``[S, b, ql]`` / ``[S, b, kl + pe]`` outputs. The local
  spec builds ``ColumnParallelLinear``: under TP the output is sharded, all-gathered to the
  whole latent width and scattered back to ``S`` rows under sequence parallelism.
- **Latent norms** (``q_layernorm``/``kv_layernorm``, present with ``qk_layernorm``). TE's spec
  fuses each into the up projection (``TELayerNormColumnParallelLinear``): it keeps its input,
  the normalised output and fp32 statistics over ``S b`` rows. The local spec runs a separate
  norm (torch ``LayerNorm``: its input and 2 statistics; torch's composite ``RMSNorm``: an fp32
  copy of its input and the fp32 normalised product, 1 statistic) whose output the up
  projection keeps. Without the norm the up projection keeps its input directly.
- **The kv latent.** ``kv_compressed`` is a split view of ``kv_combined``: whatever keeps the view
  keeps the whole ``kl + pe`` storage (local spec without SP). Under SP the local spec's scatter
  of the split view copies it (``S b kl``); TE takes a contiguous ``kl``-wide copy (assumption:
  TE's linear layers make non-contiguous inputs contiguous before saving them).
- **Fused query norm** (megatron-core 0.19+, Transformer Engine, ``qk_layernorm`` without
  ``q_lora_rank``: ``mla_qk_norm_config.py`` ``QKNormConfigResolver``). ``linear_q_proj`` is
  ``TELayerNormColumnParallelLinear`` over the hidden input: the normalised ``[S, b, h]`` and
  fp32 statistics over ``S b`` rows besides that input (already kept). It runs inside
  ``mla_up_proj``'s checkpoint. Up to 0.18 the query was not normalised.
- **Up projections and RoPE.** Their outputs are split, rotated and concatenated into new
  ``query``/``key`` (``[s, b, a, qk + pe]``) and a contiguous ``value`` (``[s, b, a, v]``); the
  up-projection outputs themselves are not kept. Unfused RoPE (rope_utils.py
  ``_apply_rotary_pos_emb_bshd``) keeps the activation-dtype cos and sin of each of its two
  calls (``4 s pe e``); the fused MLA RoPE keeps only the shared tables.
- **Core attention** keeps ``query``, ``key``, ``value`` and ``linear_proj`` keeps the
  ``[s, b, a v]`` context (the scores and softmax statistics are counted by
  :func:`.activations.layer_saved` as for any attention).

``mla_up_proj`` recompute (``recompute_up_proj``: ``CheckpointWithoutOutput`` around
``qkv_up_proj_and_rope_apply``, outputs discarded once the core attention has run) drops the
query/key/value, the RoPE tables and what the up projections (with TE's fused norms) keep;
the checkpoint keeps its inputs instead: ``q_compressed``, ``kv_compressed`` (a view: the whole
``kv_combined`` storage on TE, where the view is not copied) and ``k_pos_emb``, all-gathered to
``[s, b, pe]`` under sequence parallelism.

Measured on CPU for the local spec on one rank and under TP 2 without sequence parallelism
(``tests/test_static_mla_activations.py``); the TE terms are read from the code above and not
measured here (no TE on CPU). Under sequence parallelism the local spec's CPU run holds one
more ``[s, b, h]`` per call that no Python tensor and no saved tensor references: the size of
the down projections' all-gathered input, consistent with gloo's all-gather staging buffer
(a CPU-collective artifact, not counted); that case is therefore not in the exact test.
"""

from __future__ import annotations

from dataclasses import dataclass

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.megatron_versions import mla_fused_q_norm

FP32 = 4


@dataclass(frozen=True)
class _Shape:
    s: int  # sequence per rank (before the SP split)
    rows: int  # S * b: local tokens
    b: int
    a: int  # heads per TP rank
    e: int
    stats: int  # fp32 statistics per norm row: LayerNorm 2, RMSNorm 1
    te: bool
    sp: bool  # sequence parallel with TP > 1
    tp: int


def _shape(spec: TrainingSpec, s: int, b: int, a: int, sp: int, e: int) -> _Shape:
    m = spec.model
    return _Shape(
        s=s,
        rows=s // sp * b,
        b=b,
        a=a,
        e=e,
        stats=2 if m.normalization == "LayerNorm" else 1,
        te=m.transformer_impl == "transformer_engine",
        sp=sp > 1,
        tp=spec.parallel.tp,
    )


def _latent_norm(spec: TrainingSpec, x: _Shape, width: int, kept_input: int) -> int:
    """Bytes a latent norm and the up projection after it keep for ``width``-wide latents;
    ``kept_input``: the bytes the norm's (or, without a norm, the projection's) input keeps."""
    m = spec.model
    if not m.qk_layernorm:
        return kept_input
    out = x.rows * width * x.e  # the normalised latent the up projection keeps
    stats = x.stats * x.rows * FP32
    if x.te or m.normalization != "RMSNorm":
        return kept_input + out + stats
    return 2 * FP32 * x.rows * width + out + stats  # composite RMSNorm: fp32 copies


def _kv_input(spec: TrainingSpec, x: _Shape) -> int:
    """What keeping ``kv_compressed`` (the kv norm's or up projection's input) holds."""
    m = spec.model
    kl, pe = m.kv_lora_rank, m.qk_pos_emb_head_dim
    if x.te or (x.sp and x.tp > 1):
        return x.rows * kl * x.e  # a contiguous copy of the split view
    # local: a view of kv_combined ([s, b, kl + pe], gathered to the whole width under TP)
    return x.s * x.b * (kl + pe) * x.e


def _q_input(spec: TrainingSpec, x: _Shape) -> int:
    """What keeping ``q_compressed`` holds (0 without a query latent)."""
    ql = spec.model.q_lora_rank
    if not ql:
        return 0
    if x.te or x.tp == 1:
        return x.rows * ql * x.e
    return x.s * x.b * ql * x.e  # local under TP: a chunk view of the gathered latent


def mla_saved(spec: TrainingSpec, s: int, b: int, a: int, sp: int, e: int) -> dict[str, int]:
    """What one MLA self-attention keeps for backward per microbatch, itemised (without the
    input norm's output and the attention scores/statistics)."""
    m = spec.model
    x = _shape(spec, s, b, a, sp, e)
    qk, v, pe = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim, m.qk_pos_emb_head_dim
    heads = s * b * a * e
    items = {
        "attention_qkv": heads * (2 * qk + v),
        "attention_context": heads * v,
        "mla_kv_latent": _latent_norm(spec, x, m.kv_lora_rank, _kv_input(spec, x)),
    }
    if m.q_lora_rank:
        items["mla_q_latent"] = _latent_norm(spec, x, m.q_lora_rank, _q_input(spec, x))
    elif mla_fused_q_norm(m):
        # 0.19+ TE (mla_qk_norm_config.py QKNormConfigResolver): linear_q_proj is
        # TELayerNormColumnParallelLinear; it keeps its input (the layer's input-norm output,
        # counted there), the normalised [S, b, h] output and fp32 statistics per row
        items["mla_q_norm"] = x.rows * m.hidden_size * x.e + x.stats * x.rows * FP32
    if not m.rope_fusion:
        items["rope_cos_sin"] = 2 * 2 * s * pe * e
    return items


def mla_up_proj_discarded(spec: TrainingSpec, s: int, b: int, a: int, sp: int, e: int) -> int:
    """Bytes ``recompute_modules`` ``mla_up_proj`` drops per layer (see the module docstring)."""
    m = spec.model
    x = _shape(spec, s, b, a, sp, e)
    items = mla_saved(spec, s, b, a, sp, e)
    dropped = items["attention_qkv"] + items.get("rope_cos_sin", 0)
    if x.te:  # the up projections (and the norms fused into them) are inside the checkpoint
        dropped += items["mla_kv_latent"] + items.get("mla_q_latent", 0)
        dropped += items.get("mla_q_norm", 0)  # linear_q_proj runs inside the checkpoint
        kept = _q_input(spec, x) + x.rows * (m.kv_lora_rank + m.qk_pos_emb_head_dim) * e
    else:  # local: the norms run before the checkpoint; their outputs stay as its inputs
        kept = 0
        if m.qk_layernorm and m.normalization == "RMSNorm" and not x.sp:
            # the composite RMSNorm copies its input, so only k_pos_emb (a view) now keeps
            # kv_combined alive
            kept = s * b * (m.kv_lora_rank + m.qk_pos_emb_head_dim) * e
    if x.sp:
        kept += s * b * m.qk_pos_emb_head_dim * e  # k_pos_emb gathered over the sequence
    return dropped - kept
