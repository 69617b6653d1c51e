"""Activation memory of one rank at its high-water mark (megatron-core local spec, unfused).

The model counts the tensors autograd keeps for backward in megatron-core's local-spec
transformer layer (``DotProductAttention`` with the ``[b, a, s, s]`` scores materialised,
unfused bias/activation/dropout), tensor by tensor, and the working set of the backward pass
on top of them. It was derived from megatron-core 0.16 and is checked against real CPU runs
measured with the exact storage backend (``tools/bench_static_accuracy.py``).

The peak of a pipeline stage is reached while the backward of one microbatch runs and the
other in-flight microbatches (1F1B warm-up) still hold their saved tensors. Inside that
backward, three moments compete: the output layer's weight gradient (last stage), the MLP
activation backward and the attention-core backward, each of a layer whose later siblings
have already released their tensors. :func:`activation_estimate` walks the chunk's layers in
backward order and keeps the largest.

Notation: ``s`` sequence per rank (``seq / cp``), ``b`` micro batch, ``h`` hidden, ``a``
attention heads per TP rank, ``d`` head dim, ``f`` FFN width per TP rank, ``V`` padded vocab
per TP rank, ``e`` activation bytes, ``sp`` = TP size under sequence parallelism else 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from memscope.analysis.static.config import TrainingSpec, chunk_roles
from memscope.analysis.static.distillation import distillation_extras, distillation_moments
from memscope.analysis.static.fp8 import quantized_saved
from memscope.analysis.static.fsdp import InFlight
from memscope.analysis.static.megatron_versions import dense_mlp_tensors, logits_shift_copy
from memscope.analysis.static.mla import mla_saved, mla_up_proj_discarded
from memscope.analysis.static.moe import (
    dispatcher_held,
    expert_offload_bytes,
    moe_act_discarded,
    moe_global_buffer,
    moe_layer_saved,
    routed_rows,
)
from memscope.analysis.static.offload import fine_grained_moved, reloaded_duplicate
from memscope.analysis.static.params import ParamTensor
from memscope.analysis.static.pipeline_layout import ChunkRoles
from memscope.analysis.static.rl_loss import rl_loss_extras, rl_loss_moments
from memscope.analysis.static.terms import optimizer_shards

FP32 = 4
INT64 = 8
# Vocab-parallel cross entropy keeps, per token: the int64 masked target, the bool target
# mask and three fp32 [s, b] tensors (predicted logit, sum of exps, loss).
CE_BYTES_PER_TOKEN = INT64 + 1 + 3 * FP32


@dataclass(frozen=True)
class Dims:
    """Per-rank tensor sizes of one microbatch (see the module notation)."""

    s: int
    b: int
    h: int
    a: int
    g: int  # query groups (key/value heads) per TP rank
    d: int
    f: int
    vocab: int
    e: int
    sp: int
    norm_stats: int  # fp32 statistics tensors per norm: LayerNorm 2 (mean, rstd), RMSNorm 1
    mask_bytes: int  # per dropout-mask element: bool on CUDA, the activation dtype on CPU

    @property
    def hidden(self) -> int:
        """One ``[s/sp, b, h]`` activation."""
        return self.s // self.sp * self.b * self.h * self.e

    @property
    def heads(self) -> int:
        """One ``[s, b, a, d]`` per-head activation (query, key, value or context)."""
        return self.s * self.b * self.a * self.d * self.e

    @property
    def kv_heads(self) -> int:
        """One ``[s, b, g, d]`` key or value at its query-group heads (no GQA repeat)."""
        return self.s * self.b * self.g * self.d * self.e

    @property
    def scores(self) -> int:
        """One ``[b, a, s, s]`` attention-score tensor."""
        return self.b * self.a * self.s * self.s * self.e

    @property
    def ffn(self) -> int:
        """One ``[s, b, f]`` MLP activation."""
        return self.s * self.b * self.f * self.e

    @property
    def logits(self) -> int:
        """The ``[s, b, V/t]`` logits at the activation dtype."""
        return self.s * self.b * self.vocab * self.e

    @property
    def stats(self) -> int:
        """Statistics of one norm over ``[s/sp, b]`` tokens."""
        return self.norm_stats * self.s // self.sp * self.b * FP32

    @property
    def hidden_mask(self) -> int:
        """A dropout mask over one ``[s/sp, b, h]`` activation."""
        return self.hidden // self.e * self.mask_bytes

    @property
    def scores_mask(self) -> int:
        """A dropout mask over the attention probabilities."""
        return self.scores // self.e * self.mask_bytes


def dims(spec: TrainingSpec) -> Dims:
    """Tensor sizes of ``spec`` as seen by one rank."""
    m, p = spec.model, spec.parallel
    return Dims(
        s=m.seq_length // p.cp,
        b=spec.micro_batch_size,
        h=m.hidden_size,
        a=m.num_attention_heads // p.tp,
        g=m.query_groups // p.tp,
        d=m.head_dim,
        f=m.ffn // p.tp,
        vocab=m.vocab_size // p.tp,
        e=spec.precision.param_bytes,
        sp=p.tp if p.sequence_parallel else 1,
        norm_stats=2 if m.normalization == "LayerNorm" else 1,
        mask_bytes=spec.precision.param_bytes if spec.device == "cpu" else 1,
    )


def fused_softmax(spec: TrainingSpec, x: Dims) -> bool:
    """Whether unfused attention runs megatron's fused scale-mask-softmax CUDA kernel.

    megatron/core/fusions/fused_softmax.py ``FusedScaleMaskSoftmax.is_kernel_available``:
    ``masked_softmax_fusion`` on, 16-bit input, ``16 < sk <= 4096``, ``sq`` and ``sk``
    multiples of 4 and ``b * heads`` a multiple of 4 (the kernel's batch-per-block
    condition is not checked here). The kernel keeps only the softmax output and computes
    its gradient in place; the causal mask is applied inside it."""
    return (
        not spec.flash_attention
        and spec.device == "cuda"
        and spec.model.masked_softmax_fusion
        and x.e == 2
        and 16 < x.s <= 4096
        and x.s % 4 == 0
        and (x.b * x.a) % 4 == 0
    )


def layer_saved(spec: TrainingSpec, x: Dims) -> dict[str, int]:
    """What one layer keeps for backward per microbatch, itemised (without its input).

    ``layer_output`` is the output kept by the next consumer (next layer's input norm, the
    final norm); callers drop it where nothing keeps it (a pipeline stage's last output).
    """
    m = spec.model
    per_ffn = dense_mlp_tensors(m)
    # flash/fused attention (TE's FusedAttention / FlashAttention, megatron's flash path)
    # keeps key and value at num_query_groups heads; the unfused path repeats them to ``a``
    qkv = x.heads + 2 * x.kv_heads if spec.flash_attention else 3 * x.heads
    if not spec.flash_attention and spec.recomputes("core_attn") and x.a != x.g:
        qkv = gqa_checkpoint_inputs(spec, x)
    items = {
        "norm_outputs": 2 * x.hidden,  # inputs of linear_qkv and linear_fc1
        "norm_statistics": 2 * x.stats,
        "attention_residual": x.hidden,  # input of the pre-MLP norm
        "layer_output": x.hidden,
        "attention_qkv": qkv,  # query, key, value
        "attention_context": x.heads,  # input of linear_proj
        # GeLU: fc1 output (+bias) and the activation; SwiGLU: the 2f-wide fc1 output, silu,
        # the linear branch (+offset) and their product
        "mlp": per_ffn * x.ffn,
    }
    if m.position_embedding_type == "rope" and not m.rope_fusion and not m.multi_latent_attention:
        # megatron/core/models/common/embeddings/rope_utils.py _apply_rotary_pos_emb_bshd:
        # each call (query, key) casts cos and sin of the [s, 1, 1, d] frequencies to the
        # activation dtype and the products keep them; the fused kernel keeps only the
        # shared frequencies
        items["rope_cos_sin"] = 2 * 2 * x.s * x.d * x.e
    if m.qk_layernorm and not m.multi_latent_attention:
        items["qk_layernorm"] = qk_layernorm_saved(spec, x)
    if m.multi_latent_attention:  # query/key/value, context, latents, RoPE tables (mla.py)
        items.update(mla_saved(spec, x.s, x.b, x.a, x.sp, x.e))
    if m.num_experts is not None:  # router, dispatcher, experts, shared experts (moe.py)
        items["mlp"] = sum(moe_layer_saved(spec, x.s, x.b, x.sp, x.e).values())
    if spec.flash_attention:
        items["attention_softmax_lse"] = x.b * x.a * x.s * FP32
    elif spec.recomputes("core_attn"):
        items["attention_mask_recompute"] = FP32  # the checkpoint's saved RNG/shape scalar
    else:
        items["attention_scores"] = x.scores  # softmax output
        if spec.model.attention_softmax_in_fp32 and x.e < FP32 and not fused_softmax(spec, x):
            # megatron/core/fusions/fused_softmax.py forward_torch_softmax: the softmax runs
            # on an fp32 copy and keeps its fp32 output; the cast back to 16 bits is kept only
            # when the context bmm takes it directly (no attention dropout: with dropout the
            # bmm keeps the dropout output instead). Measured on CPU in bf16.
            fp32_probs = x.scores // x.e * FP32
            items["attention_scores"] = fp32_probs + (x.scores if m.attention_dropout == 0 else 0)
        if m.attention_dropout > 0:
            items["attention_dropout"] = x.scores + x.scores_mask  # output (bmm input), mask
    if m.hidden_dropout > 0:
        items["residual_dropout_masks"] = 2 * x.hidden_mask
    quantized_saved(spec, items, x.ffn, x.e)  # FP8/FP4 GEMM inputs (fp8.py)
    return items


def qk_layernorm_saved(spec: TrainingSpec, x: Dims) -> int:
    """What ``qk_layernorm``'s two per-head norms keep (megatron/core/transformer/attention.py:
    ``q_layernorm`` / ``k_layernorm`` over ``[s, b, heads, d]`` after the qkv split, before
    RoPE; the sequence is already gathered under SP).

    Transformer Engine's ``TENorm`` keeps a contiguous copy of its input and fp32 statistics
    per row (transformer_engine/pytorch/ops/basic/layer_norm.py, rmsnorm.py). The local spec's
    torch ``LayerNorm`` keeps its input as passed: the query (a copy under GQA, a view of the
    fused qkv output otherwise) and the key, always a strided view that keeps the whole fused
    ``[s, b, (a + 2g) d]`` output alive; torch's composite ``RMSNorm`` keeps an fp32 copy and
    its fp32 normalised output instead. The local formulas are measured on CPU (bf16)."""
    rows = x.s * x.b * (x.a + x.g)
    stats = x.norm_stats * FP32 * rows
    if spec.model.transformer_impl == "transformer_engine":
        return x.heads + x.kv_heads + stats
    if spec.model.normalization == "RMSNorm":
        return (x.heads + x.kv_heads) // x.e * 2 * FP32 + stats
    fused_qkv = x.heads + 2 * x.kv_heads
    return fused_qkv + (x.heads if x.a != x.g else 0) + stats


# Per token, what each MTP depth's loss keeps besides its fp32 softmax: the int64 masked target
# and bool target mask of the vocab-parallel cross entropy, the fp32 loss mask and the fp32
# scaled loss ``MTPLossAutoScaler`` keeps (megatron/core/transformer/multi_token_prediction.py).
MTP_LOSS_BYTES_PER_TOKEN = INT64 + 1 + FP32 + FP32


def mtp_saved(spec: TrainingSpec, x: Dims, layer_total: int) -> dict[str, int]:
    """What multi-token prediction keeps per microbatch on the last stage (its last chunk).

    megatron/core/transformer/multi_token_prediction.py: each of the ``mtp_num_layers``
    depths embeds the tokens shifted by one (the embedding keeps the ids), normalises that
    embedding and the previous hidden states (``enorm``/``hnorm`` keep their inputs and
    statistics), concatenates them to ``[s, b, 2h]`` (kept by ``eh_proj``), runs one transformer
    layer built from the decoder's last-layer spec (kept like a decoder layer, its input
    included) and a final norm. The block concatenates the main and every depth's output along
    the sequence, and the output layer keeps that concatenation (one more ``[s, b, h]`` per
    depth). Each depth's loss keeps its fp32 softmax (or the logits under TE's fused cross
    entropy) and a few per-token tensors. Under sequence parallelism the scatter after
    ``eh_proj`` is a view of the gathered sequence, so the layer's input is kept whole.
    Measured on CPU (megatron-core 0.16.1, local spec, bf16): exact for held bytes.
    Full recompute checkpoints each depth's projection and layer: only their input is kept."""
    depth = spec.model.mtp_num_layers or 0
    positions = spec.model.position_embedding_type == "learned_absolute"
    ids = x.s * x.b * INT64 * (2 if positions else 1)
    layer = layer_total if spec.recompute != "full" else x.hidden
    hidden = 6 * x.hidden + 3 * x.stats + ids
    if x.sp > 1:
        hidden += x.s * x.b * x.h * x.e - x.hidden
    return {
        "mtp_layers": depth * (layer + hidden),
        "mtp_cross_entropy": depth
        * (cross_entropy_saved(spec, x) + x.s * x.b * MTP_LOSS_BYTES_PER_TOKEN + FP32),
    }


