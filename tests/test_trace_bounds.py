"""The in-memory trace and aggregates stay bounded however many steps run."""

import itertools

from memscope.analysis.hot_spots import HotSpotAnalyzer
from memscope.analysis.modules import ModuleAnalyzer
from memscope.analysis.peak import PeakAnalyzer
from memscope.analysis.steps import StepAnalyzer
from memscope.events.schema import MODULE_FORWARD, STEP_PHASE, MemoryEvent
from memscope.events.trace_store import BoundedTraceStore


def _event(seq: int, step: int, kind: str, module: str, after: int) -> MemoryEvent:
    return MemoryEvent(
        seq=seq, event_type=kind, phase="forward" if kind == MODULE_FORWARD else "step",
        step=step, module=module, timestamp=0.0, rank=0, mem_allocated_before=0,
        mem_allocated_after=after, mem_reserved_before=0, mem_reserved_after=after,
        max_mem_allocated=after, max_mem_reserved=after,
    )  # fmt: skip


def test_store_keeps_detail_steps_and_every_step_phase_under_the_cap():
    store = BoundedTraceStore(detail_steps=2, max_events=50)
    seq = 0
    for step in range(20):
        for m in range(5):
            seq += 1
            store.consume(_event(seq, step, MODULE_FORWARD, f"m{m}", 10))
        seq += 1
        store.consume(_event(seq, step, STEP_PHASE, "", 10))
    fine = [e for e in store.events if e.event_type == MODULE_FORWARD]
    assert {e.step for e in fine} == {0, 1} and len(fine) == 10
    assert len([e for e in store.events if e.event_type == STEP_PHASE]) == 20
    assert len(store.events) + store.dropped == seq
    for _ in range(100):
        seq += 1
        store.consume(_event(seq, 99, STEP_PHASE, "", 10))
    assert len(store.events) == 50


def test_analyzers_grow_with_modules_not_with_steps_and_keep_the_peak():
    modules, spots, peak = ModuleAnalyzer(), HotSpotAnalyzer(), PeakAnalyzer()
    steps = StepAnalyzer(max_step_summaries=100)
    analyzers = (modules, spots, peak, steps)
    seq = 0
    for step in range(1000):
        events = []
        for m in range(3):
            seq += 1
            size = 100 + (5000 if step == 777 else 0)
            events.append(_event(seq, step, MODULE_FORWARD, f"m{m}", size))
        seq += 1
        events.append(_event(seq, step, STEP_PHASE, "", 100 + step % 7))
        for event in events:
            for analyzer in analyzers:
                analyzer.consume(event)
    assert len(modules.modules) == 3 and len(spots.hot_spots) == 4
    assert len(steps.steps) <= 101 and 777 in steps.steps
    assert peak.peak_event is not None and peak.peak_event.step == 777
    assert spots.hot_spots[(MODULE_FORWARD, "m0", "forward")].count == 1000


def test_long_runs_thin_step_phases_evenly_keeping_detail_and_newest_steps():
    store = BoundedTraceStore(detail_steps=1, max_events=10**6, max_steps=100)
    seq = 0
    for step in range(5000):
        if step == 0:
            seq += 1
            store.consume(_event(seq, step, MODULE_FORWARD, "m", 1))
        for _ in range(4):
            seq += 1
            store.consume(_event(seq, step, STEP_PHASE, "", 1))
    held = sorted({e.step for e in store.events if e.event_type == STEP_PHASE})
    assert len(held) <= 100
    assert held[0] == 0 and held[-1] == 4999
    gaps = {b - a for a, b in itertools.pairwise(held[1:-1])}
    assert max(gaps) <= 2 * min(gaps)  # evenly spread over the run
    assert len(store.events) + store.dropped == seq
