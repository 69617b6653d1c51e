"""The job summary gathered in-run (``memscope.session.job_exchange``): ranks publish through
a real ``torch.distributed`` store, the collector names who did not arrive within its time,
and ``visualize-runtime`` makes the job page from ``job_summary.json``."""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import pytest
import torch.distributed as dist
from conftest import load_json

from memscope.analysis.job import SUMMARY_ITEMS, SUMMARY_STEPS, rank_summary
from memscope.cli import main
from memscope.events.file_names import JOB_SUMMARY_NAME
from memscope.reporters.job_summary_json import REPORT_TYPE_JOB_SUMMARY
from memscope.session.job_exchange import (
    JobSummaryExchange,
    bounded,
    decode_summary,
    share_job_summary,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"


def _real_reports() -> dict[int, dict]:
    """The two rank reports of a real PP=2 run (the repository's example)."""
    return {r: load_json(str(EXAMPLE / f"rank{r:05d}" / "runtime_report.json")) for r in (0, 1)}


def test_the_collector_names_the_rank_that_never_published_within_its_time():
    store = dist.HashStore()
    ranks = [JobSummaryExchange(store, r, range(4)) for r in range(4)]
    for rank in (0, 1, 3):
        ranks[rank].publish({"rank": rank, "status": "complete"})
    ranks[1].publish({"rank": 1, "status": "complete", "again": True})  # replaced, counted once
    t0 = time.monotonic()
    got = ranks[0].collect(timeout_s=0.5, poll_s=0.05)
    waited = time.monotonic() - t0
    assert sorted(got.summaries) == [0, 1, 3] and got.summaries[1]["again"] is True
    assert list(got.missing) == [2] and "no summary within 0.5 s" in got.missing[2]
    assert 0.5 <= waited < 2.0


def test_collection_ends_as_soon_as_every_rank_is_in():
    store = dist.HashStore()
    ranks = [JobSummaryExchange(store, r, range(3)) for r in range(3)]
    for r in ranks:
        r.publish({"rank": r.rank})
    t0 = time.monotonic()
    got = ranks[0].collect(timeout_s=30.0)
    assert time.monotonic() - t0 < 1.0 and not got.missing and len(got.summaries) == 3


def test_an_unreadable_summary_is_a_missing_rank_with_the_reason():
    store = dist.HashStore()
    collector = JobSummaryExchange(store, 0, [0, 1])
    collector.publish({"rank": 0})
    store.set(collector.key(1), b"not zlib at all")
    store.add(f"{collector.prefix}/count", 1)
    got = collector.collect(timeout_s=1.0)
    assert list(got.summaries) == [0] and got.missing[1].startswith("unreadable summary (error")
    with pytest.raises(ValueError, match="expected a JSON object"):
        decode_summary(zlib.compress(b"[1, 2]"))


def test_a_store_call_that_hangs_is_cut_off_at_its_deadline():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"took longer than 0\.2 s"):
        bounded(lambda: time.sleep(5), 0.2, "publish")
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(KeyError):
        bounded(lambda: {}["x"], 1.0, "read")


def test_a_summary_keeps_what_the_job_page_needs_and_stays_small():
    report = _real_reports()[0]
    rows = [dict(report["steps"][-1], step=i, peak_allocated=1000 + i) for i in range(500)]
    rows[321]["peak_allocated"] = 10**9
    items = [
        {
            "category": "activations",
            "phase": "forward",
            "module": f"m{i}",
            "microbatch": 0,
            "virtual_chunk": None,
            "bytes": i,
        }
        for i in range(100)
    ]
    composition = {"source": "storage_ledger", "items": items, "total_bytes": sum(range(100))}
    big = {**report, "steps": rows,
           "peak": {**report["peak"], "composition": composition}}  # fmt: skip
    summary = rank_summary(big)
    assert "runtime_trace" not in summary and "module_summary" not in summary
    assert len(summary["steps"]) <= SUMMARY_STEPS and summary["steps_total"] == 500
    assert any(row["step"] == 321 for row in summary["steps"])  # the peak step survives
    kept = summary["peak"]["composition"]
    assert len(kept["items"]) == SUMMARY_ITEMS and kept["items_total"] == 100
    assert summary["peak"]["memory_bytes"] == report["peak"]["memory_bytes"]
    assert len(json.dumps(rank_summary(report))) < 32_000