def recompute_discarded(spec: TrainingSpec, x: Dims, saved: dict[str, int]) -> dict[str, int]:
    """Bytes of one layer's saved tensors (``saved``: :func:`layer_saved`) that selective
    recompute of each ``recompute_modules`` entry besides ``core_attn`` (already applied by
    :func:`layer_saved`) drops until that layer's backward recomputes them.

    * ``layernorm`` (transformer/transformer_layer.py: ``CheckpointWithoutOutput`` around
      ``input_layernorm`` and ``pre_mlp_layernorm``, outputs discarded after use): the norms'
      outputs and statistics. Transformer Engine's spec fuses the norms into the next linear
      layer (``IdentityOp``): nothing for a dense layer, the pre-MLP norm of a MoE layer and
      the input norm of MLA (models/gpt/gpt_layer_specs.py: MLA's down projections are plain
      ``TELinear``, so ``input_layernorm`` is a separate ``TENorm``).
    * ``mlp`` (transformer_layer.py ``_forward_mlp``: ``tensor_parallel.checkpoint(self.mlp,
      ...)`` for dense layers only): everything the MLP keeps; its input, the norm output,
      stays (local spec). Transformer Engine's spec fuses the pre-MLP norm into fc1, so the
      checkpoint's input is the residual and the norm's output and statistics go too.
    * ``moe`` (transformer/moe/moe_layer.py ``moe_layer_recompute``): the whole MoE MLP
      (router, dispatcher, experts, shared experts) but what its token dispatcher holds
      through its attributes, set inside the checkpoint and kept (:func:`.moe.dispatcher_held`).
    * ``moe_act`` (transformer/moe/experts.py ``activation_recompute``): the experts'
      activation outputs (:func:`.moe.moe_act_discarded`).
    * ``shared_experts`` (moe_layer.py ``shared_experts_recompute``): the shared experts.
    * ``mla_up_proj`` (transformer/multi_latent_attention.py ``recompute_up_proj``,
      output-discarding): the up-projected query/key/value.
    """
    m = spec.model
    if spec.recompute != "selective":
        return {}
    moe = m.num_experts is not None
    out: dict[str, int] = {}
    if spec.recomputes("layernorm"):
        norms = 2 if m.transformer_impl == "local" else int(moe) + int(m.multi_latent_attention)
        out["layernorm"] = norms * (saved["norm_outputs"] + saved["norm_statistics"]) // 2
    if spec.recomputes("mlp") and not moe:
        out["mlp"] = saved["mlp"]
        if m.transformer_impl == "transformer_engine":
            # the pre-MLP norm is fused into fc1 (IdentityOp before it), so the checkpoint's
            # input is the residual and fc1's normalised input and statistics are inside it
            out["mlp"] += (saved["norm_outputs"] + saved["norm_statistics"]) // 2
    if moe and spec.recomputes("moe"):
        out["moe"] = saved["mlp"] - dispatcher_held(spec, x.s, x.b, x.sp, x.e)
    elif moe:
        parts = moe_layer_saved(spec, x.s, x.b, x.sp, x.e)
        if spec.recomputes("moe_act"):
            out["moe_act"] = moe_act_discarded(spec, x.s, x.b, x.sp, x.e)
        if spec.recomputes("shared_experts"):
            out["shared_experts"] = parts.get("moe_shared_experts", 0)
    if spec.recomputes("mla_up_proj") and m.multi_latent_attention:
        out["mla_up_proj"] = mla_up_proj_discarded(spec, x.s, x.b, x.a, x.sp, x.e)
    return out


