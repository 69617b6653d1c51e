"""The RL loop's loss on the last pipeline stage: log-probabilities over the full vocabulary.

Megatron-LM's ``train_rl.py`` ``forward_step`` (at 4e85d74ae9) computes its GRPO loss from
``get_logprobs`` (megatron/rl/rl_utils.py), not from the vocab-parallel cross entropy:

* the model runs with ``runtime_gather_output=True``: the output layer's ``[s, b, V/t]``
  logits are all-gathered into ``[s, b, V]`` on every tensor rank, and ``GPTModel`` returns
  them as a ``[b, s, V]`` copy (``transpose(0, 1).contiguous()``), in the activation dtype
  (``fp32_output`` only without bf16/fp16);
* ``selective_log_softmax`` takes, row by row of the batch, ``log_softmax`` over ``[s - 1, V]``
  (16-bit logits) and gathers the next token's entry; autograd saves each ``log_softmax``
  output, nothing else of the logits, which are freed when ``get_logprobs`` returns.

So per micro-batch, in units of the full-vocabulary logits ``b s V e``: one is saved until the
backward; the forward holds one more beside it (the gathered logits and their copy, then the
logits beside the outputs); the backward holds ``max(2 / b, 1)`` more above what the forward
saved (per row: the output's gradient and the input's; then, the outputs freed, the rows'
stacked gradient and the slice's zero-filled gradient, one each). Measured on CPU by
``tools/measure_rl_logprobs.py`` (``tests/test_rl_logprobs_measured.py``) at fp32: the CPU
``log_softmax`` backward converts 16-bit inputs into an fp32 buffer that the CUDA kernel does
not allocate (aten/src/ATen/native/cuda/SoftMax.cu ``host_softmax_backward`` writes the input
gradient directly); the autograd structure is the same at either dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec
    from memscope.analysis.static.distillation import Dims


def full_vocab_logits(spec: TrainingSpec, x: Dims) -> int:
    """One ``[b, s, V]`` logits tensor in the activation dtype (``x.logits`` is ``V/t``)."""
    return x.logits * spec.parallel.tp


def rl_loss_extras(spec: TrainingSpec, x: Dims, last: bool, extras: dict[str, int]) -> None:
    """On the last chunk of an RL run, in place: the saved ``log_softmax`` outputs instead of
    the vocab-parallel cross entropy's saved tensors."""
    if spec.rl is None or not last:
        return
    extras["cross_entropy_softmax"] = 0
    extras["cross_entropy_small"] = 0
    extras["rl_log_probs_saved"] = full_vocab_logits(spec, x)


def rl_loss_moments(spec: TrainingSpec, x: Dims, moments: dict[str, int]) -> None:
    """The RL loss's working bytes above what it saves, in place of the cross entropy's: the
    forward's gathered logits, and the backward's ``max(2 / b, 1)`` logits."""
    if spec.rl is None:
        return
    full = full_vocab_logits(spec, x)
    moments["cross_entropy"] = full
    moments["rl_log_probs_backward"] = full * max(2, x.b) // x.b
