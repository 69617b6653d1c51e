"""Per-step peak compositions (``memscope.analysis.step_compositions``): kept for the first
and the latest steps, bounded however long the run."""

from __future__ import annotations

from memscope.analysis.step_compositions import FIRST_KEPT, LAST_KEPT, StepCompositionAnalyzer
from memscope.events.schema import (
    PHASE_OPTIMIZER,
    PHASE_STEP,
    STEP_PHASE,
    CompositionItem,
    MemoryEvent,
    PeakContext,
)


def _step_end(step: int, phase: str = PHASE_STEP, composed: bool = True) -> MemoryEvent:
    items = (CompositionItem("activations", "forward", f"layer{step}", 0, None, 100 + step),)
    return MemoryEvent(
        seq=step, event_type=STEP_PHASE, phase=phase, step=step, module="", timestamp=0.0,
        rank=0, mem_allocated_before=0, mem_allocated_after=0, mem_reserved_before=0,
        mem_reserved_after=0, max_mem_allocated=100 + step, max_mem_reserved=100 + step,
        peak_context=PeakContext(step, "forward", f"layer{step}", 0),
        peak_composition=items if composed else None,
    )  # fmt: skip


def test_the_first_and_the_latest_steps_are_kept_with_where_their_peak_was():
    analyzer = StepCompositionAnalyzer()
    for step in range(100):
        analyzer.consume(_step_end(step))
    kept = analyzer.sections({})["step_compositions"]
    steps = [c["step"] for c in kept]
    assert steps == list(range(FIRST_KEPT)) + list(range(100 - LAST_KEPT, 100))
    last = kept[-1]
    assert (last["peak_bytes"], last["module"], last["phase"], last["microbatch"]) == (
        199, "layer99", "forward", 0)  # fmt: skip
    assert [(i["module"], i["bytes"]) for i in last["items"]] == [("layer99", 199)]


def test_only_whole_step_events_with_a_composition_count():
    analyzer = StepCompositionAnalyzer()
    analyzer.consume(_step_end(0, phase=PHASE_OPTIMIZER))
    analyzer.consume(_step_end(1, composed=False))
    analyzer.consume(_step_end(2))
    assert [c["step"] for c in analyzer.sections({})["step_compositions"]] == [2]
