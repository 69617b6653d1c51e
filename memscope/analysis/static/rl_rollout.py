"""The RL loop's rollout: what a rank holds while its inference engine generates.

Each iteration of ``train_rl.py`` first collects rollouts (``get_environment_rollouts``,
megatron/rl/rl_utils.py at 4e85d74ae9), then trains on them; Megatron's logged peak
(``mem-max-allocated-bytes``, never reset) covers both. Against the steady state the rollout:

* **moves to the host** with ``--rl-offload-optimizer-during-inference``: every tensor of
  the optimizer (``MegatronOptimizer.offload_to_cpu``: the parameter groups' fp32 main
  weights and the state) and, unless ``--rl-training-cuda-graphs``, model chunk 0's gradient
  buffers (``model[0].offload_grad_buffers()``: ``storage().resize_(0)``); both come back
  before the training step. Megatron-FSDP has no ``offload_grad_buffers``: refused;
* **allocates the KV buffer** where the trainer's step runs without it (``recompute``
  mode: :attr:`.config.RlSpec.kv_resident`);
* **captures the engine's CUDA graphs** (``cuda_graph_impl local``; ``DynamicInferenceEngine.
  create_cuda_graphs`` when the engine is built at the first rollout, and at every resume
  outside ``persist`` mode without static KV pointers): for each batch dimension one
  ``_dynamic_step_forward_logits``, the layers run eagerly before their capture and the
  output layer's logits eagerly (each layer's ``num_warmup_steps`` warm-ups hold its input,
  a ``zeros_like`` copy and the previous warm-up's output; the logits are at most the
  largest graph's tokens, ``max_requests``, rows, gathered on the last stage and the
  broadcast buffer elsewhere);
* **runs the engine's steps** (``TextGenerationController.
  async_generate_output_tokens_dynamic_batch``), two moments each:

  - *the forward* under ``torch.inference_mode``: the decoder block's input and the current
    layer's input (the same tensor for a stage's first layer) stay referenced while a layer
    runs, and the layer holds one working set at a time. After the attention (QKV output
    ``(h + 2 kv) / tp``, context ``h / tp`` and ``linear_proj``'s output ``h``, the local
    spec's norm output beside them) that output becomes the MLP's residual; an MLP holds
    beside it ``linear_fc1``'s output (``2 f / tp`` with a gated unit) and what the
    activation makes (the fused kernel's output ``f / tp``; unfused and gated, ``silu``'s
    output, ``x_linear + glu_linear_offset`` and their product), the local spec's pre-MLP
    norm output ``h`` too; Transformer Engine's fused norm lives inside ``linear_fc1`` only
    (``h`` beside its output, not beside the activation). A MoE layer (its norm a module of
    its own) holds, under balanced routing, ``T topk`` routed rows twice (the permuted
    tokens and the dispatcher's copy, ``h`` each), then the larger of the experts' working
    set (all rows at once under grouped GEMMs, one expert's share in ``SequentialMLP``) and
    the experts' output with its unpermuted copy (``h`` each). Steps whose batch a captured
    graph covers replay it, allocating nothing; the largest eager step is the engine's token
    budget (``max_tokens``, at most every in-flight request's context) unless a captured
    dimension covers it with all its requests in prefill (matching is per count, not exact,
    for a non-hybrid model);
  - *the logits* of the step (all tensor ranks gather the vocabulary: the local shard, the
    all-gather buffer and the concatenation, ``(2 + 1 / tp) e`` per element; with pipeline
    parallelism the last stage broadcasts them to every stage, which samples too). With the
    engine's default ``materialize_only_last_token_logits`` they are ``[1, R, V]``, one row
    per active request: then the sampling (``_torch_sampling_func``: ``4 e + 8`` above them
    for top-p, whose ``torch.sort`` adds int64 indices, else ``3 e``; the RL client sends
    the temperature and top-p only, so the engine's top-k stays 0) and the log-probabilities
    the RL client always asks for (``DynamicInferenceContext.calculate_log_probs``: an fp32
    copy, the rows it indexes and their ``log_softmax``, ``4 + 4 + 4`` bytes per element
    above bf16 logits). ``--return-log-probs`` turns that off (megatron/inference/utils.py):
    the logits are then ``[1, T, V]`` for every token of the step (padded to the dimension a
    graphed step replays), the sampling works on a copy of the last tokens' rows, and the
    log-probabilities on all rows (an fp32 copy and its ``log_softmax``) except in a
    decode-only step, which takes the last-token branch. ``R`` is the requests one engine
    runs at once: the in-flight rollouts
    (:func:`memscope.inputs.rl_args.requests_in_flight`) spread round-robin over the
    data-parallel engines
    (``DataParallelInferenceCoordinator.get_next_data_parallel_rank``), at most the engine's
    ``max_requests``; an assumption both ways: an engine that keeps its long requests while
    others finish can hold more than its share, and KV blocks run out before
    ``max_requests`` active requests when contexts are long.

Measured on CPU with megatron-core 0.16.1's own sampling and log-probability functions and a
``TransformerLayer`` (``tools/measure_rl_rollout.py``; ``tests/test_rl_rollout_measured.py``).

Known limitations: routed rows under balanced routing (times ``moe_token_imbalance``); the
router's ``[T, experts]`` scores, the attention's RoPE copies and the engine's per-step
metadata are not counted; CUDA's segmented sort for top-p keeps its own workspace, not
counted (the CPU sort measured keeps none); a run with fp32 parameters, whose optimizer
groups are the parameters themselves, is read as if its weights stayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memscope.analysis.static.config import chunk_layer_counts, chunk_layer_offset
from memscope.analysis.static.params import RankPosition, layers_per_chunk
from memscope.analysis.static.rl import (
    DEFAULT_MAX_TOKENS,
    context_max_sequence_length,
    graph_batch_dimensions,
    inference_parallel,
    kv_buffer_bytes,
    max_requests,
)
from memscope.analysis.static.terms import PersistentTerms

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec
    from memscope.analysis.static.params import ParamTensor

FP32 = 4
INT64 = 8


@dataclass(frozen=True)
class RolloutTerms:
    """The rollout's moment against the steady state, for one rank."""

    requests: int  # requests of the engine's fullest step (R)
    tokens: int  # tokens of its largest eager step (0: every step replays a graph)
    offloaded_optimizer_bytes: int
    offloaded_grad_bytes: int
    kv_cache_bytes: int  # the KV buffer where the training step runs without it
    forward_bytes: int  # the held hidden states and one layer's working set
    logits_bytes: int  # the logits with the gather's, sampling's or log-probabilities' work
    capture_bytes: int = 0  # the CUDA-graph capture's eager warm-up (0: no graphs)

    @property
    def working_bytes(self) -> int:
        """The largest moment: a step's forward or its logits, or the graphs' capture."""
        return max(self.forward_bytes, self.logits_bytes, self.capture_bytes)

    @property
    def offloaded_bytes(self) -> int:
        return self.offloaded_optimizer_bytes + self.offloaded_grad_bytes

    @property
    def transient_bytes(self) -> int:
        """Bytes against the steady state at the rollout's high-water mark (negative where
        the offload frees more than the engine allocates)."""
        return self.kv_cache_bytes + self.working_bytes - self.offloaded_bytes