def offloaded_layers(spec: TrainingSpec) -> int:
    """Decoder layers whose activations ``cpu_offloading`` moves to host memory.

    megatron/core/transformer/transformer_block.py runs every layer inside Transformer
    Engine's ``get_cpu_offload_context(cpu_offloading, cpu_offloading_num_layers, num_layers,
    cpu_offloading_activations, ...)``: the first ``cpu_offloading_num_layers`` layers'
    saved tensors go to the host during the forward and come back one layer ahead in the
    backward. TE offloads only tensors its own modules mark for it, so the local spec
    offloads nothing (assumption, TE's offload handler is not in megatron-core)."""
    if not spec.cpu_offloading or not spec.cpu_offloading_activations:
        return 0
    if spec.model.transformer_impl != "transformer_engine":
        return 0
    return spec.cpu_offloading_num_layers


def dropped_before_offload(
    spec: TrainingSpec, saved: dict[str, int], discarded: dict[str, int]
) -> dict[str, int]:
    """The saved items (:func:`layer_saved`) that a selective recompute drops
    (``discarded``: :func:`recompute_discarded`) and a fine-grained offload group would save:
    they leave the GPU once, not twice. ``mla_up_proj`` drops the up-projected query/key/value
    (``core_attn``'s group); ``layernorm`` drops the input norm's output, ``linear_qkv``'s
    input (``qkv_linear``'s group), where that norm is not fused into the linear (the local
    spec; MLA's separate ``TENorm``)."""
    out: dict[str, int] = {}
    if "mla_up_proj" in discarded:
        out["attention_qkv"] = saved["attention_qkv"]
    if "layernorm" in discarded and (
        spec.model.transformer_impl == "local" or spec.model.multi_latent_attention
    ):
        out["norm_outputs"] = saved["norm_outputs"]  # qkv_linear moves its input half
    return out


def offloadable_bytes(saved: dict[str, int]) -> int:
    """Of one layer's saved tensors, those TE's offload context moves (assumption: all but
    megatron's own bias-dropout-add masks, which no TE module saves)."""
    return sum(saved.values()) - saved.get("residual_dropout_masks", 0)


def attention_backward_work(
    spec: TrainingSpec, x: Dims, saved: dict[str, int], output_stored: bool
) -> int:
    """Working set at the attention-core backward of a layer, relative to its saved set.

    Released by then: everything the layer saved after the attention core. Without attention
    dropout the high-water mark is the masked-fill of the score gradient: the incoming
    gradient, the value gradient and four score-sized tensors (probability and score
    gradients, the masked-fill result, the flat buffer the view's backward zero-fills) are
    alive and the softmax output is gone. With dropout it is the probability gradient
    (``bmm`` backward), next to the context and value gradients, probabilities still alive,
    or the softmax backward where that holds more (:func:`torch_softmax_backward`: the fp32
    upcast, or on CUDA its temporary).
    """
    released = saved["norm_outputs"] // 2 + saved["norm_statistics"] // 2  # pre-MLP norm
    released += sum(
        saved.get(k, 0)
        for k in ("attention_context", "attention_residual", "mlp", "residual_dropout_masks")
    )
    released += saved["layer_output"] if output_stored else 0
    if spec.flash_attention:
        return x.hidden + cp_attention_backward(spec, x) - released
    upcast = torch_softmax_backward(spec, x, saved)
    if "attention_dropout" in saved:
        return x.hidden + max(2 * x.heads + x.scores, upcast) - released
    if fused_softmax(spec, x):  # probability gradient, softmax backward in place on it
        return x.hidden + 2 * x.heads + x.scores - released
    work = x.hidden + max(x.heads + 4 * x.scores - saved.get("attention_scores", 0), upcast)
    if spec.recomputes("core_attn"):
        # megatron/core/tensor_parallel/random.py CheckpointFunction.backward holds the
        # output gradient it was handed (``args``) and the recomputed output (``outputs``)
        # until ``torch.autograd.backward`` returns
        work += 2 * x.heads
        work += gqa_recomputed_copies(spec, x)
    return work - released


def torch_softmax_backward(spec: TrainingSpec, x: Dims, saved: dict[str, int]) -> int:
    """``torch.nn.Softmax``'s backward in unfused attention (neither flash attention nor
    megatron's fused kernel), relative to the layer's saved set; 0 on any other path.

    megatron/core/fusions/fused_softmax.py ``forward_torch_softmax`` runs the scale, the mask
    and the softmax in fp32 on an ``input.float()`` copy when ``attention_softmax_in_fp32``
    is set on 16-bit scores, and casts the probabilities back to 16 bits; else in the scores'
    own dtype. Going backward, the probability gradient reaches the softmax backward (in
    fp32 through the cast's backward), which takes it with its saved output and returns the
    score gradient: three softmax-sized tensors, plus on CUDA a fourth
    (:func:`softmax_backward_temporaries`). By then the dropout's saved output and mask, and
    with the upcast the 16-bit probabilities the context ``bmm`` kept, are freed; the value
    gradient is alive. The upcast path is measured on CPU in bf16
    (``tests/test_static_bf16_attention_measured.py``)."""
    if spec.flash_attention or fused_softmax(spec, x):
        return 0
    upcast = spec.model.attention_softmax_in_fp32 and x.e < FP32
    softmax = x.scores // x.e * FP32 if upcast else x.scores
    tensors = 3 + softmax_backward_temporaries(spec)
    kept = saved.get("attention_dropout", 0)
    if upcast:  # the fp32 output is one of the three; the saved probabilities go
        kept += saved.get("attention_scores", 0)
    elif "attention_scores" in saved:  # the output is the saved set's (not under recompute)
        tensors -= 1
    return x.heads + tensors * softmax - kept


def softmax_backward_temporaries(spec: TrainingSpec) -> int:
    """Softmax-sized tensors torch's softmax backward allocates besides its result.

    CUDA: ``softmax_backward_cuda_out`` (aten/src/ATen/native/cuda/SoftMax.cu) computes
    ``Tensor tmp = grad * output`` and hands it to the kernel: one tensor of the gradient's
    size and dtype, alive with the result. The CPU kernel (native/cpu/SoftMaxKernel.cpp)
    reads the gradient and the output directly: none. Confirmed on the first GPU pass: the
    three attention-backward peaks (4096 tokens; selective and full recompute) were one fp32
    score tensor above an estimate that is exact on the CPU at the same shapes."""
    return 1 if spec.device == "cuda" else 0


def softmax_output_saved_twice(spec: TrainingSpec, x: Dims) -> int:
    """Bytes of the one attention tensor that two autograd nodes save (unfused attention).

    Without attention dropout the context ``bmm`` takes the softmax output itself and saves
    it, and the softmax saves the same tensor for its backward: megatron's and Transformer
    Engine's fused scale-mask-softmax ``autograd.Function``s (megatron/core/fusions/
    fused_softmax.py, transformer_engine/pytorch/attention/dot_product_attention/softmax.py
    at TE 4329ff84, the rev Megatron-LM d98e8a64 pins:
    ``ctx.save_for_backward(softmax_results, ...)``) and ``torch.softmax`` (its backward uses
    the output) alike; then ``torch.bmm(attention_probs, value)`` (dot_product_attention.py
    ``DotProductAttention.forward``, TE backends.py ``UnfusedDotProductAttention``). With an
    fp32 softmax on 16-bit scores the ``bmm`` keeps the cast copy instead, and with dropout
    the dropout's output: two different tensors. 0 where no scores are kept."""
    if spec.flash_attention or spec.recomputes("core_attn") or spec.model.attention_dropout > 0:
        return 0
    upcast = spec.model.attention_softmax_in_fp32 and x.e < FP32 and not fused_softmax(spec, x)
    return 0 if upcast else x.scores


def gqa_checkpoint_inputs(spec: TrainingSpec, x: Dims) -> int:
    """What ``core_attn`` recompute's checkpoint keeps of query, key and value (unfused
    attention) when the model groups its keys and values (``num_query_groups`` < heads).

    megatron/core/transformer/attention.py ``SelfAttention.get_query_key_value_tensors``
    splits the fused ``linear_qkv`` output into views and reshapes the query from
    ``[s, b, g, a/g d]`` to ``[s, b, a, d]``: a copy when ``g > 1`` (the grouped layout's
    strides cannot merge), a view when ``g == 1``. ``tensor_parallel.checkpoint`` saves its
    inputs (random.py ``CheckpointFunction.forward``): the key and value views keep the whole
    fused ``[s, b, (a + 2g) d]`` output, and the query its copy. Without recompute the core
    attention keeps the query and the key and value repeated to ``a`` heads instead."""
    fused = x.heads + 2 * x.kv_heads
    return fused + (x.heads if x.g > 1 else 0)


