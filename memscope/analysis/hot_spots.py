"""Deduplicated hot spots: events folded by (type, module, phase) (the ``top_events`` section)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memscope.events.schema import MODULE_FORWARD, READING_EVENTS, ROOT_MODULE, MemoryEvent
from memscope.events.sections import SectionLayout, SectionSpec


@dataclass(slots=True)
class HotSpot:
    """All events sharing (event_type, module, phase), folded into one row."""

    event_type: str
    module: str
    phase: str
    module_class: str
    count: int = 0
    max_mem_allocated_after: int = 0
    max_mem_allocated: int = 0
    max_delta_allocated: int = 0
    min_delta_allocated: int = 0
    total_delta_allocated: int = 0
    first_step: int = 0
    last_step: int = 0
    worst_step: int = 0
    worst_microbatch: int | None = None

    def add(self, e: MemoryEvent) -> None:
        delta = e.delta_allocated
        if self.count == 0:
            self.first_step = e.step
            self.max_delta_allocated = self.min_delta_allocated = delta
        else:
            self.max_delta_allocated = max(self.max_delta_allocated, delta)
            self.min_delta_allocated = min(self.min_delta_allocated, delta)
        self.count += 1
        self.total_delta_allocated += delta
        self.last_step = e.step
        self.max_mem_allocated = max(self.max_mem_allocated, e.max_mem_allocated)
        if self.count == 1 or e.mem_allocated_after > self.max_mem_allocated_after:
            self.max_mem_allocated_after = e.mem_allocated_after
            self.worst_step = e.step
            self.worst_microbatch = e.microbatch

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_type": self.event_type,
            "module": self.module,
            "module_class": self.module_class,
            "phase": self.phase,
            "count": self.count,
            "mem_allocated_after": self.max_mem_allocated_after,
            "max_mem_allocated": self.max_mem_allocated,
            "max_delta_allocated": self.max_delta_allocated,
            "min_delta_allocated": self.min_delta_allocated,
            "mean_delta_allocated": self.total_delta_allocated // max(self.count, 1),
            "first_step": self.first_step,
            "last_step": self.last_step,
            "worst_step": self.worst_step,
            "worst_microbatch": self.worst_microbatch,
        }


def _children_prefix(module: str) -> str:
    """What the names of ``module``'s descendants start with (a chunk's root module's children
    are named without the root: ``chunk1.model`` -> ``chunk1.``)."""
    if module == ROOT_MODULE:
        return ""
    if module.endswith("." + ROOT_MODULE) and module.startswith("chunk"):
        return module[: -len(ROOT_MODULE)]
    return module + "."


class HotSpotAnalyzer:
    """The ``top_k`` hot spots by the allocation level they reached."""

    section_specs = (
        SectionSpec(
            "top_events", "Top events (deduplicated)", SectionLayout.TABLE, "top_events", order=60
        ),
    )

    def __init__(self, top_k: int = 20) -> None:
        self.top_k = top_k
        self.hot_spots: dict[tuple[str, str, str], HotSpot] = {}

    def consume(self, e: MemoryEvent) -> None:
        if e.event_type not in READING_EVENTS:
            return
        key = (e.event_type, e.module, e.phase)
        spot = self.hot_spots.get(key)
        if spot is None:
            spot = self.hot_spots[key] = HotSpot(e.event_type, e.module, e.phase, e.module_class)
        spot.add(e)

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        spots = sorted(
            self.hot_spots.values(),
            key=lambda s: (s.max_mem_allocated_after, s.max_delta_allocated),
            reverse=True,
        )
        forwards = {s.module for s in self.hot_spots.values() if s.event_type == MODULE_FORWARD}
        rows = []
        for spot in spots[: self.top_k]:
            row = spot.to_dict()
            if spot.event_type == MODULE_FORWARD and spot.module:
                # a container's forward includes its children's allocations (inclusive)
                prefix = _children_prefix(spot.module)
                row["leaf"] = not any(
                    name != spot.module and name.startswith(prefix) for name in forwards
                )
            rows.append(row)
        return {"top_events": rows}