def engine_requests(spec: TrainingSpec) -> int:
    """``R``: the requests one engine runs at once (its share of the in-flight rollouts,
    round-robin over the data-parallel engines, at most ``max_requests``)."""
    rl = spec.rl
    assert rl is not None
    engines = inference_parallel(spec).dp  # one engine per data-parallel replica
    return min(max_requests(spec), -(-rl.requests_in_flight // engines))


def step_tokens(spec: TrainingSpec) -> int:
    """Tokens of the engine's largest step: its token budget, at most the in-flight
    requests' contexts."""
    rl = spec.rl
    assert rl is not None
    budget = rl.max_tokens or DEFAULT_MAX_TOKENS
    return min(budget, engine_requests(spec) * context_max_sequence_length(spec))


def largest_graph_tokens(spec: TrainingSpec) -> int:
    """Tokens of the largest captured batch dimension (0: no graphs)."""
    return max((t for t, _, _ in graph_batch_dimensions(spec)), default=0)


def _covering_graph(spec: TrainingSpec, tokens: int, requests: int) -> int | None:
    """Tokens of the smallest captured dimension a step of ``tokens`` tokens, all of its
    ``requests`` requests in prefill, fits (matching is per count, not exact, for a
    non-hybrid model: ``InferenceBatchDimensions`` in batch_dimensions_utils.py); None if
    it runs eager."""
    fits = [
        t for t, prefill, _ in graph_batch_dimensions(spec) if t >= tokens and prefill >= requests
    ]
    return min(fits, default=None)


def eager_tokens(spec: TrainingSpec) -> int:
    """Tokens of the engine's largest eager step; 0 where a captured graph covers every
    step (the largest step, all its requests in prefill, fits a captured dimension)."""
    tokens = step_tokens(spec)
    return 0 if _covering_graph(spec, tokens, engine_requests(spec)) else tokens


def _rank_layers(spec: TrainingSpec, pp_rank: int) -> list[int]:
    """Global indices of the decoder layers the engine's model builds on stage ``pp_rank``."""
    p = inference_parallel(spec)
    out: list[int] = []
    for chunk, count in enumerate(chunk_layer_counts(spec.model, p, pp_rank)):
        start = chunk_layer_offset(spec.model, p, pp_rank, chunk)
        out += range(start, start + count)
    return out


def _activation_elements(spec: TrainingSpec, ffn: int) -> int:
    """What the MLP's activation holds beside ``linear_fc1``'s output (mlp.py): the fused
    kernel's output, else for a gated unit ``silu(x_glu)``, ``x_linear + glu_linear_offset``
    and their product."""
    m = spec.model
    if m.gated_linear_unit and not m.bias_activation_fusion:
        return 3 * ffn
    return ffn


def layer_working_elements(spec: TrainingSpec, tokens: int, moe: bool) -> int:
    """Elements one layer holds above its input during an eager inference forward of
    ``tokens`` tokens: the attention's moment (at ``linear_proj``, its QKV output still
    referenced), or the MLP's beside the attention's output (the module docstring's)."""
    m, p = spec.model, inference_parallel(spec)
    local = m.transformer_impl == "local"
    h, tp = m.hidden_size, p.tp
    kv = m.query_groups * m.head_dim
    query = m.num_attention_heads * m.head_dim
    # QKV output, context and linear_proj's output (query, key, value still referenced);
    # the local spec's norms are modules of their own, TE fuses the attention's and a dense
    # MLP's into the next linear layer
    attention = (h if local else 0) + (query + 2 * kv) // tp + query // tp + h
    if moe:
        etp = p.expert_tp
        ffn = m.moe_ffn // etp
        fc1 = (2 if m.gated_linear_unit else 1) * ffn
        rows = round(tokens * m.moe_router_topk * m.moe_token_imbalance)
        local_experts = max(1, (m.num_experts or 1) // p.ep)
        # grouped GEMMs run every routed row at once, SequentialMLP one expert's at a time
        at_once = rows if m.moe_grouped_gemm else -(-rows // local_experts)
        experts = max(at_once * (fc1 + _activation_elements(spec, ffn)), 2 * rows * h)
        return max(tokens * attention, 2 * tokens * h + 2 * rows * h + experts)
    ffn = m.ffn // tp
    fc1 = (2 if m.gated_linear_unit else 1) * ffn
    act = _activation_elements(spec, ffn)
    mlp = 2 * h + fc1 + act if local else h + max(h + fc1, fc1 + act)
    return tokens * max(attention, mlp)


def forward_working_bytes(
    spec: TrainingSpec, pp_rank: int, tokens: int, held: int | None = None
) -> int:
    """The held hidden states and the largest layer's working set on stage ``pp_rank`` for
    an eager forward of ``tokens`` tokens: ``held`` ``[T, h]`` tensors besides the layer
    (default: the block's input and the running layer's, one tensor on a one-layer stage)."""
    layers = _rank_layers(spec, pp_rank)
    if not tokens or not layers:
        return 0
    if held is None:
        held = 2 if len(layers) > 1 else 1
    per_layer = max(
        layer_working_elements(spec, tokens, spec.model.is_moe_layer(i)) for i in layers
    )
    return (held * tokens * spec.model.hidden_size + per_layer) * spec.precision.param_bytes


def gathered_logits_bytes(spec: TrainingSpec, rows: int, last_stage: bool = True) -> int:
    """``rows`` full-vocabulary logits as the output layer makes them: on the last stage the
    local shard, the all-gather buffer and their concatenation (mappings.py
    ``_gather_along_last_dim``; the logits alone at TP 1), elsewhere the broadcast buffer."""
    tp, e, vocab = inference_parallel(spec).tp, spec.precision.param_bytes, spec.model.vocab_size
    if tp == 1 or not last_stage:
        return rows * vocab * e
    return 2 * rows * vocab * e + rows * (vocab // tp) * e


def _sampling_bytes_per_element(spec: TrainingSpec) -> int:
    """``_torch_sampling_func`` above the logits it samples (the RL client sends no top-k).
    The rows the controller indexes for it are freed once it clones them (from CPython 3.11
    a call hands its argument's only reference to the callee)."""
    rl = spec.rl
    assert rl is not None
    e = spec.precision.param_bytes
    return 4 * e + INT64 if rl.sampling_top_p > 0 else 3 * e


def logits_working_bytes(spec: TrainingSpec) -> int:
    """The fullest step's logits with the largest of the gather's, the sampling's and the
    log-probabilities' working sets (the module docstring's terms)."""
    rl = spec.rl
    assert rl is not None
    e, vocab = spec.precision.param_bytes, spec.model.vocab_size
    requests = engine_requests(spec)
    upcast = FP32 if e < FP32 else 0  # logits.float() copies 16-bit logits only
    sampling = _sampling_bytes_per_element(spec)
    # [1, R, V]: each request's last token (a decode-only step's log-probabilities too)
    last = requests * vocab * (e + max(sampling, upcast + 2 * FP32))
    if not rl.return_log_probs:
        return max(gathered_logits_bytes(spec, requests), last)
    # [1, T, V]: every token, padded to the graph a step replays
    tokens = step_tokens(spec)
    tokens = _covering_graph(spec, tokens, requests) or tokens
    every = tokens * vocab
    return max(
        gathered_logits_bytes(spec, tokens),
        last,
        every * e + requests * vocab * (e + sampling),  # sampled on a copy of the last rows
        every * (e + upcast + FP32),  # the fp32 copy and its log_softmax
    )


def capture_working_bytes(spec: TrainingSpec, pp_rank: int) -> int:
    """The graphs' capture: each layer's eager warm-ups at the largest graph's tokens (its
    input, a ``zeros_like`` copy and the previous warm-up's output beside the layer,
    cuda_graphs.py ``num_warmup_steps``), or the warm-up's logits (at most ``max_requests``
    rows: the largest graph's tokens); 0 without graphs."""
    tokens = largest_graph_tokens(spec)
    if not tokens:
        return 0
    last = pp_rank == inference_parallel(spec).pp - 1
    return max(
        forward_working_bytes(spec, pp_rank, tokens, held=3),
        gathered_logits_bytes(spec, tokens, last),
    )


def offloaded(
    spec: TrainingSpec, pp_rank: int, persistent: PersistentTerms, params: list[ParamTensor]
) -> tuple[int, int]:
    """(optimizer, gradient) bytes on the host during the rollout."""
    rl = spec.rl
    assert rl is not None
    if not rl.offload_optimizer:
        return 0, 0
    grads = 0
    if not rl.training_cuda_graphs and persistent.param_count:
        # params.rank_params tags each tensor with its virtual chunk where there are several
        tag = "chunk0." if len(layers_per_chunk(spec, pp_rank)) > 1 else ""
        first = sum(t.numel for t in params if t.name.startswith(tag))
        grads = persistent.grad_bytes * first // persistent.param_count
    return persistent.optimizer_bytes, grads


def rollout_terms(
    spec: TrainingSpec,
    position: RankPosition,
    persistent: PersistentTerms,
    params: list[ParamTensor],
) -> RolloutTerms | None:
    """The rollout's moment on the rank at ``position``; None outside the RL loop."""
    rl = spec.rl
    if rl is None:
        return None
    optimizer, grads = offloaded(spec, position.pp_rank, persistent, params)
    tokens = eager_tokens(spec)
    return RolloutTerms(
        requests=engine_requests(spec),
        tokens=tokens,
        offloaded_optimizer_bytes=optimizer,
        offloaded_grad_bytes=grads,
        kv_cache_bytes=0 if rl.kv_resident else kv_buffer_bytes(spec),
        forward_bytes=forward_working_bytes(spec, position.pp_rank, tokens),
        # every stage: the last one's logits, broadcast to the others under pipelining
        logits_bytes=logits_working_bytes(spec),
        capture_bytes=capture_working_bytes(spec, position.pp_rank),
    )