def gqa_recomputed_copies(spec: TrainingSpec, x: Dims) -> int:
    """What the recomputed core attention of a grouped-query model (unfused) adds at its
    backward's high-water mark beside the checkpoint's tensors.

    megatron/core/transformer/dot_product_attention.py ``DotProductAttention.forward``:
    ``key.repeat_interleave`` to ``a`` heads (kept by ``baddbmm`` until its backward; the
    repeated value is kept by ``bmm`` and freed by its backward, before the score
    gradient's high-water mark) and, when ``g == 1``, ``query.reshape(sq, b * np, hn)`` on
    the query view (a copy, kept by ``baddbmm``; with ``g > 1`` the query arrives as a
    contiguous copy and the reshape is a view)."""
    if x.a == x.g or spec.model.multi_latent_attention:
        return 0
    return x.heads + (x.heads if x.g == 1 else 0)


def cp_attention_backward(spec: TrainingSpec, x: Dims) -> int:
    """Gradient buffers of flash/fused attention's backward (Transformer Engine).

    Without context parallelism: dq at the query heads, dk and dv at the query-group heads.
    With it, transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
    (read, not measured here): ``p2p`` (and ``a2a+p2p``) double-buffers the packed K/V chunk
    and its gradient while it circulates (four ``[2, s/cp, b, g, d]`` buffers) next to the
    accumulated dq and one step's dq/dk/dv; ``all_gather`` re-gathers K and V over the whole
    sequence and keeps full-length dK/dV before the reduce-scatter; ``a2a`` keeps the
    all-to-all copies of the gradients beside them."""
    own = x.heads + 2 * x.kv_heads
    cp = spec.parallel.cp
    if cp == 1:
        return own
    kind = spec.parallel.cp_comm_type
    if kind == "all_gather":
        return x.heads + 4 * cp * x.kv_heads
    if kind == "a2a":
        return 2 * own
    return x.heads + 8 * x.kv_heads + own


