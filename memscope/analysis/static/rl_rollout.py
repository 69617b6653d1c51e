"""The RL loop's rollout: what a rank holds while its inference engine generates.

Each iteration of ``train_rl.py`` first collects rollouts (``get_environment_rollouts``,
megatron/rl/rl_utils.py at 4e85d74ae9), then trains on them; Megatron's logged peak
(``mem-max-allocated-bytes``, never reset) covers both. Against the steady state the rollout:

* **moves to the host** with ``--rl-offload-optimizer-during-inference``: every tensor of
  the optimizer (``MegatronOptimizer.offload_to_cpu``: the parameter groups' fp32 main
  weights and the state) and, unless ``--rl-training-cuda-graphs``, model chunk 0's gradient
  buffers (``model[0].offload_grad_buffers()``: ``storage().resize_(0)``); both come back
  before the training step;
* **allocates the KV buffer** where the trainer's step runs without it (``recompute``
  mode: :attr:`.config.RlSpec.kv_resident`);
* **runs the engine's steps** (``TextGenerationController.
  async_generate_output_tokens_dynamic_batch``), two moments each:

  - *the forward* under ``torch.inference_mode``: one ``[T, 1, h]`` hidden state between
    layers and one layer's working set at a time. An MLP holds its ``linear_fc1`` output
    (``2 f / tp`` with a gated unit) and what the activation makes beside it (the fused
    kernel's output ``f / tp``; unfused and gated, ``silu``'s output, ``x_linear +
    glu_linear_offset`` and their product), the local spec's pre-MLP norm output ``h``
    beside them; Transformer Engine's fused norm lives inside ``linear_fc1`` only (``h``
    beside its output, not beside the activation). The attention holds its QKV output
    ``(h + 2 kv) / tp`` and its context ``h / tp`` (the local spec's norm beside them). A MoE
    layer holds, under balanced routing, ``T topk`` routed rows twice (the permuted tokens
    and the dispatcher's copy, ``h`` each), then the larger of the experts' working set (all
    rows at once under grouped GEMMs, one expert's share in ``SequentialMLP``) and the
    experts' output with its unpermuted copy (``h`` each). Steps whose batch a captured CUDA
    graph covers replay it, allocating nothing; the largest eager step is the engine's token
    budget (``max_tokens``, at most every in-flight request's context) unless every step fits
    a graph (no more prefill requests than a graph's mixed prefill count, no more tokens than
    the largest graph);
  - *the logits* ``[1, R, V]`` (all tensor ranks gather the vocabulary; with pipeline
    parallelism the last stage broadcasts them to every stage, which samples too), then
    the sampling (``_torch_sampling_func``: ``e`` above the logits for greedy top-k 1,
    ``4 e + 8`` for top-p, whose ``torch.sort`` adds int64 indices, else ``3 e``) and the
    log-probabilities the RL client always asks for (``DynamicInferenceContext.
    calculate_log_probs``: an fp32 copy, the rows it indexes and their ``log_softmax``,
    ``4 + 4 + 4`` bytes per element above bf16 logits). ``R`` is the requests one engine
    runs at once: the in-flight rollouts (:func:`memscope.inputs.rl_args.requests_in_flight`)
    spread round-robin over the data-parallel engines
    (``DataParallelInferenceCoordinator.get_next_data_parallel_rank``), at most the engine's
    ``max_requests``.

Measured on CPU with megatron-core 0.16.1's own sampling and log-probability functions and
MLP (``tools/measure_rl_rollout.py``; ``tests/test_rl_rollout_measured.py``).

Known limitations: routed rows under balanced routing (times ``moe_token_imbalance``); the
router's ``[T, experts]`` scores, the attention's RoPE copies and the engine's per-step
metadata are not counted; CUDA's segmented sort for top-p keeps its
own workspace, not counted (the CPU sort measured keeps none); a run with fp32 parameters,
whose optimizer groups are the parameters themselves, is read as if its weights stayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memscope.analysis.static.config import chunk_layer_counts, chunk_layer_offset
from memscope.analysis.static.params import RankPosition
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

    requests: int  # logits rows of the engine's fullest step (R)
    tokens: int  # tokens of its largest eager step (0: every step replays a graph)
    offloaded_optimizer_bytes: int
    offloaded_grad_bytes: int
    kv_cache_bytes: int  # the KV buffer where the training step runs without it
    forward_bytes: int  # the hidden state and one layer's working set
    logits_bytes: int  # the logits with the sampling's or the log-probabilities' working set

    @property
    def working_bytes(self) -> int:
        """The step's larger moment: the forward, or the logits after it."""
        return max(self.forward_bytes, self.logits_bytes)

    @property
    def offloaded_bytes(self) -> int:
        return self.offloaded_optimizer_bytes + self.offloaded_grad_bytes

    @property
    def transient_bytes(self) -> int:
        """Bytes against the steady state at the rollout's high-water mark (negative where
        the offload frees more than the engine's step allocates)."""
        return self.kv_cache_bytes + self.working_bytes - self.offloaded_bytes


