"""The RL loss's terms (analysis/static/rl_loss.py) are measured, not assumed:
tools/measure_rl_logprobs.py runs the loss's sequence of torch operations (row-wise
``log_softmax`` of full-vocabulary logits and the next token's entry) forward and backward on
CPU and reads torch.profiler's memory timeline. The estimator's saved tensor and its two
working moments must be what it measures, for one row and for several."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

from memscope.analysis.static.activations import dims
from memscope.analysis.static.rl_loss import (
    full_vocab_logits,
    rl_loss_extras,
    rl_loss_moments,
)
from memscope.inputs.megatron_args import spec_from_megatron_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import measure_rl_logprobs as rl  # noqa: E402

SEQ, VOCAB = 256, 2048


def _spec(batch: int, tp: int):
    args = dict(num_layers=2, hidden_size=64, num_attention_heads=4, padded_vocab_size=VOCAB,
                seq_length=SEQ, micro_batch_size=batch, global_batch_size=batch * 4 // tp,
                bf16=True, tensor_model_parallel_size=tp, world_size=4,
                transformer_impl="local", perform_rl_step=True,
                inference_dynamic_batching_buffer_size_gb=0.01)  # fmt: skip
    return dataclasses.replace(spec_from_megatron_args(args), device="cuda")


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_the_rl_loss_terms_are_what_its_operations_allocate(batch):
    measured = rl.measure(batch, SEQ, VOCAB)
    unit = batch * SEQ * VOCAB * 4  # the measured logits (fp32)
    for tp in (1, 2):  # every tensor rank holds the full vocabulary
        spec = _spec(batch, tp)
        x = dims(spec)
        full = full_vocab_logits(spec, x)
        assert full == batch * SEQ * VOCAB * 2  # bf16, the whole vocabulary at any TP
        extras: dict[str, int] = {"cross_entropy_softmax": 1, "cross_entropy_small": 1}
        rl_loss_extras(spec, x, True, extras)
        moments: dict[str, int] = {}
        rl_loss_moments(spec, x, moments)
        # saved: the log_softmax outputs, [b, s - 1, V] (within the one position left out)
        assert extras["rl_log_probs_saved"] / full == pytest.approx(measured.kept / unit, rel=0.02)
        assert extras["cross_entropy_softmax"] == extras["cross_entropy_small"] == 0
        # forward: the logits beside the outputs
        ours = (extras["rl_log_probs_saved"] + moments["cross_entropy"]) / full
        assert ours == pytest.approx(measured.forward_peak / unit, rel=0.02)
        # backward, above what the forward saved: 2 rows' gradients, or the whole batch's
        # stacked gradient and the slice's zeros
        backward = moments["rl_log_probs_backward"] / full
        assert backward == pytest.approx(measured.backward_peak / unit, rel=0.03)
        assert backward == max(2 / batch, 1)