def mlp_backward_work(
    spec: TrainingSpec,
    x: Dims,
    saved: dict[str, int],
    output_stored: bool,
    incoming_held: bool = False,
) -> int:
    """Working set at the MLP backward of a layer, relative to its saved set.

    ``incoming_held``: the gradient of the layer's output is a tensor counted elsewhere, not
    a new one: on a stage's last layer (its output sent and freed by schedules.py
    ``deallocate_output_tensor``) the received output gradient that ``backward_step``'s
    ``output_tensor_grad`` holds through the backward (the layer's ``layer_output`` slot,
    not released then); on the last layer of a full-recompute group the gradient
    tensor_parallel/random.py ``CheckpointFunction.backward`` was handed (``args``).

    Two moments compete: fc2's weight gradient (next to the incoming gradient and fc2's input
    gradient) and the activation backward (its one or two gradients, fc2's input released).
    Under sequence parallelism the incoming gradient is also all-gathered for fc2
    (mappings.py ``_ReduceScatterToSequenceParallelRegion.backward``): fc2's grad_output
    only, which autograd frees once fc2's backward (layers.py
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``) returns, before the
    activation's backward.
    """
    released = saved.get("residual_dropout_masks", 0) // 2
    released += saved["layer_output"] if output_stored else 0
    incoming = x.hidden * (2 if "residual_dropout_masks" in saved else 1)  # (+ masked copy)
    if incoming_held:  # the residual add hands that very tensor to the MLP's backward
        incoming -= x.hidden
    gathered = x.s * x.b * x.h * x.e if x.sp > 1 else 0  # sequence parallel, full sequence
    m = spec.model
    if m.num_experts is not None:
        # the gradient of the permuted tokens and the expert activation's gradient(s) over
        # the routed rows (megatron/core/transformer/moe/experts.py)
        rows = routed_rows(spec, x.s // x.sp * x.b)
        width = m.moe_ffn // spec.parallel.expert_tp
        grads = 2 if m.gated_linear_unit else 1
        return incoming + gathered + rows * x.h * x.e + grads * rows * width * x.e - released
    # with gradient_accumulation_fusion the weight gradient accumulates into main_grad
    fc2_weight_grad = 0 if spec.gradient_accumulation_fusion else x.h * x.f * x.e
    activation_grads = 2 if spec.model.gated_linear_unit else 1
    weight_moment = gathered + fc2_weight_grad  # the gathered gradient is alive only here
    return incoming + x.ffn + max(weight_moment, (activation_grads - 1) * x.ffn) - released


@dataclass(frozen=True)
class ActivationEstimate:
    """Activation bytes of one rank at its forward/backward high-water mark."""

    per_layer: dict[str, int]  # one layer, one microbatch (no recompute applied)
    chunk_saved_bytes: int  # one microbatch's saved tensors in the chunk whose backward peaks
    in_flight: int  # (chunk-)microbatches whose saved tensors coexist at the peak
    backward_working_bytes: int  # on top of the saved tensors, at the peak moment
    peak_moment: str  # which backward moment is the high-water mark
    buffer_bytes: int  # megatron's global "mpu" buffer (attention scores / SP all-gather)
    logits_bytes: int  # last stage: what the cross entropy keeps (one microbatch)
    detail: dict[str, int] = field(default_factory=dict)
    # per virtual chunk: its microbatches in flight at the peak whose saved tensors are all
    # there (a forward paired with the backward under MoE all-to-all overlap is priced in
    # backward_working_bytes instead), one microbatch's saved bytes
    in_flight_per_chunk: tuple[int, ...] = ()
    saved_per_chunk: tuple[int, ...] = ()

    @property
    def saved_bytes(self) -> int:
        """Saved tensors of every in-flight (chunk-)microbatch."""
        if self.in_flight_per_chunk:
            return sum(
                n * b for n, b in zip(self.in_flight_per_chunk, self.saved_per_chunk, strict=False)
            )
        return self.in_flight * self.chunk_saved_bytes

    @property
    def total_bytes(self) -> int:
        """All activation-side bytes at the peak (saved + working set + buffer)."""
        return self.saved_bytes + self.backward_working_bytes + self.buffer_bytes


@lru_cache(maxsize=256)
def _schedule_states(
    pp: int, pp_rank: int, chunks: int, microbatches: int, group: int, a2a_overlap: bool = False
) -> tuple[tuple[int, tuple[int, ...], int | None], ...]:
    """Every distinct moment a backward starts on stage ``pp_rank``: (the chunk running it,
    the chunk-microbatches per chunk whose saved tensors are alive, its own included, and
    the chunk whose forward runs paired with that backward, or None).

    :func:`_schedule_moments` with its last field dropped."""
    moments = _schedule_moments(pp, pp_rank, chunks, microbatches, group, a2a_overlap, False)
    return tuple(dict.fromkeys(m[:3] for m in moments))


def _warmed_up(
    pp: int, pp_rank: int, chunks: int, microbatches: int, group: int, a2a_overlap: bool
) -> tuple[list[int], int, list[int]]:
    """Megatron-core's schedule for stage ``pp_rank`` up to its steady phase: the forward
    order (``get_schedule_table``: the chunk of each chunk-microbatch, ``group`` microbatches
    per chunk, the last group taking the remainder), the warm-up forwards
    (``get_pp_rank_microbatches``: ``pp - rank - 1`` without interleaving, ``2 (pp - rank -
    1) + (chunks - 1) group`` with it, one more with the interleaved all-to-all overlap, all
    of them at most) and the chunk-microbatches per chunk they leave alive."""
    table: list[int] = []  # forward order: the chunk of each chunk-microbatch
    for start in range(0, microbatches, group):
        size = microbatches - start if start + group >= microbatches else group
        table += [c for c in range(chunks) for _ in range(size)]
        if start + group >= microbatches:
            break
    warmup = pp - pp_rank - 1 if chunks == 1 else 2 * (pp - pp_rank - 1) + (chunks - 1) * group
    warmup += 1 if a2a_overlap and chunks > 1 else 0
    warmup = min(warmup, len(table))
    alive = [0] * chunks
    for k in range(warmup):
        alive[table[k]] += 1
    return table, warmup, alive


@lru_cache(maxsize=256)
def _schedule_moments(
    pp: int,
    pp_rank: int,
    chunks: int,
    microbatches: int,
    group: int,
    a2a_overlap: bool = False,
    overlap_p2p: bool = False,
) -> tuple[tuple[int, tuple[int, ...], int | None, int], ...]:
    """Every distinct moment a backward starts on stage ``pp_rank``: (the chunk running it,
    the chunk-microbatches per chunk whose saved tensors are alive, its own included, the
    chunk whose forward runs paired with that backward, or None, and how many
    ``[s/sp, b, h]`` tensors the pipeline schedule holds then besides the saved ones).

    What the schedule holds (megatron/core/pipeline_parallel/schedules.py):

    * the previous backward's input gradient, just sent upstream: the schedule's
      ``input_tensor_grad`` keeps it until the next ``backward_step`` returns (none before
      the step's first backward, none from the model's first chunk, whose input is the
      embedding's output);
    * per chunk that receives its input and has no microbatch in flight: its last input and
      that input's gradient (``TransformerBlock.set_input_tensor`` keeps the tensor,
      ``backward_step``'s ``retain_grad()`` its ``.grad``; a chunk with a microbatch in
      flight holds its newest input among the saved ones, without a gradient yet);
    * interleaved only: the output of the forward run just before this backward, unsent:
      the steady phase runs forward ``k + warmup`` and backward ``k`` in one
      ``forward_backward_helper_wrapper`` call and sends that output (then
      ``deallocate_output_tensor``) after the backward (with ``overlap_p2p_comm``, in the
      next forward's ``pp_pre_forward``); the model's last chunk sends nothing (its output
      is the loss). The non-interleaved schedule sends and frees each output before its
      backward (``send_forward_recv_backward``);
    * interleaved with ``overlap_p2p`` (``overlap_p2p_comm``): the next forward's input,
      whose receive ``pp_post_forward`` posts (``send_forward_recv_forward`` into
      ``fwd_recv_buffer``) before this backward, unless that forward's chunk is the model's
      first or this is the last steady iteration (``recv_prev`` False). Without it the
      input is received after the backward (``send_forward_backward_recv_forward_backward``).

    Replays megatron-core's schedules (megatron/core/pipeline_parallel/schedules.py):
    ``get_pp_rank_microbatches`` gives the warm-up forwards (``pp - rank - 1`` without
    interleaving; ``2 (pp - rank - 1) + (chunks - 1) group`` with it, ``group`` being
    ``microbatch_group_size_per_vp_stage``, all of them when that exceeds the total); the
    steady 1F1B phase runs forward ``k + warmup`` then backward ``k``; the cool-down runs
    the remaining backwards. ``get_schedule_table`` orders the chunk-microbatches (``group``
    microbatches per chunk, the last group taking the remainder) and ``get_model_chunk_id``
    runs the backward of table entry ``k`` on chunk ``chunks - 1 - table[k]``. A last-stage
    microbatch's loss (and the logits' softmax) is computed inside its forward and freed by
    its backward, so the last chunk's extras count only for its own in-flight microbatches.

    With MoE all-to-all overlap (``a2a_overlap``) a steady-phase forward does not finish
    before its backward starts: it runs *paired* with it, layer by layer
    (megatron/core/pipeline_parallel/combined_1f1b.py, ``combined_1f1b_schedule_for_no_
    pipelining``: microbatch ``i + 1``'s forward with ``i``'s backward;
    ``combined_1f1b_schedule_for_interleaved_pipelining``: forward ``k + warmup`` with
    backward ``k``, ``get_pp_rank_microbatches`` adding one warm-up forward). Its entry in
    the alive counts is that partly built forward (the paired chunk, third field);
    :func:`chunk_activations` prices what it holds at each moment of the backward.
    """
    if pp == 1:  # forward_backward_no_pipelining: forward then backward, per microbatch
        return ((0, (2,), 0, 0),) if a2a_overlap and microbatches > 1 else ((0, (1,), None, 0),)
    table, warmup, alive = _warmed_up(pp, pp_rank, chunks, microbatches, group, a2a_overlap)
    total = len(table)
    receives = [pp_rank > 0 or c > 0 for c in range(chunks)]
    states: dict[tuple[int, tuple[int, ...], int | None, int], None] = {}
    previous: int | None = None  # the chunk of the previous backward
    for k in range(total):  # backward k, after (or, overlapped, with) forward k + warmup
        paired, held = None, 0
        if k + warmup < total:
            forward = table[k + warmup]
            alive[forward] += 1
            paired = forward if a2a_overlap else None
            sends = not (forward == chunks - 1 and pp_rank == pp - 1)
            held += int(chunks > 1 and not a2a_overlap and sends)  # its unsent output
            ahead = k + warmup + 1 < total and receives[table[k + warmup + 1]]
            held += int(chunks > 1 and overlap_p2p and not a2a_overlap and ahead)
        chunk = chunks - 1 - table[k]
        held += int(previous is not None and receives[previous])  # the last input gradient
        held += 2 * sum(1 for c in range(chunks) if receives[c] and alive[c] == 0)
        states.setdefault((chunk, tuple(alive), paired, held), None)
        alive[chunk] -= 1
        previous = chunk
    return tuple(states)


def _prereload_forward_steps(
    pp: int, pp_rank: int, chunks: int, microbatches: int, group: int
) -> tuple[tuple[int, tuple[int, ...], int], ...]:
    """Fine-grained offloading under the plain (not all-to-all-overlapped) pipeline schedule:
    every steady-state forward ``k + warmup`` that runs while backward ``k``'s chunk has its
    last layer back on the GPU: (the forward's chunk, the chunk-microbatches per chunk alive
    before it, backward ``k``'s chunk). megatron-core 0.20
    pipeline_parallel/fine_grained_activation_offload.py ``bulk_reload``: once a chunk's own
    reload stack is empty (its first layer's backward), each group-start backward pre-reloads
    one group of the next chunk in backward order (``pre_reload_last_layer``), so backward
    ``k - 1`` brings backward ``k``'s last layer back, and schedules.py runs forward
    ``k + warmup`` before backward ``k``. The same replay as :func:`_schedule_moments`."""
    table, warmup, alive = _warmed_up(pp, pp_rank, chunks, microbatches, group, False)
    total = len(table)
    steps: dict[tuple[int, tuple[int, ...], int], None] = {}
    for k in range(total):
        backward = chunks - 1 - table[k]
        if k + warmup < total:
            forward = table[k + warmup]
            # backward k - 1 ran its first layer's backward after backward k's chunk finished
            # its forward (a warm-up forward: none when the stage warms up nothing)
            if k > 0 and warmup > 0:
                steps.setdefault((forward, tuple(alive), backward), None)
            alive[forward] += 1
        alive[backward] -= 1
    return tuple(steps)


def prereload_forward_steps(
    spec: TrainingSpec, pp_rank: int
) -> tuple[tuple[int, tuple[int, ...], int], ...]:
    """:func:`_prereload_forward_steps` for ``spec``'s stage ``pp_rank`` (none unless
    fine-grained offloading runs under a plain pipeline schedule)."""
    p = spec.parallel
    if not spec.fine_grained_offloading or p.pp == 1 or p.moe_a2a_overlap:
        return ()
    chunks, group = _chunks_and_group(spec)
    return _prereload_forward_steps(p.pp, pp_rank, chunks, spec.num_microbatches, group)


def _chunks_and_group(spec: TrainingSpec) -> tuple[int, int]:
    """The schedule's model chunks per stage (the virtual pipeline's, 1 without pipelining)
    and its ``microbatch_group_size_per_vp_stage`` (default: the pipeline size)."""
    p = spec.parallel
    chunks = p.vpp if p.vpp is not None and p.pp > 1 else 1
    return chunks, p.microbatch_group_size or p.pp


def schedule_states(
    spec: TrainingSpec, pp_rank: int
) -> tuple[tuple[int, tuple[int, ...], int | None], ...]:
    """:func:`_schedule_states` for ``spec``'s stage ``pp_rank``."""
    p = spec.parallel
    chunks, group = _chunks_and_group(spec)
    return _schedule_states(p.pp, pp_rank, chunks, spec.num_microbatches, group, p.moe_a2a_overlap)


def schedule_moments(
    spec: TrainingSpec, pp_rank: int
) -> tuple[tuple[int, tuple[int, ...], int | None, int], ...]:
    """:func:`_schedule_moments` for ``spec``'s stage ``pp_rank``."""
    p = spec.parallel
    chunks, group = _chunks_and_group(spec)
    return _schedule_moments(
        p.pp, pp_rank, chunks, spec.num_microbatches, group, p.moe_a2a_overlap, p.overlap_p2p_comm
    )


def in_flight_microbatches(spec: TrainingSpec, pp_rank: int) -> int:
    """The most (chunk-)microbatches with live activations when a backward starts.

    No pipelining: one. 1F1B: ``min(M, pp - rank)`` (warm-up forwards plus one). Interleaved
    1F1B: Megatron's warm-up ``2 (pp - rank - 1) + (vpp - 1) pp`` chunk-forwards plus one.
    MoE all-to-all overlap adds the forward paired with the backward (see
    :func:`_schedule_states`), counted here though it is only partly built.
    """
    return max(sum(alive) for _, alive, _ in schedule_states(spec, pp_rank))


def _checkpointed(spec: TrainingSpec, n_layers: int) -> list[int | None]:
    """Per layer of a chunk: its full-recompute group id, or None when it stores its tensors."""
    if spec.recompute != "full":
        return [None] * n_layers
    k = spec.recompute_num_layers
    if spec.recompute_method == "block":
        return [i if i < k else None for i in range(n_layers)]
    return [i // k for i in range(n_layers)]


def attention_keeps_mask(spec: TrainingSpec, x: Dims) -> bool:
    """Whether the attention keeps its mask for backward: the unfused softmax's masked fill
    does (megatron/core/fusions/fused_softmax.py ``forward_torch_softmax``); flash/fused
    attention and the fused causal softmax kernel apply the causal mask themselves."""
    return not spec.flash_attention and not fused_softmax(spec, x)


def dataloader_mask(spec: TrainingSpec, x: Dims) -> int:
    """The ``[b, 1, s/cp, s]`` bool attention mask each batch carries when Megatron-LM's
    ``create_attention_mask_in_dataloader`` is on (its default): megatron/core/datasets/
    gpt_dataset.py ``_get_ltor_masks_and_position_ids`` builds ``[1, s, s]`` per sample,
    pretrain_gpt.py ``get_batch`` moves the batch to the GPU on the first and last stages
    (every tensor-parallel rank holds a copy: ``get_batch_on_this_tp_rank``) and
    ``get_batch_on_this_cp_rank`` keeps this rank's ``s/cp`` query rows. It lives while the
    microbatch's ``forward_step`` runs; 0 without it."""
    return x.b * x.s * spec.model.seq_length if spec.dataloader_attention_mask else 0


def chunk_inputs(spec: TrainingSpec, x: Dims, first: bool) -> dict[str, int]:
    """What a chunk-microbatch holds before its first layer: its input (received, or the
    embedding's output), the causal mask of unfused attention and, on the first chunk, the
    token (and position) ids and the embedding dropout mask."""
    out: dict[str, int] = {"chunk_input": x.hidden}
    if attention_keeps_mask(spec, x):  # the batch's mask, else megatron's [1, 1, s, s] one
        out["causal_mask"] = dataloader_mask(spec, x) or x.s * x.s
    if first:
        positions = spec.model.position_embedding_type == "learned_absolute"
        out["token_ids"] = x.s * x.b * INT64 * (2 if positions else 1)
        if spec.model.hidden_dropout > 0:
            out["embedding_dropout_mask"] = x.hidden_mask
    return out


@dataclass(frozen=True)
class PairedForward:
    """A forward chunk-microbatch that runs layer by layer beside a backward (MoE all-to-all
    overlap): what it holds as the pairs advance.

    megatron/core/models/common/model_chunk_schedule_plan.py
    (``TransformerModelChunkSchedulePlan.run``): the backward's loss and output layer run
    first (``post_process.backward``) next to the forward's embedding (``pre_process``); then
    forward layer ``j`` runs with backward layer ``L - 1 - j`` (``pop_layer``), the backward
    layer's state released after each pair; the backward layers left over run alone, then the
    forward layers left over, then the forward's loss (``post_process.forward``).
    ``TransformerLayerSchedulePlan.run`` orders one pair as: combine backward, attention
    forward, MLP backward, dispatch forward/backward, MLP forward, combine forward, attention
    backward (``ep_overlap_early_attn_memory_release`` off, the default). So at the MLP
    backward of pair ``j`` the forward holds ``j`` layers and the attention part of layer
    ``j``; at the attention backward, ``j + 1`` layers."""

    base: int  # held before its first layer (:func:`chunk_inputs`)
    layer: int  # one layer's saved bytes
    attention: int  # of them, what the attention half of the layer saves
    layers: int  # its chunk's layer count

    def held(self, pair: int, moment: str) -> int:
        """Bytes held at ``moment`` (``mlp_backward`` / ``attention_backward``) of pair
        ``pair`` (0 = the first backward layer, the chunk's last)."""
        if pair >= self.layers:  # a backward layer left over: the forward's layers are done
            return self.base + self.layers * self.layer
        if moment == "mlp_backward":
            return self.base + pair * self.layer + self.attention
        return self.base + (pair + 1) * self.layer


def mlp_half_saved(items: dict[str, int]) -> int:
    """Of a layer's saved ``items`` (:func:`layer_saved`), what its second half keeps: the
    MLP's tensors, the pre-MLP norm's output and statistics, the layer's output and the MLP's
    residual dropout mask (the attention half is the rest)."""
    half = items["mlp"] + items["layer_output"]
    half += (items["norm_outputs"] + items["norm_statistics"]) // 2
    return half + items.get("residual_dropout_masks", 0) // 2


def kept_halves(spec: TrainingSpec, x: Dims) -> tuple[int, int]:
    """(what one layer keeps for backward, recompute applied; of it, the attention half:
    everything but :func:`mlp_half_saved`)."""
    full = layer_saved(spec, x)
    kept = sum(full.values()) - sum(recompute_discarded(spec, x, full).values())
    return kept, max(0, kept - mlp_half_saved(full))


def paired_forward(spec: TrainingSpec, n_layers: int, first: bool) -> PairedForward:
    """:class:`PairedForward` of a chunk of ``n_layers`` layers (first chunk: ``first``)."""
    x = dims(spec)
    kept, attention = kept_halves(spec, x)
    base = sum(chunk_inputs(spec, x, first).values())
    return PairedForward(base, kept, attention, n_layers)


def chunk_activations(
    spec: TrainingSpec,
    n_layers: int,
    first: bool,
    last: bool,
    partner: PairedForward | None = None,
    roles: ChunkRoles | None = None,
    fsdp: InFlight | None = None,
) -> tuple[int, int, str, dict[str, int]]:
    """(saved bytes, peak working bytes above them, peak moment, detail) of one chunk.

    ``fsdp``: FSDP's unsharded buffers at each moment (:func:`.fsdp.in_flight`), added to
    the loss moments and to the layers' backward moments.

    With ``partner``, the forward running paired with this backward is priced in the
    working bytes (MoE all-to-all overlap, :class:`PairedForward`). ``roles``
    (:func:`.config.chunk_roles`) says where the final norm and the MTP layers are (a
    ``pipeline_model_parallel_layout`` may put the MTP layers on another chunk than the
    loss: their layers' tensors are kept there, their losses on the loss chunk, which then
    receives the main and every depth's hidden states, ``(1 + depth) [s, b, h]``:
    megatron-core ``GPTModel._postprocess`` returns the MTP block's concatenation when not
    ``post_process``). Default: both on the last chunk."""
    x = dims(spec)
    depth = spec.model.mtp_num_layers or 0
    if roles is None:
        roles = ChunkRoles(embedding=first, loss=last, mtp=last and depth > 0, final_norm=last,
                           first=first)  # fmt: skip
    full = layer_saved(spec, x)
    groups = _checkpointed(spec, n_layers)
    layer_total = sum(full.values())
    dropped = recompute_discarded(spec, x, full)
    discarded = sum(dropped.values())
    kept = layer_total - discarded  # what a layer holds until its backward recomputes it
    offloaded = offloaded_layers(spec) if first and last else 0  # pp == 1 only
    moved = offloadable_bytes(full)
    if spec.fine_grained_offloading:  # every layer but the chunk's last (offload.py)
        offloaded = max(n_layers - 1, 0)
        twice = dropped_before_offload(spec, full, dropped)
        moved = fine_grained_moved(spec, full, x.e) - fine_grained_moved(spec, twice, x.e)
        if spec.model.num_experts is not None:  # layer_saved itemises MoE layers
            moved += expert_offload_bytes(spec, x.s, x.b, x.sp, x.e)
    standalone_mtp = depth > 0 and last and not roles.mtp
    extras = chunk_inputs(spec, x, first)
    if standalone_mtp:  # the MTP layers ran on another chunk: every depth's hidden states
        extras["chunk_input"] = x.hidden * (1 + depth)
    if roles.final_norm:
        extras["final_norm"] = x.hidden + x.stats
    if last:
        extras["cross_entropy_softmax"] = cross_entropy_saved(spec, x)
        extras["cross_entropy_small"] = x.s * x.b * CE_BYTES_PER_TOKEN
    if depth and (last or roles.mtp):
        mtp = mtp_saved(spec, x, kept)
        if roles.mtp:
            extras["mtp_layers"] = mtp["mtp_layers"]
        if last:
            extras["mtp_cross_entropy"] = mtp["mtp_cross_entropy"]
    distillation_extras(spec, x, first, last, extras)  # teacher input, KD loss (distillation.py)
    rl_loss_extras(spec, x, last, extras)  # the RL loop's log-probabilities (rl_loss.py)
    stored = []
    for i, g in enumerate(groups):
        ends_group = i + 1 == n_layers or groups[i + 1] != g
        # a stage's last output is sent, then freed (unless the final norm keeps it)
        output_kept = i + 1 < n_layers or last or roles.final_norm
        if g is None:
            host = moved if i < offloaded else 0
            stored.append(kept - host - (0 if output_kept else x.hidden))
        else:  # a checkpoint keeps only its group's input: the previous group's output
            stored.append(x.hidden if ends_group and output_kept else 0)
    saved = sum(stored) + sum(extras.values())
    hold = x.vocab * x.h * x.e if spec.parallel.pp == 1 and spec.model.tie_embeddings else 0
    best, moment = 0, "none"
    if last:
        loss_saved = extras["cross_entropy_softmax"] + extras.get("kd_loss_saved", 0)
        loss_saved += extras.get("rl_log_probs_saved", 0)
        moments = loss_moments(spec, x, loss_saved)
        distillation_moments(spec, x, moments)
        rl_loss_moments(spec, x, moments)
        if fsdp is not None:
            for name in moments:
                moments[name] += fsdp.output_layer if name == "output_layer_backward" else fsdp.loss
        best, moment = max((w, name) for name, w in moments.items())
        if partner is not None:
            # the loss backward runs beside the partner's embedding output; the partner's
            # loss forward, after every backward layer, beside this microbatch's leftovers
            # (its input gradient, its inputs): about one chunk input either way
            best += partner.base
        if spec.defer_embedding_wgrad:
            # up to wgrad_deferral_limit microbatches (0: all) wait in the buffers: the
            # others' while the last one computes its loss, all of them at the drain
            m, limit = spec.num_microbatches, spec.wgrad_deferral_limit or spec.num_microbatches
            deferred = deferred_wgrad_bytes(x)
            best += min(m - 1, limit) * deferred
            drain = min(m, limit) * deferred - saved
            if drain > best:
                best, moment = drain, "embedding_wgrad_drain"
    released_extras = sum(  # back-propagated before the decoder layers
        extras.get(k, 0)
        for k in (
            "final_norm",
            "cross_entropy_softmax",
            "cross_entropy_small",
            "mtp_layers",
            "mtp_cross_entropy",
            "kd_loss_saved",
            "rl_log_probs_saved",
        )
    )
    below = saved - released_extras  # what is alive when the layers' backward starts
    for i in reversed(range(n_layers)):
        below -= stored[i]
        group = groups[i]
        if group is None:
            own = layer_total  # recomputed modules and offloaded tensors are back
            if 0 < i < offloaded:
                own += moved  # the previous offloaded layer, reloaded one layer ahead
        else:  # the group's layers up to i are recomputed and alive, with the recomputed
            # output and the gradient handed to it
            own = layer_total * sum(1 for j in range(i + 1) if groups[j] == group)
            own += 2 * x.hidden
        base = below + own + hold - saved
        # a recomputed group's last output is the recomputed one (random.py
        # CheckpointFunction.backward's ``outputs``, in ``own`` above) whether or not the
        # stage kept its forward output, so its ``layer_output`` slot is released like a kept one
        output_stored = i + 1 < n_layers or last or roles.final_norm or group is not None
        ends_group = i + 1 == n_layers or groups[i + 1] != group
        held = ends_group if group is not None else not output_stored
        attention_work = attention_backward_work(spec, x, full, output_stored)
        if spec.fine_grained_offloading and group is None and i < offloaded:
            # its core_attn group came back from the host: a tensor saved twice is two copies
            attention_work += reloaded_duplicate(spec, softmax_output_saved_twice(spec, x), x.e)
        for name, work in (
            ("attention_backward", attention_work),
            ("mlp_backward", mlp_backward_work(spec, x, full, output_stored, held)),
        ):
            if partner is not None:
                work += partner.held(n_layers - 1 - i, name)
            if fsdp is not None:
                work += fsdp.layers
            if base + work > best:
                best, moment = base + work, f"layer {i} {name}"
    detail = dict(extras)
    detail["layers"] = sum(stored)
    if discarded:
        detail["recompute_discarded_per_layer"] = discarded
    if offloaded:
        detail["offloaded_to_host"] = offloaded * moved
    if spec.fine_grained_offloading and n_layers and groups[-1] is None:
        # the last layer's groups stay on the GPU only for the chunk whose backward comes
        # next; a chunk-microbatch that waits has them on the host too (offload.py)
        detail["fine_grained_last_layer"] = moved
    return saved, best, moment, detail


def cross_entropy_saved(spec: TrainingSpec, x: Dims) -> int:
    """What the cross entropy keeps for backward over the ``[s, b, V/t]`` logits.

    megatron/core/tensor_parallel/cross_entropy.py (unfused) and
    megatron/core/fusions/fused_cross_entropy.py (``native``) upcast the logits to fp32
    (``calculate_logits_max``), work in place on that copy and keep it as the softmax, which
    backward turns into the gradient in place. Transformer Engine's ``parallel_cross_entropy``
    (``te``) writes the gradient into the logits themselves and keeps them at their dtype."""
    return x.logits if spec.cross_entropy == "te" else x.logits // x.e * FP32


def loss_moments(spec: TrainingSpec, x: Dims, ce_saved: int) -> dict[str, int]:
    """Working bytes above the last chunk's saved tensors at the loss and the output layer.

    ``cross_entropy``: the 16-bit logits the output layer produced stay alive beside their
    fp32 copy while the loss is computed (forward; the same pair exists in backward, when
    autograd casts the fp32 gradient back to the logits' dtype). Under ``native`` fusion the
    helpers are ``torch.compile``d (megatron/core/jit.py) and Inductor's
    ``calculate_gradients`` writes the gradient into a new fp32 ``[s, b, V/t]`` buffer instead
    of updating the saved softmax in place, so the backward holds one more of them: measured
    on CPU by tools/measure_fused_cross_entropy.py (backward peak 1.5 fp32 logits compiled,
    0.5 eager; the forward is the same both ways), tests/test_fused_cross_entropy_measured.py.
    Before megatron-core 0.8 (:data:`.megatron_versions.INPLACE_LOGITS_SHIFT`) the caller's
    fp32 copy stays alive beside the out-of-place shifted one that becomes the softmax: one
    fp32 ``[s, b, V/t]`` more, at any activation dtype. The loss runs inside the
    microbatch's ``forward_step``, so its batch's attention mask (:func:`dataloader_mask`) is
    alive too; attention that keeps it counts it with the saved tensors instead.
    ``output_layer_backward``: the fp32 softmax is gone, the logits' gradient (activation
    dtype), the input gradient ``[s, b, h]`` and, without ``gradient_accumulation_fusion``,
    the ``[V/t, h]`` weight-gradient temporary are alive (megatron/core/tensor_parallel/
    layers.py, ``LinearWithGradAccumulationAndAsyncCommunication``)."""
    upcast = 0 if spec.cross_entropy == "te" or x.e == FP32 else x.logits
    if spec.cross_entropy == "native":
        upcast += x.logits // x.e * FP32
    if spec.cross_entropy == "unfused" and logits_shift_copy(spec.model):
        upcast += x.logits // x.e * FP32
    if spec.model.mtp_num_layers:  # the last MTP depth's logits are still referenced
        upcast += x.logits
    if not attention_keeps_mask(spec, x):
        upcast += dataloader_mask(spec, x)
    wgrad = 0 if spec.gradient_accumulation_fusion else x.vocab * x.h * x.e
    return {
        "cross_entropy": upcast,
        "output_layer_backward": x.logits - ce_saved + wgrad + x.s * x.b * x.h * x.e,
    }


def deferred_wgrad_bytes(x: Dims) -> int:
    """Per microbatch, what ``defer_embedding_wgrad_compute`` keeps on the last stage until
    the pipeline flush (megatron/core/tensor_parallel/layers.py: the output layer's input
    in ``embedding_activation_buffer``, its output gradient in ``grad_output_buffer``;
    drained by ``finish_embedding_wgrad_compute`` in schedules.py)."""
    return x.hidden + x.logits


def buffer_bytes(spec: TrainingSpec, last: bool = False) -> int:
    """Megatron's global ``"mpu"`` buffer: sized by the largest of its uses, kept forever.

    Local spec: ``DotProductAttention``'s ``baddbmm`` output and the sequence-parallel
    all-gather of megatron's parallel linears. Transformer Engine layers allocate their own
    (transient) tensors; only megatron's output layer (``ColumnParallelLinear``, last stage)
    all-gathers into the buffer under sequence parallelism."""
    x = dims(spec)
    uses = [0]
    local = spec.model.transformer_impl == "local"
    if local and not spec.flash_attention:
        uses.append(x.scores)  # the baddbmm output buffer of DotProductAttention
    if x.sp > 1 and (local or last):
        uses.append(x.s * x.b * x.h * x.e)  # the sequence-parallel all-gather
    uses.append(moe_global_buffer(spec, x.s, x.b, x.sp, x.e))  # allgather dispatcher
    return max(uses)


def activation_estimate(
    spec: TrainingSpec, pp_rank: int, layer_counts: list[int], fsdp: InFlight | None = None
) -> ActivationEstimate:
    """Activation terms of stage ``pp_rank``; ``layer_counts`` are its chunks' layers;
    ``fsdp``: FSDP's unsharded buffers by moment (:func:`.fsdp.in_flight`)."""
    p = spec.parallel
    chunks, chunk_role = [], []
    for c, n in enumerate(layer_counts):
        roles = chunk_roles(spec.model, p, pp_rank, c)
        chunk_role.append(roles)
        chunks.append(chunk_activations(spec, n, roles.first, roles.loss, roles=roles, fsdp=fsdp))
    x = dims(spec)
    # one microbatch's saved bytes per chunk while it waits for its backward: under
    # fine-grained offloading every layer is on the host then (offload.py); the chunk whose
    # backward runs keeps its last layer (priced in the working bytes below)
    saved_each = tuple(r[0] - r[3].get("fine_grained_last_layer", 0) for r in chunks)
    # the highest moment over the schedule: every in-flight chunk-microbatch's saved tensors
    # (the last chunk's logits/loss only for its own microbatches) plus the working set of
    # the chunk whose backward runs
    best: (
        tuple[int, int, tuple[int, ...], tuple[int, int, str, dict[str, int]], tuple[int, ...], int]
        | None
    ) = None
    for chunk, alive, paired, held_by_schedule in schedule_moments(spec, pp_rank):
        result = chunks[chunk]
        total = sum(n * b for n, b in zip(alive, saved_each, strict=False))
        # input gradients, idle chunks' inputs, an unsent output (_schedule_moments)
        schedule_held = held_by_schedule * x.hidden
        total += schedule_held
        if paired is not None:  # MoE all-to-all overlap: that forward is only partly built
            partner = paired_forward(spec, layer_counts[paired], chunk_role[paired].first)
            roles = chunk_role[chunk]
            result = chunk_activations(
                spec, layer_counts[chunk], roles.first, roles.loss, partner, roles, fsdp
            )
            total -= saved_each[paired]
        total += result[1] + result[0] - saved_each[chunk]
        if best is None or total > best[0]:
            held = list(alive)
            if paired is not None:  # priced in the working bytes, not as saved
                held[paired] -= 1
            best = (total, chunk, alive, result, tuple(held), schedule_held)
    assert best is not None
    steps = prereload_forward_steps(spec, pp_rank)
    if steps:
        # the second softmax copy of a layer back from the host; the forward's first layer at
        # its attention: query/key/value and (unfused attention) the scores beside their
        # softmax output
        duplicate = reloaded_duplicate(spec, softmax_output_saved_twice(spec, x), x.e)
        attention = layer_saved(spec, x)["attention_qkv"]
        attention += 0 if spec.flash_attention else 2 * x.scores
    for forward, alive, backward in steps:
        if not layer_counts[backward] or not layer_counts[forward]:
            continue  # a chunk without decoder layers has no groups to reload or build
        waiting = sum(n * b for n, b in zip(alive, saved_each, strict=False))
        back = chunks[backward][3].get("fine_grained_last_layer", 0) + duplicate
        building = sum(chunk_inputs(spec, x, chunk_role[forward].first).values()) + attention
        if waiting + back + building > best[0]:
            detail = {**chunks[forward][3], "prereloaded_layer": back, "forward_layer": building}
            moment = "forward beside a pre-reloaded layer"
            result = (saved_each[forward], back + building, moment, detail)
            best = (waiting + back + building, forward, alive, result, alive, 0)
    _, peak_chunk, alive, (saved, work, moment, detail), held_per_chunk, schedule_held = best
    if schedule_held:
        detail = {**detail, "pipeline_schedule_held": schedule_held}
    if len(chunks) > 1:
        moment = f"chunk {peak_chunk} {moment}"
    logits = cross_entropy_saved(spec, x) if pp_rank == p.pp - 1 else 0
    return ActivationEstimate(
        per_layer=layer_saved(spec, x),
        chunk_saved_bytes=saved,
        in_flight=sum(alive),
        backward_working_bytes=work + schedule_held + saved - saved_each[peak_chunk],
        peak_moment=moment,
        buffer_bytes=buffer_bytes(spec, last=pp_rank == p.pp - 1),
        logits_bytes=logits,
        detail=detail,
        in_flight_per_chunk=held_per_chunk,
        saved_per_chunk=saved_each,
    )


def retained_inputs_bytes(spec: TrainingSpec, pp_rank: int, chunks: int) -> int:
    """What the pipeline schedule leaves allocated after a step: per model chunk that
    receives its input from another stage, the last received ``[s/sp, b, h]`` input and its
    gradient.

    megatron/core/pipeline_parallel/schedules.py ``forward_step`` hands each received input to
    ``set_input_tensor``, and megatron/core/transformer/transformer_block.py keeps it as
    ``self.input_tensor``; ``backward_step`` calls ``retain_grad()`` on it, so after the
    chunk's last backward the tensor and its ``.grad`` stay referenced by the block until the
    next step's first forward of that chunk replaces them (before any backward of the next
    step, so never at the activation peak). The first stage's first chunk gets the
    embedding's output instead (``input_tensor`` None)."""
    if spec.parallel.pp == 1:
        return 0
    receiving = chunks - (1 if pp_rank == 0 else 0)
    return receiving * 2 * dims(spec).hidden


def optimizer_step_bytes(spec: TrainingSpec, params: list[ParamTensor]) -> int:
    """Temporaries of the optimizer step (beyond its state).

    ``torch.optim.Adam``/``AdamW`` (Megatron's optimizer when neither Transformer Engine's
    nor Apex's FusedAdam imports: megatron/core/optimizer/__init__.py) picks its path in
    torch/optim/optimizer.py ``_default_to_fused_or_foreach``: on CPU the single-tensor path
    builds the denominator of one parameter at a time (``sqrt`` then the division, two fp32
    tensors of that parameter's size); on CUDA the foreach path (``_multi_tensor_adam``)
    builds it for the whole parameter group at once (``torch._foreach_sqrt`` of the
    ``exp_avg_sq`` list, then in-place ops): one fp32 copy of the largest group's main
    parameters (:func:`optimizer_group_numels`). Megatron's fused Adam works in place.
    """
    prec = spec.precision
    if not (prec.torch_optimizer and prec.optimizer == "adam"):
        return 0
    if spec.device == "cuda":
        return max(optimizer_group_numels(spec, params), default=0) * FP32
    return 2 * max((t.numel for t in params), default=0) * FP32


def optimizer_group_numels(spec: TrainingSpec, params: list[ParamTensor]) -> list[int]:
    """Elements of each parameter group the rank's optimizer updates: megatron/core/
    optimizer/__init__.py ``_get_param_groups`` parts weight-decayed from not (1-D tensors
    and biases) and dense from expert parameters; the distributed optimizer updates its
    shard of each (:func:`.terms.optimizer_shards`)."""
    groups: dict[tuple[bool, bool], int] = {}
    for t in params:
        key = (t.expert, t.ndim == 1)
        groups[key] = groups.get(key, 0) + t.numel
    if not spec.precision.distributed_optimizer:
        return list(groups.values())
    dense_shards, expert_shards = optimizer_shards(spec)
    shards = {False: dense_shards, True: expert_shards}
    return [-(-n // shards[expert]) for (expert, _), n in groups.items()]