def test_job_summary_json_makes_the_job_page_with_the_missing_rank(tmp_path, capsys):
    reports = _real_reports()
    store = dist.HashStore()
    # rank 1 of a 3-rank job publishes; rank 2 never does; rank 0 collects and writes
    JobSummaryExchange(store, 1, range(3), generation=7).publish(rank_summary(reports[1]))
    path = share_job_summary(
        rank_summary(reports[0]), rank=0, world_size=3, expected=range(3),
        outdir=str(tmp_path), run_id="job-1", timeout_s=0.3, store=store, generation=7,
    )  # fmt: skip
    assert path == str(tmp_path / JOB_SUMMARY_NAME)
    doc = load_json(path)
    assert doc["report_type"] == REPORT_TYPE_JOB_SUMMARY and doc["world_size"] == 3
    assert doc["collection"]["transport"] == "torch.distributed store"
    reported = [r["rank"] for r in doc["ranks"]]
    missing = [m["rank"] for m in doc["missing_ranks"]]
    assert (reported, missing) == ([0, 1], [2])
    assert doc["ranks"][1]["peak"]["memory_bytes"] == reports[1]["peak"]["memory_bytes"]
    rc = main(["visualize-runtime", "--report", str(tmp_path / JOB_SUMMARY_NAME)])
    out = capsys.readouterr().out.strip()
    assert rc == 0 and out == str(tmp_path / "job_report.html")
    page = Path(out).read_text()
    data = json.loads(page.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    rows = {row["rank"]: row for row in data["ranks"]}
    assert rows[0]["peak_allocated"] == reports[0]["peak"]["memory_bytes"]
    assert rows[2]["status"] == "missing" and "no summary within 0.3 s" in rows[2]["problem"]


def test_a_single_process_writes_its_own_job_summary_without_a_process_group(tmp_path):
    report = _real_reports()[0]
    path = share_job_summary(
        rank_summary(report), rank=0, world_size=1, expected=[0], outdir=str(tmp_path),
        run_id="solo", timeout_s=5.0,
    )  # fmt: skip
    doc = load_json(str(path))
    assert doc["collection"]["transport"] == "single process" and doc["ranks_reported"] == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema_version": "1.1", "report_type": "static"}', "is a 'static' report"),
        ('{"schema_version": "1.1", "report_type": "job_summary", "ranks": {}, '
         '"missing_ranks": []}', "malformed job summary (ranks and missing_ranks must be lists)"),
        ('{"schema_version": "1.1", "report_type": "job_summary", "ranks": [{"rank": -1}], '
         '"missing_ranks": []}', "ranks[0] has no valid rank"),
        ('{"schema_version": "1.1", "report_type": "job_summary", "ranks": [', "truncated JSON"),
    ],
)  # fmt: skip
def test_a_bad_job_summary_is_one_line_and_exit_code_2(tmp_path, capsys, content, message):
    path = tmp_path / JOB_SUMMARY_NAME
    path.write_text(content)
    assert main(["visualize-runtime", "--report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not (tmp_path / "job_report.html").exists()


def test_two_runs_into_one_outdir_keep_one_job_summary_each(tmp_path):
    """A second run (another run id) writing into the same output folder keeps the first
    run's job_summary.json beside its own, renamed with its run id; the same run again
    replaces its own."""
    report = _real_reports()[0]

    def write(run_id: str) -> str:
        return share_job_summary(
            rank_summary(report), rank=0, world_size=1, expected=[0], outdir=str(tmp_path),
            run_id=run_id, timeout_s=5.0,
        )  # fmt: skip

    path = write("run-a")
    write("run-b")
    assert load_json(path)["run_id"] == "run-b"
    kept = tmp_path / "job_summary.prev-run-a.json"
    assert load_json(str(kept))["run_id"] == "run-a"
    write("run-b")  # the same run writing again replaces its own
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "job_summary.json", "job_summary.prev-run-a.json"]  # fmt: skip
    (tmp_path / "job_summary.json").write_text("{trunc")
    write("run-c")  # an unreadable one is kept too, never silently replaced
    assert (tmp_path / "job_summary.prev-unreadable.json").read_text() == "{trunc"
