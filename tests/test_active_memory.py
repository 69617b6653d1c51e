"""The active-memory timeline of one step (``memscope.analysis.active_memory``), on snapshot
dictionaries in the documented ``torch.cuda.memory._snapshot()`` format: the bands sum to the
allocator's allocated bytes at every sample, the highest sample is the step's true peak and
its split by category is the peak composition's, and the series stays bounded."""

from __future__ import annotations

from typing import Any

import pytest
from test_allocator_timeline import SEG, _event, _snapshot

from memscope.analysis.active_memory import CONSTANT, MERGED, active_memory, band_label
from memscope.analysis.allocator_timeline import peak_composition, replay
from memscope.events.ownership import OwnedRange, OwnerCategory, OwnershipIndex
from memscope.events.schema import ActiveMemory, ContextMarker, TimelineSummary

P, G = SEG, SEG + 0x100000
OWNERS = OwnershipIndex(
    [
        OwnedRange(P, P + 1024, "decoder.weight", OwnerCategory.PARAMETERS),
        OwnedRange(G, G + 1024, "ddp.buffers[0].grad_data", OwnerCategory.GRADIENTS, True),
    ]
)


def _two_steps() -> tuple[dict[str, Any], list[ContextMarker]]:
    """Step 0 allocates and frees two activations; step 1 three, its peak in backward."""
    a = [SEG + 0x200000 + k * 0x10000 for k in range(5)]
    trace = [
        _event("alloc", a[0], 4096, 100),
        _event("alloc", a[1], 4096, 110),
        _event("free_requested", a[0], 4096, 120),
        _event("free_requested", a[1], 4096, 130),
        _event("alloc", a[2], 8192, 200),  # step 1 forward
        _event("alloc", a[3], 8192, 210),
        _event("free_completed", a[3], 8192, 211),  # moves nothing
        _event("alloc", a[4], 2048, 220),  # step 1 backward: the peak
        _event("free_requested", a[4], 2048, 230),
        _event("free_requested", a[3], 8192, 240),
        _event("free_requested", a[2], 8192, 250),
    ]
    markers = [
        ContextMarker(90, "forward", "layer", 0, 0, step=0),
        ContextMarker(195, "forward", "layer", 0, 0, step=1),
        ContextMarker(205, "forward", "mlp", 0, 0, step=1),
        ContextMarker(215, "backward", "mlp", 0, 0, step=1),
    ]
    return _snapshot(trace, {P: 1024, G: 1024}), markers


def _totals(timeline: ActiveMemory) -> list[int]:
    return [sum(b.values[k] for b in timeline.bands) for k in range(len(timeline.time_us))]


def test_the_bands_sum_to_the_allocated_bytes_through_the_step():
    snap, markers = _two_steps()
    timeline = active_memory(snap, owners=OWNERS, markers=markers, step=1)
    assert timeline is not None and timeline.step == 1
    # before the step, then after each alloc / free_requested of the step (not free_completed)
    assert _totals(timeline) == [2048, 10240, 18432, 20480, 18432, 10240, 2048]
    assert timeline.time_us == (0, 0, 10, 20, 30, 40, 50)
    assert timeline.events == 7
    peak = replay(snap, markers=markers)
    assert _totals(timeline)[timeline.peak_index] == peak.step_peaks[1] == peak.allocated_bytes


def test_each_band_is_the_module_and_phase_that_allocated_it_or_an_owner():
    snap, markers = _two_steps()
    timeline = active_memory(snap, owners=OWNERS, markers=markers, step=1)
    assert timeline is not None
    bands = {(b.category, b.label): b.values for b in timeline.bands}
    # holders whose bytes did not change in the step are one band per category
    assert bands[("parameters", CONSTANT)] == bands[("gradients", CONSTANT)] == (1024,) * 7
    assert bands[("activations", "forward · layer")] == (0, 8192, 8192, 8192, 8192, 8192, 0)
    assert bands[("activations", "backward · mlp")] == (0, 0, 0, 2048, 0, 0, 0)
    # what lasts the whole step stacks at the bottom
    assert [b.category for b in timeline.bands][:2] == ["parameters", "gradients"]
    # at the peak, the split by category is the peak composition's
    composition = peak_composition(snap, owners=OWNERS, markers=markers).composition
    by_category: dict[str, int] = {}
    for item in composition:
        by_category[item.category] = by_category.get(item.category, 0) + item.nbytes
    at_peak: dict[str, int] = {}
    for band in timeline.bands:
        at_peak[band.category] = at_peak.get(band.category, 0) + band.values[timeline.peak_index]
    assert {k: v for k, v in at_peak.items() if v} == by_category


