"""OOM remedies: only those whose predicted peak, raised by the estimator's band, fits the
memory that ran out are listed, cheapest by the planner's step-time model first; the rest
are named as left out."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from memscope.analysis.oom import OomAnalyzer
from memscope.analysis.static.params import RankPosition
from memscope.analysis.static.planner import ESTIMATE_UNCERTAINTY, CostModel
from memscope.analysis.static.remedies import fitting_remedies, rank_remedies
from memscope.analysis.static.spec_checks import validate_spec
from memscope.analysis.static_comparison import StaticEstimate
from memscope.events.schema import OOM, MemoryEvent
from memscope.inputs.config_files import load_config
from memscope.reporters.oom_report import render_oom_markdown

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30


def _spec():
    spec, _ = load_config(str(ROOT / "configs/static/llama3_8b_tp4_pp2.json"), None, None)
    # no recompute, micro-batch 2: every kind of remedy has something to offer
    return validate_spec(dataclasses.replace(spec, recompute=None, micro_batch_size=2,
                               num_microbatches=spec.num_microbatches // 2))  # fmt: skip


def test_remedies_are_ranked_by_the_planners_step_time_model():
    spec = _spec()
    remedies = rank_remedies(spec, RankPosition())
    assert len(remedies) >= 2
    costs = [r.step_time for r in remedies]
    assert costs == sorted(costs)
    model = CostModel()
    for r in remedies:
        assert r.saving_bytes > 0
    # full recompute costs a third of the step more; a smaller micro-batch costs nothing in
    # the model (more microbatches even shrink the bubble): it ranks first though it saves less
    names = [r.name for r in remedies]
    assert names[0] == "micro-batch size 1" and "full recompute, one layer per checkpoint" in names
    assert remedies[0].saving_bytes < remedies[-1].saving_bytes
    full = validate_spec(dataclasses.replace(spec, recompute="full", recompute_method="uniform",
                               recompute_num_layers=1))  # fmt: skip
    by_name = {r.name: r for r in remedies}
    assert by_name["full recompute, one layer per checkpoint"].step_time == round(
        model.breakdown(full)["total"], 6)  # fmt: skip


def test_only_remedies_whose_banded_peak_fits_the_capacity_are_kept():
    rows = [{"name": n, "predicted_peak_bytes": p} for n, p in
            (("a", 90 * GiB), ("b", 70 * GiB), ("c", 75 * GiB))]  # fmt: skip
    capacity = math.ceil(75 * GiB * (1 + ESTIMATE_UNCERTAINTY))  # c at its band's edge
    kept, dropped = fitting_remedies(rows, capacity)
    assert [r["name"] for r in kept] == ["b", "c"] and [r["name"] for r in dropped] == ["a"]
    kept, dropped = fitting_remedies(rows, capacity - 1)
    assert [r["name"] for r in kept] == ["b"]
    assert fitting_remedies(rows, None) == (rows, [])  # capacity unknown: all kept


def _oom_event(allocated: int, free: int) -> MemoryEvent:
    message = (f"Tried to allocate {GiB} bytes. MemScope's storage ledger has a capacity of "
               f"{allocated + free} bytes of which {free} bytes is free. Of the allocated "
               f"memory {allocated} bytes is allocated by PyTorch.")  # fmt: skip
    return MemoryEvent(seq=1, event_type=OOM, phase="backward", step=0, module="m",
                       timestamp=0.0, rank=0, mem_allocated_before=allocated,
                       mem_allocated_after=allocated, mem_reserved_before=allocated,
                       mem_reserved_after=allocated, max_mem_allocated=allocated,
                       max_mem_reserved=allocated, notes=message)  # fmt: skip


def test_the_oom_report_lists_only_remedies_that_fit_what_ran_out():
    spec = _spec()
    remedies = [r.to_dict() for r in rank_remedies(spec, RankPosition())]
    peaks = sorted(r["predicted_peak_bytes"] for r in remedies)
    # a capacity between the lowest and highest remedy's banded peak
    capacity = int(peaks[len(peaks) // 2] * (1 + ESTIMATE_UNCERTAINTY))
    analyzer = OomAnalyzer(StaticEstimate({"remedies": remedies}))
    analyzer.consume(_oom_event(capacity - GiB // 2, GiB // 2))
    oom = analyzer.sections({})["oom"]
    assert oom["remedy_capacity_bytes"] == capacity
    listed = oom["remedies"]
    assert listed and oom["remedies_dropped"]
    assert all(r["predicted_peak_bytes"] * (1 + ESTIMATE_UNCERTAINTY) <= capacity for r in listed)
    assert all(r["predicted_peak_bytes"] * (1 + ESTIMATE_UNCERTAINTY) > capacity
               for r in oom["remedies_dropped"])  # fmt: skip
    assert [r["step_time"] for r in listed] == sorted(r["step_time"] for r in listed)
    md = render_oom_markdown({"rank": 0, "world_size": 1, **oom})
    assert "Left out, predicted peak too high for the capacity" in md
    assert oom["remedies_dropped"][0]["name"] in md and "step time" in md
