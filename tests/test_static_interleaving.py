"""The interleaved (virtual pipeline) schedule: the last chunk's logits counted once per its
own in-flight microbatch, checked against a real megatron-core VPP run on CPU."""

from __future__ import annotations

import dataclasses
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))

from bench_static_accuracy import BASE, measure

from memscope.analysis.static.activations import (
    activation_estimate,
    dims,
    retained_inputs_bytes,
    schedule_states,
)
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition
from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.demo.traced_training import megatron_like_args
from memscope.inputs.megatron_args import spec_from_megatron_args

TOLERANCE = 0.03  # tests/test_static_accuracy.py's bound per rank
# logits [s, b, V] fp32 = 64 x 2 x 8192 x 4 = 4 MiB per microbatch: far above a layer's tensors
LARGE_VOCAB = dict(pp=2, vpp=2, num_layers=4, num_microbatches=4, vocab_size=8192, seq_length=64)


def _spec(overrides, world=2):
    args = megatron_like_args(TinyGPTConfig(**{**BASE, **overrides}), [])
    args.world_size = world
    return dataclasses.replace(spec_from_megatron_args(args), device="cpu")


def test_schedule_replay_counts_one_last_chunk_microbatch_on_the_last_stage():
    spec = _spec(LARGE_VOCAB)
    # last stage: warm-up (vpp - 1) pp = 2 chunk-0 forwards; each chunk-1 forward is followed
    # by its own backward, so at most one last-chunk microbatch is ever alive
    assert max(alive[1] for _, alive, _ in schedule_states(spec, 1)) == 1
    assert (1, (2, 1), None) in schedule_states(spec, 1)
    # first stage: warm-up 2 (pp - 1) + (vpp - 1) pp = 4, then forward 5 before backward 1
    assert max(sum(alive) for _, alive, _ in schedule_states(spec, 0)) == 5
    act = activation_estimate(spec, 1, [1, 1])
    last, other = act.saved_per_chunk[1], act.saved_per_chunk[0]
    assert act.in_flight_per_chunk == (2, 1)
    assert act.saved_bytes == 2 * other + last  # not 3 x the last chunk's (logits included)
    assert last - other >= act.detail["cross_entropy_softmax"]


def test_all_warmup_keeps_every_last_chunk_microbatch():
    # M = pp: the first stage's warm-up covers every chunk-microbatch (all forwards first)
    spec = _spec(dict(LARGE_VOCAB, num_microbatches=2))
    states = schedule_states(spec, 0)
    assert states[0] == (1, (2, 2), None)


def _docs_figures() -> tuple[int, int, str]:
    """(measured, estimated, error) that docs/static-estimator.md quotes for the run below."""
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "static-estimator.md")
    with open(path, encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    found = re.search(r"last stage measured ([\d,]+) B, estimated ([\d,]+) B, ([-+][\d.]+%)", docs)
    assert found, "docs/static-estimator.md quotes the interleaved run"
    measured, estimated = (int(found.group(i).replace(",", "")) for i in (1, 2))
    return measured, estimated, found.group(3)


def test_the_docs_quote_this_estimate_of_the_large_vocabulary_last_stage():
    measured, estimated, error = _docs_figures()
    spec = _spec(LARGE_VOCAB)
    assert estimate_rank(spec, RankPosition(0, 1)).peak_memory_bytes == estimated
    assert f"{(estimated - measured) / measured:+.2%}" == error


@pytest.mark.integration
@pytest.mark.multiprocess
def test_vpp_large_vocab_last_stage_within_bound_of_a_real_run():
    rows = measure("vpp2-vocab8192", 2, LARGE_VOCAB, steps=2)
    spec = _spec(LARGE_VOCAB)
    last = next(r for r in rows if r["pp_rank"] == 1)
    est = estimate_rank(spec, RankPosition(last["tp_rank"], 1))
    error = (est.peak_memory_bytes - last["measured"]) / last["measured"]
    print(f"last stage: measured {last['measured']:,} estimated {est.peak_memory_bytes:,}")
    assert abs(error) <= TOLERANCE, (last["measured"], est.peak_memory_bytes, error)
    assert last["in_report"] == est.peak_memory_bytes  # the runtime report carries it too
    assert last["measured"] == _docs_figures()[0]  # the figure docs/static-estimator.md quotes


def test_pipeline_inputs_kept_between_steps_count_in_steady_not_in_the_peak():
    # transformer_block.set_input_tensor keeps each chunk's last received input and
    # backward_step's retain_grad keeps its gradient: 2 [s/sp, b, h] per receiving chunk
    spec = _spec(LARGE_VOCAB)
    hidden = dims(spec).hidden
    first, last = (estimate_rank(spec, RankPosition(0, r)) for r in (0, 1))
    assert first.retained_input_bytes == 2 * hidden  # chunk 0 of stage 0 gets the embedding
    assert last.retained_input_bytes == 2 * 2 * hidden  # both chunks receive
    assert retained_inputs_bytes(spec, 1, 2) == last.retained_input_bytes
    plain = _spec(dict(LARGE_VOCAB, pp=2, vpp=None))
    assert retained_inputs_bytes(plain, 1, 1) == 2 * hidden
    no_pp = _spec(dict(LARGE_VOCAB, pp=1, vpp=None), world=1)
    assert estimate_rank(no_pp, RankPosition(0, 0)).retained_input_bytes == 0
    without = dataclasses.replace(last, retained_input_bytes=0)
    assert last.steady_bytes - without.steady_bytes == 2 * 2 * hidden
    # replaced by the next step's first forward of each chunk, before any backward: the
    # forward/backward peak does not hold them
    assert last.peak_stage == "forward_backward"
    assert last.peak_memory_bytes == without.peak_memory_bytes