def test_an_earlier_step_starts_from_the_window_start_and_a_missing_step_is_none():
    snap, markers = _two_steps()
    first = active_memory(snap, owners=OWNERS, markers=markers, step=0)
    assert first is not None and _totals(first) == [2048, 6144, 10240, 6144, 2048]
    assert active_memory(snap, owners=OWNERS, markers=markers, step=7) is None
    whole = active_memory(snap)  # no markers: the whole window, unattributed memory is "other"
    assert whole is not None and whole.step is None and len(whole.time_us) == 1 + 10  # 10 changes
    labels = {(b.category, b.label) for b in whole.bands}
    assert labels == {("other", CONSTANT), ("other", "(no context)")}


def test_a_long_step_stays_bounded_and_keeps_its_exact_peak():
    trace, live = [], []
    for k in range(5000):  # a saw-tooth with one spike
        addr = SEG + 0x1000000 + k * 0x1000
        size = 65536 if k == 3137 else 512 + (k % 7) * 16
        trace.append(_event("alloc", addr, size, 1000 + 2 * k))
        live.append((addr, size))
        if k % 3 == 2:
            for addr, size in live:
                trace.append(_event("free_requested", addr, size, 1001 + 2 * k))
            live.clear()
    snap = _snapshot(trace, dict(live))
    markers = [
        ContextMarker(999 + 2 * k, "forward", f"layers.{k}", 0, 0, step=0) for k in range(5000)
    ]
    timeline = active_memory(snap, markers=markers, step=0, max_points=300, max_bands=10)
    assert timeline is not None
    assert len(timeline.time_us) <= 300 + 3
    assert len(timeline.bands) <= 10 + 1  # one merged band for the one category
    assert any(b.label == MERGED for b in timeline.bands)
    assert _totals(timeline)[timeline.peak_index] == replay(snap).allocated_bytes
    assert timeline.time_us == tuple(sorted(timeline.time_us))


def test_the_timeline_round_trips_through_the_event_record():
    snap, markers = _two_steps()
    timeline = active_memory(snap, owners=OWNERS, markers=markers, step=1)
    summary = replay(snap, markers=markers).summary("s.pickle", "cuda_allocator", timeline)
    assert TimelineSummary.from_dict(summary.to_dict()) == summary
    older = summary.to_dict() | {"active_memory": None}  # a trace written before it existed
    assert TimelineSummary.from_dict(older).active_memory is None


@pytest.mark.parametrize(
    ("key", "band"),
    [
        (("gradients", "", "ddp.buffers[0].grad_data", None, None),
         ("gradients", "ddp.buffers[0].grad_data")),
        (("activations", "forward", "", 0, 0), ("activations", "forward · (no module)")),
        (("other", "", "", None, None), ("other", "(no context)")),
    ],
)  # fmt: skip
def test_band_labels(key, band):
    assert band_label(key) == band


def test_an_owner_whose_bytes_change_in_the_step_keeps_its_own_band():
    snap, markers = _two_steps()
    grads = SEG + 0x200000 + 2 * 0x10000  # the first block step 1 allocates: make it owned
    owners = OwnershipIndex(
        [*OWNERS.ranges, OwnedRange(grads, grads + 8192, "layer.weight.main_grad",
                                    OwnerCategory.GRADIENTS)]
    )  # fmt: skip
    timeline = active_memory(snap, owners=owners, markers=markers, step=1)
    assert timeline is not None
    bands = {(b.category, b.label): b.values for b in timeline.bands}
    assert bands[("gradients", "layer.weight.main_grad")] == (0, 8192, 8192, 8192, 8192, 8192, 0)
