"""torch's softmax backward on CUDA allocates ``tmp = grad * output`` (aten/src/ATen/native/
cuda/SoftMax.cu ``softmax_backward_cuda_out``) before its kernel; the CPU kernel does not
(``activations.softmax_backward_temporaries``). Its size and direction on a small config, and
the first GPU pass's attention-backward peaks it explains."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from memscope.analysis.static.activations import dims, layer_saved, torch_softmax_backward
from memscope.inputs.megatron_args import spec_from_megatron_args

SUMMARY = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "benchmarks", "gpu", "h100_2026-11-28", "summary.txt",
)  # fmt: skip
FP32 = 4


def _spec(device: str, **extra: object):
    args = dict(
        num_layers=2, hidden_size=256, num_attention_heads=8, padded_vocab_size=1024,
        seq_length=2048, max_position_embeddings=2048, micro_batch_size=2,
        global_batch_size=2, bf16=True, world_size=1, transformer_impl="local",
        attention_softmax_in_fp32=True, masked_softmax_fusion=False, attention_dropout=0.1,
    )  # fmt: skip
    spec = spec_from_megatron_args({**args, **extra})
    return dataclasses.replace(spec, device=device)


@pytest.mark.parametrize("fp32_softmax", [True, False])
def test_cuda_holds_one_softmax_sized_tensor_more_than_the_cpu(fp32_softmax):
    cuda = _spec("cuda", attention_softmax_in_fp32=fp32_softmax)
    cpu = dataclasses.replace(cuda, device="cpu")
    x = dims(cuda)
    saved = layer_saved(cuda, x)  # one saved set for both: only the backward differs
    softmax = x.scores // x.e * FP32 if fp32_softmax else x.scores
    assert softmax == 2 * 8 * 2048 * 2048 * (FP32 if fp32_softmax else 2)
    assert torch_softmax_backward(cuda, x, saved) - torch_softmax_backward(cpu, x, saved) == softmax


def test_no_temporary_where_torch_softmax_does_not_run():
    flash = _spec("cuda", attention_backend="flash", transformer_impl="transformer_engine")
    fused = _spec("cuda", masked_softmax_fusion=True, attention_softmax_in_fp32=False)
    for spec in (flash, fused):
        x = dims(spec)
        assert torch_softmax_backward(spec, x, layer_saved(spec, x)) == 0


def test_the_gpu_passs_attention_backward_peaks_are_within_a_tenth_of_a_percent():
    """benchmarks/gpu/h100_2026-11-28/summary.txt (tools/gpu_results.py recomputes every
    estimate; tests/test_gpu_results.py checks it is current): the cases whose peak is an
    attention backward, against their measured peak plus what the process had allocated
    once and kept (the workspaces a clean run allocates too)."""
    with open(SUMMARY, encoding="utf-8") as f:
        text = f.read()
    row = re.compile(r"^   (\S.*?)  .* ([-+]\d+\.\d)%  forward_backward .*attention_backward$")
    rows = [m.groups() for m in map(row.match, text.splitlines()) if m]
    assert {name for name, _ in rows} == {"long s4096 b1", "selective recompute", "full recompute"}
    for name, error in rows:
        assert abs(float(error)) <= 0.1, (name, error)
