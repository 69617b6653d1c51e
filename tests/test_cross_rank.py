"""The job explained by term (``memscope.analysis.cross_rank``) on rank rows in the job
summary's format: per-stage peaks and terms, in-flight microbatches, headroom and its binding
term, the imbalance sentence, outliers attributed to a term, and the grid."""

from __future__ import annotations

from typing import Any

from memscope.analysis.cross_rank import OUTLIER_SHARE, explain_job

MiB = 1 << 20


def _row(rank: int, pp: int, tp: int, dp: int, activations: int, **extra: Any) -> dict[str, Any]:
    """A rank of a PP=2 TP=2 DP=4 job: model state alike everywhere, activations per stage."""
    terms = {"parameters": 100 * MiB, "gradients": 100 * MiB, "optimizer_state": 150 * MiB,
             "activations": activations, "other": 0}  # fmt: skip
    terms.update(extra.pop("terms", {}))
    peak = sum(terms.values())
    return {"rank": rank, "status": "complete", "pp_rank": pp, "tp_rank": tp, "dp_rank": dp,
            "cp_rank": None, "ep_rank": None, "peak_allocated": peak, "terms": terms,
            "in_flight_measured": 2 if pp == 0 else 1, "in_flight_predicted": 2 if pp == 0 else 1,
            "capacity": 1024 * MiB, "headroom": 1024 * MiB - peak, **extra}  # fmt: skip


def _job() -> list[dict[str, Any]]:
    rows = []
    for rank in range(16):
        pp, tp, dp = rank // 8, rank % 2, (rank // 2) % 4
        activations = 2 * 60 * MiB if pp == 0 else 60 * MiB
        extra: dict[str, Any] = {}
        if rank == 13:  # one last-stage rank holds 40 MiB more "other" (a stray buffer)
            extra["terms"] = {"other": 40 * MiB}
        rows.append(_row(rank, pp, tp, dp, activations, **extra))
    rows.append({"rank": 16, "status": "missing", "problem": "no summary"})
    return rows


def test_each_stage_names_its_heaviest_rank_its_terms_and_its_tightest_headroom():
    stages = explain_job(_job())["stages"]
    assert [s["pp_rank"] for s in stages] == [0, 1] and [s["ranks"] for s in stages] == [8, 8]
    first, last = stages
    assert first["peak_max"] == first["peak_min"] == (350 + 120) * MiB
    assert (first["in_flight_measured"], first["in_flight_predicted"]) == (2, 2)
    assert first["max_terms"]["activations"] == 120 * MiB
    assert (last["max_rank"], last["peak_max"]) == (13, (350 + 60 + 40) * MiB)
    assert last["least_headroom_rank"] == 13 and last["least_headroom"] == 574 * MiB
    assert first["binding_term"] == "optimizer_state"  # the largest term at its peak


def test_the_imbalance_is_said_term_by_term():
    imbalance = explain_job(_job())["imbalance_by_term"]
    assert (imbalance["heaviest_stage"], imbalance["lightest_stage"]) == (0, 1)
    assert imbalance["gap_bytes"] == 20 * MiB
    assert imbalance["term_deltas"] == {"activations": 60 * MiB, "other": -40 * MiB}
    assert imbalance["sentence"] == (
        "stage 0 (rank 0) peaks 20.00 MiB above stage 1 (rank 13): activations +60.00 MiB "
        "(2 vs 1 microbatches in flight), other -40.00 MiB"
    )


def test_an_outlier_within_its_stage_is_attributed_to_the_term_that_differs():
    (outlier,) = explain_job(_job())["outliers"]
    assert (outlier["rank"], outlier["pp_rank"], outlier["term"]) == (13, 1, "other")
    assert outlier["term_delta"] == 40 * MiB
    assert outlier["deviation"] == 40 / 410 > OUTLIER_SHARE


def test_the_grid_has_one_cell_per_reported_rank_by_stage_and_coordinates():
    grid = explain_job(_job())["grid"]
    assert grid["stages"] == [0, 1] and len(grid["columns"]) == 8
    assert grid["columns"][:2] == ["dp0 tp0", "dp0 tp1"]
    cells = {rank: (stage, col, peak) for stage, col, rank, peak in grid["cells"]}
    assert sorted(cells) == list(range(16))  # the missing rank has no cell
    assert cells[13][:2] == (1, grid["columns"].index("dp2 tp1"))


def test_a_job_without_peaks_or_with_one_stage_explains_nothing_it_cannot():
    assert explain_job([{"rank": 0, "status": "missing"}])["stages"] == []
    one_stage = [_row(r, 0, r, 0, 10 * MiB) for r in range(2)]
    explained = explain_job(one_stage)
    assert explained["imbalance_by_term"] == {} and explained["outliers"] == []


def test_terms_that_differ_equally_are_said_in_name_order_under_any_hash_seed():
    """Equal deltas are ranked by name, so the sentence and the committed example pages do not
    change with the process's string hashing (set order)."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json\nfrom memscope.analysis.cross_rank import explain_job\n"
        "rows = [{'rank': r, 'status': 'complete', 'pp_rank': r, 'tp_rank': 0, 'dp_rank': 0,"
        " 'peak_allocated': 10 - r, 'terms': {k: (5 - 4 * r) for k in 'edcbaf'}} for r in (0, 1)]\n"
        "print(json.dumps(list(explain_job(rows)['imbalance_by_term']['term_deltas'])))"
    )
    seen = set()
    for seed in range(6):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        command = [sys.executable, "-c", script]
        res = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr[-2000:]
        seen.add(tuple(json.loads(res.stdout)))
    assert seen == {("a", "b", "c", "d", "e", "f")}
