"""``job_summary.json`` gathered through gloo's own store by a real 2-process PP=2 job: with
both ranks alive, and with one rank killed mid-run (the survivor is not held, and the summary
names the missing rank)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import load_json
from harness import instrumented_worker

from memscope.demo.launcher import WorkerError, free_port, spawn
from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.events.file_names import JOB_SUMMARY_NAME

pytestmark = [pytest.mark.multiprocess, pytest.mark.integration]

PP2 = TinyGPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_microbatches=2, pp=2)
TIMEOUT_S = 4.0


def _argv(outdir: str) -> list[str]:
    return ["--memscope", "--memscope-outdir", outdir,
            "--memscope-job-summary-timeout", str(TIMEOUT_S)]  # fmt: skip


def test_both_ranks_summaries_reach_rank_0_through_the_process_groups_store(tmp_path):
    results = spawn(2, instrumented_worker, free_port(), PP2, 3, _argv(str(tmp_path)))
    doc = load_json(str(tmp_path / JOB_SUMMARY_NAME))
    assert (doc["world_size"], doc["ranks_reported"], doc["missing_ranks"]) == (2, 2, [])
    assert doc["collection"]["waited_s"] < TIMEOUT_S  # nobody was waited for in vain
    for result, summary in zip(results, doc["ranks"], strict=True):
        report = load_json(result.report_path)
        assert summary["rank"] == result.rank and summary["status"] == "complete"
        assert summary["peak"]["memory_bytes"] == report["peak"]["memory_bytes"]
        assert summary["metadata"]["pp_rank"] == report["metadata"]["pp_rank"] == result.rank
    assert doc["run_id"] == doc["ranks"][1]["metadata"]["run_id"]
    assert doc["start_time"] == doc["ranks"][0]["metadata"]["start_time"]  # the writer's
    assert doc["hostname"] == doc["ranks"][0]["metadata"]["hostname"]
    assert doc["ranks"][0]["training"]["num_microbatches"] == PP2.num_microbatches
    # the job page explains the stages: each one's in-flight microbatches at its peak, as
    # Megatron's 1F1B arithmetic predicts (2 microbatches: stage 0 holds 2, stage 1 one), and
    # the imbalance by term
    from memscope.cli import main

    page = tmp_path / "job.html"
    assert main(["visualize-runtime", "--report", str(tmp_path / JOB_SUMMARY_NAME),
                 "--out", str(page)]) == 0  # fmt: skip
    text = page.read_text()
    data = json.loads(text.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    stages = data["stages"]
    assert [(s["pp_rank"], s["in_flight_measured"], s["in_flight_predicted"]) for s in stages] == [
        (0, 2, 2), (1, 1, 1)]  # fmt: skip
    for stage, result in zip(stages, results, strict=True):
        report = load_json(result.report_path)
        assert stage["max_terms"] == report["peak"]["categories"]
        predicted = {c["component"]: c["static_bytes"]
                     for c in report["comparisons"]["components"]}  # fmt: skip
        assert stage["max_predicted_terms"] == predicted
    heavy = data["imbalance_by_term"]
    assert heavy["heaviest_stage"] == 0 and "activations" in heavy["sentence"]
    assert "(2 vs 1 microbatches in flight)" in heavy["sentence"]


def test_a_rank_killed_mid_run_is_named_missing_and_the_other_is_not_held(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as failed:
        # (fault, leak_from_step, late_free, kill_rank_at_step): spawn passes them by position
        plants = (None, None, False, (1, 2))
        spawn(2, instrumented_worker, free_port(), PP2, 4, _argv(str(tmp_path)), *plants,
              grace=3 * TIMEOUT_S, timeout=300)  # fmt: skip
    elapsed = time.monotonic() - t0
    # rank 1 vanished without a word; rank 0's pipeline receive failed and training stopped
    assert "rank 1" in str(failed.value) and "without reporting" in str(failed.value)
    doc = load_json(str(tmp_path / JOB_SUMMARY_NAME))
    assert [m["rank"] for m in doc["missing_ranks"]] == [1]
    assert f"no summary within {TIMEOUT_S:g} s" in doc["missing_ranks"][0]["reason"]
    (survivor,) = doc["ranks"]
    assert survivor["rank"] == 0 and survivor["status"] == "crashed"
    assert survivor["metadata"]["last_step"] == 2  # it got as far as the step rank 1 died in
    assert TIMEOUT_S <= doc["collection"]["waited_s"] < TIMEOUT_S + 2
    assert elapsed < 120
    # the killed rank's own folder keeps the report it last wrote, marked as never finished
    dead = load_json(str(tmp_path / "rank00001" / "runtime_report.json"))
    assert dead["status"] == "running" and not dead["complete"]


def test_the_writer_rank_logs_every_ranks_step_peak_and_the_job_maximum(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "tensorboard"
    # (fault, leak_from_step, late_free, kill_rank_at_step, tensorboard_dir) by position
    plants = (None, None, False, None, str(board))
    results = spawn(2, instrumented_worker, free_port(), PP2, 4, _argv(str(tmp_path)), *plants)
    events = EventAccumulator(str(board))
    events.Reload()
    series = {tag: {e.step: e.value for e in events.Scalars(tag)}
              for tag in events.Tags()["scalars"]}  # fmt: skip
    rows = {r.rank: load_json(r.report_path)["steps"] for r in results}
    # on Megatron's iteration axis: the iteration logged after step s is s + 1
    per_rank = {rank: {row["step"] + 1: row["peak_allocated"] for row in steps}
                for rank, steps in rows.items()}  # fmt: skip
    steps = sorted(per_rank[0])
    assert steps == [1, 2, 3, 4]
    prefix = "memscope/peak-allocated-bytes/"
    for rank in (0, 1):  # each rank's own peaks, as its report has them
        assert series[f"{prefix}rank{rank}"] == pytest.approx(per_rank[rank], rel=1e-6)
    job_max = {s: max(per_rank[r][s] for r in (0, 1)) for s in steps}
    assert series[prefix + "job-max"] == pytest.approx(job_max, rel=1e-6)
    heaviest = {s: float(max((0, 1), key=lambda r: (per_rank[r][s], -r))) for s in steps}
    assert series[prefix + "job-max-rank"] == heaviest
    assert set(series[prefix + "ranks-reported"].values()) == {2.0}
