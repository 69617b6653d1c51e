"""The run id: agreed through the job's store when no launcher names the run, and recorded
with the training settings memory depends on."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from memscope.integrations.megatron.training_settings import SPEC_FROM_MODEL
from memscope.session import run_identity as ri


@pytest.fixture
def no_launcher_id(monkeypatch):
    for var in ("MEMSCOPE_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    ri.run_identity.cache_clear()
    yield
    ri.run_identity.cache_clear()


def test_the_first_offer_in_the_store_is_every_ranks_run_id(no_launcher_id):
    store = dist.HashStore()
    first, note = ri.agreed_run_identity(store)
    assert note == "" and first.source == ri.STORE_SOURCE
    assert first.run_id == ri.run_identity().run_id  # this process offered first
    # another rank of the launch (another process, another own id) gets the same one
    other = dist.HashStore()
    other.set(ri.STORE_KEY, "host-b-42-1700000000")
    second, _ = ri.agreed_run_identity(other)
    assert second.run_id == "host-b-42-1700000000" and second.source == ri.STORE_SOURCE


def test_a_launchers_run_id_wins_over_the_store(no_launcher_id, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-7")
    ri.run_identity.cache_clear()
    store = dist.HashStore()
    run, note = ri.agreed_run_identity(store)
    assert (run.run_id, run.source, note) == ("elastic-7", "TORCHELASTIC_RUN_ID", "")
    assert not store.check([ri.STORE_KEY])  # nothing offered


def test_a_failing_store_leaves_the_process_its_own_id_and_says_so(no_launcher_id):
    class Broken:
        def compare_set(self, key, expected, desired):
            raise RuntimeError("store server gone")

    run, note = ri.agreed_run_identity(Broken())  # type: ignore[arg-type]
    assert run.source == "process" and "store server gone" in note and run.run_id in note


def test_without_a_process_group_the_process_keeps_its_own_id(no_launcher_id):
    run, note = ri.agreed_run_identity(None)
    assert (run.source, note) == ("process", "")


@pytest.mark.integration  # trains megatron-core in this process (the traced_run fixture)
def test_the_report_records_run_host_world_size_and_training_settings(traced_run, small_cfg):
    _, report, _ = traced_run
    meta = report["metadata"]
    assert meta["run_id"] and meta["start_time"] and meta["hostname"] and report["world_size"] == 1
    assert meta["run_id_source"] == ri.STORE_SOURCE  # a process group of one still has a store
    training = report["training"]
    assert training["seq_length"] == small_cfg.seq_length
    assert training["micro_batch_size"] == small_cfg.micro_batch_size
    assert training["num_microbatches"] == small_cfg.num_microbatches
    assert training["recompute_granularity"] is None
    assert training["static_spec"] == SPEC_FROM_MODEL  # the tiny GPT is a megatron-core model
    from memscope.reporters.markdown import render_runtime_markdown

    text = render_runtime_markdown(report)
    assert f"- run: `{meta['run_id']}` (torch.distributed store)" in text
    cfg = small_cfg
    assert f"sequence length {cfg.seq_length}, micro-batch {cfg.micro_batch_size}" in text


def test_training_settings_derive_microbatches_and_name_recompute():
    from argparse import Namespace

    from memscope.capture.parallel import ParallelInfo
    from memscope.integrations.megatron.training_settings import training_settings

    args = Namespace(seq_length=4096, micro_batch_size=2, global_batch_size=64,
                     recompute_granularity="full", recompute_method="block",
                     recompute_num_layers=3)  # fmt: skip
    got = training_settings(args, ParallelInfo(world_size=8, dp_size=4), "spec.yaml")
    assert got["num_microbatches"] == 8  # 64 / (2 x 4)
    assert (got["recompute_method"], got["recompute_num_layers"]) == ("block", 3)
    args.recompute_granularity = None
    off = training_settings(args, ParallelInfo(world_size=8, dp_size=3), None)
    assert off["num_microbatches"] is None  # 64 does not divide by 2 x 3
    assert (off["recompute_method"], off["static_spec"]) == (None, None)


def test_global_batch_is_what_one_step_consumes_when_the_args_do_not_say():
    from argparse import Namespace

    from memscope.capture.parallel import ParallelInfo
    from memscope.integrations.megatron.training_settings import training_settings

    args = Namespace(seq_length=128, micro_batch_size=2, num_microbatches=4)
    got = training_settings(args, ParallelInfo(world_size=6, dp_size=3), None)
    assert (got["global_batch_size"], got["num_microbatches"]) == (24, 4)  # 2 x 4 x 3
    assert training_settings(Namespace(), ParallelInfo(), None)["global_batch_size"] is None
