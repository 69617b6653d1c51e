"""What was live at each recorded step's own peak (the ``step_compositions`` section).

A report's ``peak.composition`` is the run's peak only. To compare two steps of one run by
category x module x microbatch (``memscope diff --step-a 1 --step-b 5``), the tracer also
attaches each hooked step's peak composition to its whole-step event (storage backend: the
exact ledger, reset at every step start). This analyzer keeps those, bounded: the first
:data:`FIRST_KEPT` steps and the latest :data:`LAST_KEPT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memscope.events.schema import MemoryEvent, is_step_end
from memscope.events.sections import SectionLayout, SectionSpec

#: Steps whose composition the report keeps: the first ones (warm-up, the optimizer's first
#: step) and the latest ones (the steady state a leak shows in).
FIRST_KEPT = 8
LAST_KEPT = 16


class StepCompositionAnalyzer:
    """Per step: its peak bytes, where that peak was set, and what was live there."""

    section_specs = (
        SectionSpec("step_compositions", "Live at each step's peak", SectionLayout.DATA, order=95),
    )

    def __init__(self) -> None:
        self.first: dict[int, dict[str, Any]] = {}
        self.last: dict[int, dict[str, Any]] = {}

    def consume(self, e: MemoryEvent) -> None:
        if not is_step_end(e) or not e.peak_composition:
            return
        ctx = e.peak_context
        record = {
            "step": e.step,
            "peak_bytes": e.max_mem_allocated,
            "phase": ctx.phase if ctx else None,
            "module": ctx.module if ctx else None,
            "microbatch": ctx.microbatch if ctx else None,
            "items": [item.to_dict() for item in e.peak_composition],
        }
        if len(self.first) < FIRST_KEPT or e.step in self.first:
            self.first[e.step] = record
            return
        self.last[e.step] = record
        if len(self.last) > LAST_KEPT:
            del self.last[min(self.last)]

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        steps = {**self.first, **self.last}
        return {"step_compositions": [steps[k] for k in sorted(steps)]}
