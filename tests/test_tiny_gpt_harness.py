"""Tests for the tiny real-megatron-core GPT harness (``memscope.demo.tiny_gpt``) on CPU/gloo."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest
import torch

from memscope.demo.launcher import WorkerError, free_ports, spawn
from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.demo.tiny_gpt_training import make_data_iterators, run_training

pytestmark = pytest.mark.integration

# No import of megatron here: spawned workers unpickle functions from this module.
needs_megatron = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="megatron-core not installed"
)

CALLBACK_ORDER = [
    "on_train_step_start",
    "on_forward_backward_end",
    "on_optimizer_step_start",
    "on_optimizer_step_end",
    "on_train_step_end",
]


class RecordingCallbacks:
    """Records every callback (name, step, summary) in call order; counts chunk forwards."""

    def __init__(self, chunks: list[torch.nn.Module]) -> None:
        self.events: list[tuple[str, int, Any]] = []
        self.step = -1
        self.forwards = 0
        for chunk in chunks:
            chunk.register_forward_pre_hook(self._count_forward)

    def _count_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.forwards += 1

    def on_train_step_start(self, *, step: int, batch: Any, notes: str) -> None:
        self.step = step
        self.forwards = 0
        self.events.append(("on_train_step_start", step, (batch, notes)))

    def on_forward_backward_end(self, *, outputs: list[dict[str, torch.Tensor]]) -> None:
        summary = (len(outputs), sorted({k for item in outputs for k in item}), self.forwards)
        self.events.append(("on_forward_backward_end", self.step, summary))

    def on_optimizer_step_start(self) -> None:
        self.events.append(("on_optimizer_step_start", self.step, None))

    def on_optimizer_step_end(self) -> None:
        self.events.append(("on_optimizer_step_end", self.step, None))

    def on_train_step_end(self, *, outputs: list[dict[str, torch.Tensor]]) -> None:
        self.events.append(("on_train_step_end", self.step, len(outputs)))


_RECORDERS: list[RecordingCallbacks] = []


def _make_recorder(chunks: list[torch.nn.Module], optimizer: Any) -> RecordingCallbacks:
    recorder = RecordingCallbacks(chunks)
    _RECORDERS.append(recorder)
    return recorder


def _jobs_worker(
    rank: int, world_size: int, jobs: list[tuple[str, int, TinyGPTConfig, int]]
) -> dict[str, dict[str, Any]]:
    """Run several trainings one after another in this process (saves megatron imports).

    Each job is (name, port, cfg, steps); every run does a full init / destroy cycle.
    """
    from memscope.demo.megatron_cpu_shims import apply_cpu_shims, shims_applied

    out: dict[str, dict[str, Any]] = {}
    for name, port, cfg, steps in jobs:
        losses = run_training(rank, world_size, port, cfg, steps, callbacks_factory=_make_recorder)
        out[name] = {
            "losses": losses,
            "events": _RECORDERS[-1].events,
            "shims": shims_applied(),
            "shims_again": apply_cpu_shims(),
        }
    return out


def _failing_worker(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("boom from rank 1")
    return rank


def _assert_finite_floats(losses: list[float | None], steps: int) -> None:
    assert len(losses) == steps
    assert all(isinstance(x, float) and math.isfinite(x) for x in losses), losses


# ----------------------------------------------------------------------------- fast, in-process


def test_config_validation() -> None:
    TinyGPTConfig().validate(2)
    TinyGPTConfig(pp=2, vpp=2, num_layers=4).validate(2)
    assert TinyGPTConfig(tp=2).dp(2) == 1
    assert TinyGPTConfig().dp(2) == 2
    with pytest.raises(ValueError):
        TinyGPTConfig(pp=2, num_layers=3).validate(2)
    with pytest.raises(ValueError):
        TinyGPTConfig(recompute="everything").validate()
    with pytest.raises(ValueError):
        TinyGPTConfig(tp=2, num_query_groups=1).validate()
    with pytest.raises(ValueError):
        TinyGPTConfig(tp=2).validate(3)


def test_synthetic_data_is_deterministic() -> None:
    cfg = TinyGPTConfig(vpp=2, pp=2, num_layers=4)
    a = make_data_iterators(cfg, dp_rank=0)
    b = make_data_iterators(cfg, dp_rank=0)
    assert len(a) == 2
    first = [next(a[0]) for _ in range(3)]
    second = [next(b[0]) for _ in range(3)]
    other_chunk = [next(a[1]) for _ in range(3)]
    for x, y, z in zip(first, second, other_chunk, strict=True):
        for key in x:
            assert torch.equal(x[key], y[key]) and torch.equal(x[key], z[key])
    batch = first[0]
    s, mbs = cfg.seq_length, cfg.micro_batch_size
    assert batch["tokens"].shape == (mbs, s) and batch["tokens"].dtype == torch.long
    assert torch.equal(batch["tokens"][:, 1:], batch["labels"][:, :-1])
    assert batch["attention_mask"].shape == (1, 1, s, s)
    assert bool(batch["attention_mask"][0, 0, 0, 1]) and not bool(
        batch["attention_mask"][0, 0, 1, 0]
    )
    assert int(batch["tokens"].max()) < cfg.vocab_size
    assert not torch.equal(first[0]["tokens"], first[1]["tokens"])
    other_dp = next(make_data_iterators(cfg, dp_rank=1)[0])
    assert not torch.equal(other_dp["tokens"], batch["tokens"])


# ----------------------------------------------------------------------------- multi-process


TP2 = TinyGPTConfig(tp=2)
TP2_SP_RECOMPUTE = TinyGPTConfig(tp=2, sequence_parallel=True, recompute="full")
PP2 = TinyGPTConfig(pp=2, num_microbatches=4)
PP2_VPP2 = TinyGPTConfig(pp=2, vpp=2, num_layers=4, num_microbatches=4)
STEPS = 3


@pytest.fixture(scope="module")
def tp_runs() -> list[dict[str, dict[str, Any]]]:
    """One 2-process launch: TP=2, then TP=2 + sequence parallel + full recompute."""
    a, b = free_ports(2)
    jobs = [("tp2", a, TP2, STEPS), ("tp2_sp", b, TP2_SP_RECOMPUTE, STEPS)]
    return spawn(2, _jobs_worker, jobs)


@pytest.fixture(scope="module")
def pp_runs() -> list[dict[str, dict[str, Any]]]:
    """Another 2-process launch: PP=2 1F1B, PP=2 x VPP=2 interleaved, and TP=2 again."""
    a, b, c = free_ports(3)
    jobs = [("pp2", a, PP2, STEPS), ("vpp", b, PP2_VPP2, 2), ("tp2", c, TP2, STEPS)]
    return spawn(2, _jobs_worker, jobs)


@needs_megatron
@pytest.mark.multiprocess
def test_tp2_trains_and_is_bit_identical(
    tp_runs: list[dict[str, dict[str, Any]]], pp_runs: list[dict[str, dict[str, Any]]]
) -> None:
    first = [r["tp2"]["losses"] for r in tp_runs]
    second = [r["tp2"]["losses"] for r in pp_runs]  # separate processes, same seed
    for per_rank in first:
        _assert_finite_floats(per_rank, STEPS)
    assert first[0] == first[1], "TP ranks must report the same loss"
    assert first == second, "same seed must give bit-identical losses"
    assert first[0][-1] < first[0][0]


@needs_megatron
@pytest.mark.multiprocess
def test_tp2_sequence_parallel_recompute_matches_tp2(
    tp_runs: list[dict[str, dict[str, Any]]],
) -> None:
    got = [r["tp2_sp"]["losses"] for r in tp_runs]
    _assert_finite_floats(got[0], STEPS)
    assert got[0] == got[1]
    reference = tp_runs[0]["tp2"]["losses"]
    for value, want in zip(got[0], reference, strict=True):
        assert value == pytest.approx(want, rel=1e-5)


@needs_megatron
@pytest.mark.multiprocess
def test_pp2_1f1b_loss_on_last_stage_and_callback_order(
    pp_runs: list[dict[str, dict[str, Any]]],
) -> None:
    rank0, rank1 = (r["pp2"] for r in pp_runs)
    assert rank0["losses"] == [None] * STEPS
    _assert_finite_floats(rank1["losses"], STEPS)
    assert rank1["losses"][-1] < rank1["losses"][0]

    for result, is_last in ((rank0, False), (rank1, True)):
        events = result["events"]
        assert [name for name, _, _ in events] == CALLBACK_ORDER * STEPS
        assert [step for _, step, _ in events] == [s for s in range(STEPS) for _ in CALLBACK_ORDER]
        batch, notes = events[0][2]
        assert batch is None
        assert "forward_backward_pipelining_without_interleaving" in notes
        num_outputs, keys, forwards = events[1][2]
        assert forwards == PP2.num_microbatches  # the real schedule ran every micro-batch
        if is_last:
            assert (num_outputs, keys) == (PP2.num_microbatches, ["lm loss"])
        else:
            assert (num_outputs, keys) == (0, [])

        assert result["shims"] and result["shims"] == result["shims_again"]
        assert any("schedules" in name for name in result["shims"])


@needs_megatron
@pytest.mark.multiprocess
def test_pp2_interleaved_virtual_pipeline(pp_runs: list[dict[str, dict[str, Any]]]) -> None:
    rank0, rank1 = (r["vpp"] for r in pp_runs)
    assert rank0["losses"] == [None, None]
    _assert_finite_floats(rank1["losses"], 2)
    notes = rank0["events"][0][2][1]
    assert "forward_backward_pipelining_with_interleaving" in notes
    # Two model chunks per rank, each runs every micro-batch.
    assert rank0["events"][1][2][2] == 2 * PP2_VPP2.num_microbatches


@pytest.mark.multiprocess
def test_spawn_propagates_worker_exception() -> None:
    with pytest.raises(WorkerError, match="boom from rank 1"):
        spawn(2, _failing_worker)
