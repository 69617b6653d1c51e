"""Per-module table (the ``module_summary`` section)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memscope.events.schema import HOOK_EVENTS, MemoryEvent
from memscope.events.sections import SectionLayout, SectionSpec


class ModuleAnalyzer:
    """Per module (and parameter): events, highest level reached, delta range and total."""

    section_specs = (
        SectionSpec(
            "module_summary",
            "Modules by largest allocation increase",
            SectionLayout.TABLE,
            "module_summary",
            order=70,
        ),
    )

    def __init__(self) -> None:
        self.modules: dict[str, dict[str, Any]] = {}

    def consume(self, e: MemoryEvent) -> None:
        if e.event_type not in HOOK_EVENTS:
            return
        delta = e.delta_allocated
        m = self.modules.get(e.module)
        if m is None:
            m = self.modules[e.module] = {
                "module": e.module,
                "module_class": e.module_class,
                "count": 0,
                "max_allocated_after": 0,
                "max_delta_allocated": delta,
                "min_delta_allocated": delta,
                "total_delta_allocated": 0,
                "event_types": set(),
            }
        m["count"] += 1
        m["max_allocated_after"] = max(m["max_allocated_after"], e.mem_allocated_after)
        m["max_delta_allocated"] = max(m["max_delta_allocated"], delta)
        m["min_delta_allocated"] = min(m["min_delta_allocated"], delta)
        m["total_delta_allocated"] += delta
        m["event_types"].add(e.event_type)

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        rows = []
        for m in self.modules.values():
            row = dict(m)
            row["event_types"] = sorted(m["event_types"])
            rows.append(row)
        rows.sort(key=lambda r: r["max_delta_allocated"], reverse=True)
        return {"module_summary": rows}
