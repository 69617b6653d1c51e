"""torch's softmax backward on CUDA allocates ``tmp = grad * output`` (aten/src/ATen/native/
cuda/SoftMax.cu ``softmax_backward_cuda_out``) before its kernel; the CPU kernel does not
(``activations.softmax_backward_temporaries``). Its size and direction on a small config, and
the first GPU pass's attention-backward peaks it explains."""

from __future__ import annotations

import dataclasses
import os
import re

from memscope.analysis.static.activations import (
    attention_backward_work,
    dims,
    layer_saved,
    torch_softmax_backward,
)
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


def test_cuda_holds_one_fp32_score_tensor_more_at_the_attention_backward():
    """The layer's working set at its attention backward (fp32 softmax on bf16 scores, with
    dropout: the softmax backward is its high-water mark), CUDA against CPU on one saved
    set: exactly one fp32 score tensor more."""
    cuda = _spec("cuda")
    cpu = dataclasses.replace(cuda, device="cpu")
    x = dims(cuda)
    saved = layer_saved(cuda, x)
    fp32_scores = 2 * 8 * 2048 * 2048 * FP32  # [b, heads, s, s]
    assert x.scores // x.e * FP32 == fp32_scores
    work = attention_backward_work(cuda, x, saved, output_stored=True)
    assert work - attention_backward_work(cpu, x, saved, output_stored=True) == fp32_scores


def test_a_softmax_in_the_scores_dtype_with_dropout_peaks_at_its_cuda_backward():
    """bf16 softmax (no upcast) with attention dropout: on the CPU the working set is the
    context bmm's backward; on CUDA the softmax backward (probability and score gradients,
    the temporary, the saved output) holds more, by the temporary less what the dropout had
    kept beyond one score tensor and the two bmm gradients."""
    cuda = _spec("cuda", attention_softmax_in_fp32=False)
    cpu = dataclasses.replace(cuda, device="cpu")
    x = dims(cuda)
    saved = layer_saved(cuda, x)
    on_cpu = attention_backward_work(cpu, x, saved, output_stored=True)
    on_cuda = attention_backward_work(cuda, x, saved, output_stored=True)
    bmm = 2 * x.heads + x.scores  # the CPU's high-water mark
    softmax = x.heads + 3 * x.scores - saved["attention_dropout"]
    assert softmax > bmm and on_cuda - on_cpu == softmax - bmm


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
