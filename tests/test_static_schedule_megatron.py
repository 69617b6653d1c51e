"""The estimator's in-flight microbatches against megatron-core's own schedule arithmetic
(megatron/core/pipeline_parallel/schedules.py), for PP in {2, 4, 8} and VPP in {none, 2, 4}:
``get_pp_rank_microbatches`` gives each stage's warm-up forwards, ``get_schedule_table`` the
order of chunk-microbatches; at a stage's first backward every warm-up forward and the
steady phase's first forward hold their saved tensors, which is the stage's in-flight peak."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches, get_schedule_table

from memscope.analysis.static.activations import (
    _schedule_states,
    activation_estimate,
    in_flight_microbatches,
    paired_forward,
    schedule_states,
)
from memscope.analysis.static.spec_checks import validate_spec
from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.demo.traced_training import megatron_like_args
from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = pytest.mark.megatron_versions


def _communicator(pp: int, rank: int, vpp: int | None) -> SimpleNamespace:
    """The three values get_pp_rank_microbatches reads from its communicator (no process
    group is needed for the arithmetic)."""
    group = SimpleNamespace(size=lambda: pp, rank=lambda: rank)
    return SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)


def _spec(pp: int, vpp: int | None, microbatches: int):
    layers = pp * (vpp or 1)
    cfg = TinyGPTConfig(pp=pp, vpp=vpp, num_layers=layers, num_microbatches=microbatches)
    args = megatron_like_args(cfg, [])
    args.world_size = pp
    return dataclasses.replace(spec_from_megatron_args(args), device="cpu")


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("vpp", [None, 2, 4])
@pytest.mark.parametrize("per_stage", [1, 2, 3])
def test_in_flight_microbatches_follow_megatrons_schedule(pp, vpp, per_stage):
    microbatches = pp * per_stage  # interleaving needs a multiple of pp
    spec = _spec(pp, vpp, microbatches)
    chunks = vpp or 1
    table = get_schedule_table(microbatches, chunks, pp)
    for rank in range(pp):
        total, all_warmup, warmup, remaining = get_pp_rank_microbatches(
            microbatches, chunks, pp, p2p_communicator=_communicator(pp, rank, vpp)
        )
        assert total == len(table) == microbatches * chunks and remaining == total - warmup
        expected = total if all_warmup else warmup + 1
        assert in_flight_microbatches(spec, rank) == expected, (pp, vpp, rank)
        # and per chunk: the forwards run before the first backward, by Megatron's table
        first_backward_chunk, alive, _ = schedule_states(spec, rank)[0]
        started = table[: min(total, warmup + (0 if all_warmup else 1))]
        assert list(alive) == [sum(1 for _, c in started if c == k) for k in range(chunks)]
        assert first_backward_chunk == chunks - 1 - table[0][1]


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("vpp", [2, 4])
@pytest.mark.parametrize("per_stage", [1, 2, 3])
def test_moe_all_to_all_overlap_adds_megatrons_extra_warmup_forward(pp, vpp, per_stage):
    microbatches = pp * per_stage
    for rank in range(pp):
        total, all_warmup, warmup, _ = get_pp_rank_microbatches(
            microbatches, vpp, pp, p2p_communicator=_communicator(pp, rank, vpp),
            overlap_moe_expert_parallel_comm=True,
        )  # fmt: skip
        states = _schedule_states(pp, rank, vpp, microbatches, pp, a2a_overlap=True)
        expected = total if all_warmup else warmup + 1
        assert max(sum(alive) for _, alive, _ in states) == expected, (pp, vpp, rank)


def _moe_spec(**extra):
    args = dict(num_layers=4, hidden_size=64, num_attention_heads=4, num_experts=4,
                moe_ffn_hidden_size=64, moe_router_topk=2, expert_model_parallel_size=2,
                moe_token_dispatcher_type="alltoall", padded_vocab_size=128, seq_length=32,
                micro_batch_size=1, global_batch_size=8, bf16=True, world_size=2,
                transformer_impl="local")  # fmt: skip
    return spec_from_megatron_args({**args, **extra})


def test_moe_all_to_all_overlap_without_pipelining_pairs_forward_and_backward_layers():
    plain, overlapped = _moe_spec(), _moe_spec(overlap_moe_expert_parallel_comm=True)
    assert in_flight_microbatches(plain, 0) == 1
    # combined_1f1b_schedule_for_no_pipelining: microbatch i+1's forward beside i's backward,
    # counted in flight but only partly built
    assert in_flight_microbatches(overlapped, 0) == 2
    assert schedule_states(overlapped, 0) == ((0, (2,), 0),)
    a, b = activation_estimate(plain, 0, [4]), activation_estimate(overlapped, 0, [4])
    partner = paired_forward(overlapped, 4, first=True)
    assert 0 < partner.attention < partner.layer
    # model_chunk_schedule_plan.py: forward layer j beside backward layer L-1-j, so one
    # microbatch's layers plus about one more layer and the partner's inputs: never a
    # second microbatch (the old two-microbatch bound)
    grown = b.total_bytes - a.total_bytes
    assert partner.base <= grown <= partner.base + partner.layer
    assert b.saved_bytes == a.saved_bytes  # the partner is priced as working bytes
    assert grown < a.chunk_saved_bytes
    # the pair's attention backward sees one more forward layer than its MLP backward
    assert partner.held(0, "attention_backward") - partner.held(0, "mlp_backward") == (
        partner.layer - partner.attention
    )
    assert partner.held(9, "mlp_backward") == partner.base + 4 * partner.layer  # left over


def test_moe_all_to_all_overlap_with_interleaving_prices_the_paired_forward_partly():
    args = dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1,
                world_size=4, overlap_moe_expert_parallel_comm=True)  # fmt: skip
    overlapped = _moe_spec(**args)
    states = schedule_states(overlapped, 0)
    assert any(paired is not None for _, _, paired in states)  # the steady phase
    assert all(paired is None for _, _, paired in states[-2:])  # the cool-down runs alone
    act = activation_estimate(overlapped, 0, [1, 1])
    # get_pp_rank_microbatches' extra warm-up forward is in flight, but the forward paired
    # with the peak backward is not counted as fully saved
    assert act.in_flight == in_flight_microbatches(overlapped, 0)
    assert sum(act.in_flight_per_chunk) in (act.in_flight, act.in_flight - 1)
    fully = sum(n * b for n, b in zip(max((st[1] for st in states), key=sum),
                                      act.saved_per_chunk, strict=False))  # fmt: skip
    assert act.saved_bytes < fully

    with pytest.raises(ValueError, match="needs a virtual pipeline"):
        validate_spec(_moe_spec(overlap_moe_expert_parallel_comm=True,
                                pipeline_model_parallel_size=2, world_size=4))  # fmt: skip
    with pytest.raises(ValueError, match="expert parallelism > 1"):
        validate_spec(
            _moe_spec(overlap_moe_expert_parallel_comm=True, expert_model_parallel_size=1)
        )