def engine_requests(spec: TrainingSpec) -> int:
    """``R``: the requests one engine runs at once (its share of the in-flight rollouts,
    round-robin over the data-parallel engines, at most ``max_requests``)."""
    rl = spec.rl
    assert rl is not None
    engines = inference_parallel(spec).dp  # one engine per data-parallel replica
    return min(max_requests(spec), -(-rl.requests_in_flight // engines))


def eager_tokens(spec: TrainingSpec) -> int:
    """Tokens of the engine's largest eager step: its token budget, at most the in-flight
    requests' contexts; 0 where a captured graph covers every step."""
    rl = spec.rl
    assert rl is not None
    requests = engine_requests(spec)
    tokens = min(rl.max_tokens or DEFAULT_MAX_TOKENS, requests * context_max_sequence_length(spec))
    dims = graph_batch_dimensions(spec)
    if dims:
        largest = max(t for t, _, _ in dims)
        if requests <= rl.mixed_prefill_requests and tokens <= largest:
            return 0
    return tokens


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
    ``tokens`` tokens (the module docstring's moments)."""
    m, p = spec.model, inference_parallel(spec)
    local = m.transformer_impl == "local"
    h, tp = m.hidden_size, p.tp
    kv = m.query_groups * m.head_dim
    query = m.num_attention_heads * m.head_dim
    # the local spec's norms are modules of their own; TE fuses the attention's and a dense
    # MLP's into the next linear layer
    attention = (h if local else 0) + (query + 2 * kv) // tp + query // tp
    if moe:
        etp = p.expert_tp
        ffn = m.moe_ffn // etp
        fc1 = (2 if m.gated_linear_unit else 1) * ffn
        rows = round(tokens * m.moe_router_topk * m.moe_token_imbalance)
        local_experts = max(1, (m.num_experts or 1) // p.ep)
        # grouped GEMMs run every routed row at once, SequentialMLP one expert's at a time
        at_once = rows if m.moe_grouped_gemm else -(-rows // local_experts)
        experts = max(at_once * (fc1 + _activation_elements(spec, ffn)), 2 * rows * h)
        return max(tokens * attention, tokens * h + 2 * rows * h + experts)
    ffn = m.ffn // tp
    fc1 = (2 if m.gated_linear_unit else 1) * ffn
    act = _activation_elements(spec, ffn)
    mlp = h + fc1 + act if local else max(h + fc1, fc1 + act)
    return tokens * max(attention, mlp)


def forward_working_bytes(spec: TrainingSpec, pp_rank: int) -> int:
    """The hidden state and the largest layer's working set on stage ``pp_rank`` at the
    engine's largest eager step."""
    tokens = eager_tokens(spec)
    layers = _rank_layers(spec, pp_rank)
    if not tokens or not layers:
        return 0
    per_layer = max(
        layer_working_elements(spec, tokens, spec.model.is_moe_layer(i)) for i in layers
    )
    return (tokens * spec.model.hidden_size + per_layer) * spec.precision.param_bytes


def logits_working_bytes(spec: TrainingSpec) -> int:
    """The fullest step's logits ``[1, R, V]`` and, above them, the larger of the sampling's
    and the log-probabilities' working sets (the module docstring's terms)."""
    rl = spec.rl
    assert rl is not None
    e = spec.precision.param_bytes
    if rl.sampling_top_k == 1:
        sampling = e
    elif rl.sampling_top_p > 0:
        sampling = 4 * e + INT64
    else:
        sampling = 3 * e
    log_probs = (FP32 if e < FP32 else 0) + 2 * FP32
    return engine_requests(spec) * spec.model.vocab_size * (e + max(sampling, log_probs))


def offloaded(
    spec: TrainingSpec, persistent: PersistentTerms, params: list[ParamTensor]
) -> tuple[int, int]:
    """(optimizer, gradient) bytes on the host during the rollout."""
    rl = spec.rl
    assert rl is not None
    if not rl.offload_optimizer:
        return 0, 0
    grads = 0
    if not rl.training_cuda_graphs and persistent.param_count:
        # params.rank_params tags each tensor with its virtual chunk where there are several
        chunked = any(t.name.startswith("chunk1.") for t in params)
        first = sum(t.numel for t in params if not chunked or t.name.startswith("chunk0."))
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
    optimizer, grads = offloaded(spec, persistent, params)
    return RolloutTerms(
        requests=engine_requests(spec),
        tokens=eager_tokens(spec),
        offloaded_optimizer_bytes=optimizer,
        offloaded_grad_bytes=grads,
        kv_cache_bytes=0 if rl.kv_resident else kv_buffer_bytes(spec),
        forward_bytes=forward_working_bytes(spec, position.pp_rank),
        # every stage: the last one's logits, broadcast to the others under pipelining
        logits_bytes=logits_working_bytes(spec),
    )
