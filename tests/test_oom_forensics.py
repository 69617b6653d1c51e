"""OOM forensics on a real megatron-core GPT: the storage backend's capacity limit makes the
run fail exactly where its peak would be (mid-backward); the OOM report names that step,
phase, module and microbatch, says it is a capacity OOM, holds what was live, and ranks
remedies that fit the capacity, whose predicted saving is checked by re-running with the top
one: it then fits."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from conftest import load_json, run_in_process

from memscope.analysis.oom import parse_oom_message
from memscope.analysis.static.planner import ESTIMATE_UNCERTAINTY
from memscope.demo.tiny_gpt import TinyGPTConfig

pytestmark = pytest.mark.integration

STEPS = 3


def _apply(cfg: TinyGPTConfig, args: dict[str, Any]) -> TinyGPTConfig:
    """A remedy's Megatron args on the tiny GPT harness's settings."""
    if "micro_batch_size" in args:
        factor = cfg.micro_batch_size // args["micro_batch_size"]
        return dataclasses.replace(cfg, micro_batch_size=args["micro_batch_size"],
                                   num_microbatches=cfg.num_microbatches * factor)  # fmt: skip
    if "recompute_granularity" in args:
        return dataclasses.replace(cfg, recompute=args["recompute_granularity"])
    raise AssertionError(f"no harness setting for {args}")


def _argv(outdir, capacity: int | None = None) -> list[str]:
    argv = ["--memscope", "--memscope-outdir", str(outdir)]
    if capacity is not None:
        argv += ["--memscope-storage-capacity-mib", repr(capacity / 2**20)]
    return argv


@pytest.fixture(scope="module")
def oom_run(tmp_path_factory, small_cfg) -> tuple[dict[str, Any], int, Any]:
    """A run without a limit (its report), the capacity one byte short of its peak, and the
    rank folder of the same run under that capacity (which fails).

    Two runs of one config in one process can peak a few bytes apart on a loaded machine
    (gloo's worker thread releases a collective's tensors at its own pace): when the limited
    run does not fail, it peaked lower, so it is the run without a limit for the next try."""
    root = tmp_path_factory.mktemp("oom")
    reference = load_json(run_in_process(small_cfg, STEPS, _argv(root / "free")).report_path)
    peaks = []
    for attempt in range(3):
        capacity = reference["peak"]["memory_bytes"] - 1
        outdir = root / f"oom{attempt}"
        try:
            lower = run_in_process(small_cfg, STEPS, _argv(outdir, capacity))
        except torch.OutOfMemoryError:
            return reference, capacity, outdir / "rank00000"
        reference = load_json(lower.report_path)
        peaks.append(reference["peak"]["memory_bytes"])
        assert peaks[-1] <= capacity  # it fitted: it peaked below the run before
    pytest.fail(f"no run failed one byte below the peak of the run before it: {peaks}")


def test_an_oom_report_names_where_it_failed_and_its_top_remedy_fits(oom_run, tmp_path, small_cfg):
    free, capacity, rank = oom_run
    peak = free["peak"]
    doc = load_json(str(rank / "oom_report.json"))
    assert doc["report_type"] == "oom" and doc["rank"] == 0 and doc["world_size"] == 1
    # it failed at the allocation that sets the peak of the run without the limit
    where = doc["where"]
    assert (where["step"], where["phase"], where["module"]) == (
        peak["step"], peak["phase"], peak["module"])  # fmt: skip
    # the step's microbatches reach that module's backward within a few bytes of each other:
    # the one that fails first is a near tie (one loaded clean-clone run failed in the other)
    assert where["microbatch"] in range(small_cfg.num_microbatches)
    assert where["phase"] == "backward"
    assert doc["op"].startswith("aten.")  # the op whose output did not fit
    assert doc["verdict"] == "capacity" and doc["cached_free_bytes"] == 0
    assert doc["requested_bytes"] > 0
    assert doc["allocated_bytes"] + doc["requested_bytes"] > capacity >= doc["allocated_bytes"]
    assert sum(i["bytes"] for i in doc["composition"]) == doc["allocated_bytes"]
    assert doc["trend"] == "spike"
    runtime = load_json(str(rank / "runtime_report.json"))
    assert runtime["status"] == "oom" and runtime["oom"]["where"] == where
    assert "capacity OOM" in (rank / "oom_report.md").read_text()
    # remedies whose banded predicted peak fits what ran out, cheapest step time first; the
    # top one applied, the run fits
    remedies = doc["remedies"]
    assert remedies and [r["step_time"] for r in remedies] == sorted(
        r["step_time"] for r in remedies)  # fmt: skip
    band = 1 + ESTIMATE_UNCERTAINTY
    assert all(r["predicted_peak_bytes"] * band <= doc["remedy_capacity_bytes"] for r in remedies)
    top = remedies[0]
    fixed_cfg = _apply(small_cfg, top["args"])
    fixed = run_in_process(fixed_cfg, STEPS, _argv(tmp_path / "fixed", capacity))
    report = load_json(fixed.report_path)
    assert report["status"] == "complete" and report["oom"] is None
    measured = peak["memory_bytes"] - report["peak"]["memory_bytes"]
    assert measured == pytest.approx(top["saving_bytes"], rel=0.03)  # the estimator's claim


def test_oom_messages_are_read_in_the_cuda_allocators_wording():
    cuda = (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 3.19 MiB is free. Process 1 has 79.09 GiB memory in use. Of the "
        "allocated memory 78.50 GiB is allocated by PyTorch, and 120.00 MiB is reserved by "
        "PyTorch but unallocated."
    )
    assert parse_oom_message(cuda) == (20 * 2**20, int(3.19 * 2**20), int(78.5 * 2**30))
    assert parse_oom_message("boom") == (None, None, None)


def test_the_peak_of_a_step_that_never_ended_is_not_given_an_older_steps_context(oom_run):
    report = load_json(str(oom_run[2] / "runtime_report.json"))
    peak = report["peak"]
    # the highest reading is in step 1, where training died, never step 0's exact record
    assert peak["step"] == 1
    if peak["attribution"] == "exact":
        # a phase record of step 1 itself (one that ended before the failing backward) held
        # the highest reading: the backward died before passing it (one clean-clone CI run
        # saw this order); its composition is then that record's, whole
        assert sum(peak["categories"].values()) == peak["memory_bytes"]
    else:  # a hook reading of the backward that died: its own event, no composition
        assert peak["attribution"] == "interval"
        assert "categories" not in peak and "composition" not in peak


def test_the_job_page_lists_the_ranks_that_ran_out_and_the_others_headroom(
    oom_run, tmp_path, small_cfg
):
    import shutil

    from memscope.analysis.job import RankEntry, summarize_job
    from memscope.cli import main

    _, capacity, oom_rank = oom_run
    roomy = 2 * capacity
    fits = run_in_process(small_cfg, STEPS, _argv(tmp_path / "fits", roomy))
    job = tmp_path / "job"
    shutil.copytree(oom_rank, job / "rank00000")
    shutil.copytree(tmp_path / "fits" / "rank00000", job / "rank00001")
    reports = [load_json(str(job / f"rank0000{r}" / "runtime_report.json")) for r in (0, 1)]
    summary = summarize_job([RankEntry(r, rep) for r, rep in enumerate(reports)])["oom"]
    assert [o["rank"] for o in summary["ranks"]] == [0]
    assert summary["ranks"][0]["where"]["phase"] == "backward"
    peak = load_json(fits.report_path)["peak"]
    assert (summary["tightest_rank"], summary["tightest_headroom"]) == (
        1, roomy - peak["reserved_bytes"])  # fmt: skip
    # two single-rank runs put side by side: the job view refuses them unless told to merge
    assert main(["visualize-runtime", "--report", str(job)]) == 2
    assert main(["visualize-runtime", "--report", str(job), "--allow-mixed-runs"]) == 0
    assert '"tightest_rank":1' in (job / "job_report.html").read_text()


@pytest.mark.integration
def test_an_oom_after_a_leak_names_the_leak_and_leads_with_fixing_it(tmp_path, small_cfg):
    leaked = small_cfg.seq_length * small_cfg.micro_batch_size * small_cfg.hidden_size * 4
    leaking = run_in_process(small_cfg, 3, _argv(tmp_path / "free"), leak_from_step=0)
    free = load_json(leaking.report_path)
    # room for four and a half more leaked outputs above step 1's peak: fails in step 6
    capacity = free["steps"][1]["peak_allocated"] + 9 * leaked // 2
    with pytest.raises(torch.OutOfMemoryError):
        run_in_process(small_cfg, 10, _argv(tmp_path / "oom", capacity), leak_from_step=0)
    rank = tmp_path / "oom" / "rank00000"
    doc = load_json(str(rank / "oom_report.json"))
    assert doc["trend"] == "growth" and doc["where"]["step"] == 6
    leak = doc["leak"]
    assert (leak["bytes_per_step"], leak["first_step"]) == (leaked, 1)
    assert leak["suspect"]["module"] == "decoder.layers.0.mlp.linear_fc2"
    assert doc["trend_reason"].startswith("a leak: allocated grew 16384 bytes per step")
    assert "decoder.layers.0.mlp.linear_fc2" in doc["trend_reason"]
    first, *settings = doc["remedies"]  # the leak first, then the estimator's settings
    assert first["name"] == "fix the leak" and "linear_fc2" in first["note"]
    assert settings and all(r["name"] != "fix the leak" for r in settings)
    text = (rank / "oom_report.md").read_text()
    assert "- cause: **a leak**: allocated grew 16.00 KiB per step since step 1" in text
    assert text.index("fix the leak") < text.index("micro-batch size")
