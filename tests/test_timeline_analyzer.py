"""The ``allocator_timeline`` section and what it gives the ``peak`` and ``steps`` sections:
a backend without a composition of its own (``cuda``) gets the replay's, when the recorded
window held the run's peak; each recorded step gets its true high-water mark; recording's
cost is the recorded steps' median time against the others'."""

from __future__ import annotations

from test_allocator_timeline import _step

from memscope.analysis.allocator_timeline import replay
from memscope.analysis.base import replay as replay_events
from memscope.analysis.runtime_sections import runtime_analyzers
from memscope.analysis.static_comparison import StaticEstimate
from memscope.events.schema import (
    ALLOCATOR_TIMELINE,
    PHASE_STEP,
    STEP_PHASE,
    CompositionItem,
    ContextMarker,
    MemoryEvent,
    PeakContext,
    TimelineSummary,
)

MiB = 1 << 20


def _step_event(seq: int, step: int, peak: int, start: float, end: float) -> MemoryEvent:
    return MemoryEvent(
        seq=seq, event_type=STEP_PHASE, phase=PHASE_STEP, step=step, module="",
        timestamp=end, rank=0, mem_allocated_before=10 * MiB, mem_allocated_after=10 * MiB,
        mem_reserved_before=64 * MiB, mem_reserved_after=64 * MiB, max_mem_allocated=peak,
        max_mem_reserved=64 * MiB, start_timestamp=start,
        device={"device_used_bytes": 80 * MiB, "device_total_bytes": 1 << 34},
    )  # fmt: skip


def _timeline_event(seq: int, peak: int, step_peaks: dict[int, int]) -> MemoryEvent:
    summary = TimelineSummary(
        snapshot="memory_snapshot_steps1-2.pickle", source="cuda_allocator", peak_bytes=peak,
        peak_time_us=123, peak_context=PeakContext(2, "backward", "decoder.layers.1", 3, None),
        window_start_bytes=8 * MiB, events=40, inconsistencies=0, coverage=0.5,
        step_peaks=step_peaks,
    )  # fmt: skip
    items = (
        CompositionItem("parameters", "", "decoder.weight", None, None, 8 * MiB),
        CompositionItem("activations", "backward", "decoder.layers.1", 3, None, peak - 8 * MiB),
    )
    return MemoryEvent(
        seq=seq, event_type=ALLOCATOR_TIMELINE, phase="step", step=2, module=summary.snapshot,
        timestamp=9.0, rank=0, mem_allocated_before=10 * MiB, mem_allocated_after=10 * MiB,
        mem_reserved_before=64 * MiB, mem_reserved_after=64 * MiB, max_mem_allocated=30 * MiB,
        max_mem_reserved=64 * MiB, timeline=summary, peak_composition=items,
    )  # fmt: skip


def _report(events: list[MemoryEvent]) -> dict:
    return replay_events(events, runtime_analyzers(5, StaticEstimate(None, "none")))


def _run(timeline_peak: int) -> dict:
    events = [
        _step_event(1, 0, 20 * MiB, 0.0, 1.0),
        _step_event(2, 1, 30 * MiB, 1.0, 3.0),
        _step_event(3, 2, 30 * MiB, 3.0, 5.0),
        _step_event(4, 3, 30 * MiB, 5.0, 6.0),
    ]
    events.insert(3, _timeline_event(9, timeline_peak, {1: 29 * MiB, 2: timeline_peak}))
    return _report(events)


def test_a_backend_without_composition_gets_the_replays_when_it_holds_the_run_peak():
    sections = _run(30 * MiB)
    peak = sections["peak"]
    assert peak["memory_bytes"] == 30 * MiB
    assert peak["composition"]["source"] == "allocator_history"
    assert peak["composition"]["unattributed_bytes"] == 0
    assert peak["attribution"] == "allocator_history"
    assert (peak["step"], peak["module"], peak["microbatch"]) == (2, "decoder.layers.1", 3)
    # beside the composition: cached-free and outside-PyTorch memory of the peak's step
    assert peak["beside"]["allocator_cached_free_bytes"] == 34 * MiB
    assert peak["beside"]["outside_pytorch_bytes"] == 16 * MiB


