"""The phases table's per-phase maximum (analysis/phases.py): exact where the backend gives a
phase its own running peak or the phase set the step's mark, else its highest reading shown
as a lower bound (``≥``)."""

from __future__ import annotations

from memscope.analysis.base import replay
from memscope.analysis.runtime_sections import runtime_analyzers
from memscope.analysis.static_comparison import StaticEstimate
from memscope.events.schema import (
    PHASE_FORWARD_BACKWARD,
    PHASE_OPTIMIZER,
    PHASE_PRE_OPTIMIZER,
    STEP_PHASE,
    MemoryEvent,
)
from memscope.reporters.markdown import render_runtime_markdown
from memscope.reporters.runtime_json import RuntimeReportInputs, build_runtime_report

MiB = 1 << 20


def _phase(seq: int, phase: str, before: int, after: int, mark: int, own: int | None):
    return MemoryEvent(
        seq=seq, event_type=STEP_PHASE, phase=phase, step=0, module="", timestamp=seq, rank=0,
        mem_allocated_before=before * MiB, mem_allocated_after=after * MiB,
        mem_reserved_before=0, mem_reserved_after=0, max_mem_allocated=mark * MiB,
        max_mem_reserved=0, phase_max_allocated=None if own is None else own * MiB,
    )  # fmt: skip


def _report(own_peaks: bool) -> dict:
    """Backward drives the step's mark to 50 MiB; Adam's temporaries then reach 45 MiB
    between readings of 40 and 42 MiB, which only a running peak of the phase sees."""
    events = [
        _phase(1, PHASE_FORWARD_BACKWARD, 30, 40, 50, 50 if own_peaks else None),
        _phase(2, PHASE_PRE_OPTIMIZER, 40, 40, 50, 40 if own_peaks else None),
        _phase(3, PHASE_OPTIMIZER, 40, 42, 50, 45 if own_peaks else None),
    ]
    sections = replay(events, runtime_analyzers(5, StaticEstimate(None, "none")))
    meta = {"rank": 0, "world_size": 1, "backend": "storage" if own_peaks else "cuda"}
    return build_runtime_report(
        RuntimeReportInputs(meta, "complete", sections, events, {"events_recorded": 0})
    )


def test_a_phases_own_running_peak_is_its_exact_maximum():
    rows = {r["phase"]: r for r in _report(own_peaks=True)["phase_summary"]}
    assert rows[PHASE_OPTIMIZER]["max_mem_allocated"] == 45 * MiB
    assert rows[PHASE_OPTIMIZER]["max_mem_allocated_source"] == "phase_peak"
    assert rows[PHASE_FORWARD_BACKWARD]["max_mem_allocated"] == 50 * MiB
    assert "≥" not in render_runtime_markdown(_report(own_peaks=True))


def test_without_it_a_phase_below_the_steps_mark_is_a_marked_lower_bound():
    report = _report(own_peaks=False)
    rows = {r["phase"]: r for r in report["phase_summary"]}
    assert rows[PHASE_FORWARD_BACKWARD]["max_mem_allocated"] == 50 * MiB  # it set the mark
    assert rows[PHASE_FORWARD_BACKWARD]["max_mem_allocated_source"] == "high_water"
    assert rows[PHASE_OPTIMIZER]["max_mem_allocated"] == 42 * MiB  # not the step's 50
    assert rows[PHASE_OPTIMIZER]["max_mem_allocated_source"] == "readings"
    assert "≥ 42.00 MiB" in render_runtime_markdown(report)