def test_a_window_that_missed_the_peak_says_so_instead_of_a_wrong_composition():
    peak = _run(25 * MiB)["peak"]
    assert "composition" not in peak
    assert "--memscope-snapshot-start-step" in peak["composition_note"]
    assert peak["timeline_peak_bytes"] == 25 * MiB


def test_recorded_steps_get_their_true_peak_and_the_recording_cost():
    sections = _run(30 * MiB)
    steps = {s["step"]: s for s in sections["steps"]}
    assert steps[1]["peak_allocated_timeline"] == 29 * MiB
    assert "peak_allocated_timeline" not in steps[3]
    cost = sections["allocator_timeline"]["recording_cost"]
    assert (cost["recorded_median_s"], cost["other_median_s"], cost["ratio"]) == (2.0, 1.0, 2.0)
    # the timeline event is not a module or a phase of its own
    assert all(m["module"] != "memory_snapshot_steps1-2.pickle" for m in sections["module_summary"])


def test_replay_gives_each_marked_step_its_high_water_mark_and_the_peaks_context():
    markers = [
        ContextMarker(90, "forward", "layer", 0, None, 5),
        ContextMarker(125, "backward", "layer", 0, None, 5),
        ContextMarker(145, "setup", "", None, None, 5),
    ]
    peak = replay(_step(), 0, markers)
    assert peak.step_peaks == {5: peak.allocated_bytes}
    assert peak.peak_marker is not None and peak.peak_marker.phase == "backward"
    summary = peak.summary("s.pickle", "cuda_allocator")
    assert summary.peak_context == PeakContext(5, "backward", "layer", 0, None)
    assert TimelineSummary.from_dict(summary.to_dict()).to_dict() == summary.to_dict()


def test_markdown_shows_the_replayed_composition_and_what_lies_beside_it():
    from memscope.reporters.markdown import render_runtime_markdown

    text = render_runtime_markdown({"peak": _run(30 * MiB)["peak"]})
    assert "From the replayed allocator history." in text
    assert "outside PyTorch (NCCL, CUDA context) 16.00 MiB" in text
    missed = render_runtime_markdown({"peak": _run(25 * MiB)["peak"]})
    assert "--memscope-snapshot-start-step" in missed


def test_markdown_shows_the_history_its_step_peaks_and_who_held_the_most():
    from memscope.reporters.markdown import render_runtime_markdown

    report = {"allocator_timeline": _run(30 * MiB)["allocator_timeline"]}
    text = render_runtime_markdown(report)
    section = text.split("## Allocator history (replayed)")[1].split("\n## ")[0]
    assert "window peak **30.00 MiB** at step 2, phase `backward`" in section
    assert "coverage 50.0%" in section
    assert "| 1 | 29.00 MiB |" in section and "| 2 | 30.00 MiB |" in section
    assert "recording cost: median step 2.00 s with history, 1.00 s without (×2.00)" in section
    assert "Active memory" not in section  # the event carried no timeline
    active = {"step": 2, "time_us": [0, 5, 9], "peak_index": 1, "events": 3, "bands": [
        {"category": "parameters", "label": "(held all step)", "bytes": [8 * MiB] * 3},
        {"category": "activations", "label": "backward · decoder.layers.1",
         "bytes": [0, 22 * MiB, 0]},
    ]}  # fmt: skip
    report["allocator_timeline"]["active_memory"] = active
    section = render_runtime_markdown(report).split("## Allocator history (replayed)")[1]
    rows = [line for line in section.splitlines() if line.startswith("| activations")]
    assert rows == ["| activations | `backward · decoder.layers.1` | 22.00 MiB | 22.00 MiB |"]
