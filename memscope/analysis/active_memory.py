"""The active-memory timeline of one step: allocated bytes through the step, by holder.

It reads the same allocator history as the peak replay (:mod:`.allocator_timeline`): the live
set when the recorded window began is rebuilt, the events before the step are applied, and
from the step's first event on every ``alloc`` and ``free_requested`` moves one holder's
bytes. A holder is an owner from the :class:`.OwnershipIndex` (a grad buffer, the optimizer
state) or, for memory no owner holds, the phase and module that allocated it, with the
category the peak composition gives it. So the bands sum to the allocator's allocated bytes
at every sample, the top edge of a stacked plot is that counter, and its highest point is the
step's true peak.

Bounded whatever the step's length: at most ``max_points`` samples (the minimum and maximum of
the allocated total per bucket, the first, the last and the peak always kept) and
``max_bands`` bands (the holders largest at any sample; the rest, and those whose bytes did
not change during the step, merge into one band per category).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memscope.analysis.allocator_timeline import (
    Markers,
    PartKey,
    allocated_delta,
    block_parts,
    device_trace,
    event_time,
    window_start,
)
from memscope.downsample import downsample_indices
from memscope.events.ownership import OwnershipIndex
from memscope.events.schema import ActiveMemory, ContextMarker, MemoryBand, module_label

MAX_POINTS = 600
MAX_BANDS = 24
#: The band holding a category's holders that did not make the top ``max_bands``.
MERGED = "(smaller holders)"
#: The band holding a category's holders whose bytes did not change during the step.
CONSTANT = "(held all step)"
#: Bands stack in this order (what lasts the whole step at the bottom), then largest first.
CATEGORY_ORDER = (
    "parameters",
    "main_params",
    "buffers",
    "gradients",
    "optimizer_state",
    "other",
    "activations",
)
_CHANGES = ("alloc", "free_requested")


#: A band: category and holder.
Band = tuple[str, str]


def band_label(key: PartKey) -> Band:
    """The band a part belongs to: its category and who holds it (an owner's name, or the
    phase and module that allocated it)."""
    category, phase, who, _, _ = key
    if not phase:
        return category, who or "(no context)"
    return category, f"{phase} · {module_label(who)}"


def _steps(trace: Sequence[Mapping[str, Any]], markers: Markers) -> list[int | None]:
    """The step each event happened in (an event without a time stays in the last one)."""
    out: list[int | None] = []
    marker = markers.at(event_time(trace[0])) if trace else None
    for event in trace:
        if event.get("time_us") is not None:
            marker = markers.at(event_time(event))
        out.append(None if marker is None else marker.step)
    return out


class _Holders:
    """The live set during a replay, kept as bytes per band, sampled on request."""

    def __init__(self, owners: OwnershipIndex, markers: Markers) -> None:
        self.owners, self.markers = owners, markers
        self.live: dict[int, list[tuple[Band, int]]] = {}
        self.held: dict[Band, int] = {}
        self.samples: list[dict[Band, int]] = []
        self.times: list[int] = []
        self.time: int | None = None  # the latest event time seen

    def alloc(self, addr: int, size: int, time_us: int | None, in_window: bool) -> None:
        parts = block_parts(addr, size, time_us, in_window, self.owners, self.markers)
        self.live[addr] = [(band_label(key), n) for key, n in parts]
        for band, n in self.live[addr]:
            self.held[band] = self.held.get(band, 0) + n

    def apply(self, event: Mapping[str, Any]) -> None:
        time_us = event_time(event)
        action = event.get("action")
        if action == "alloc":
            self.alloc(int(event["addr"]), int(event["size"]), time_us, in_window=True)
        elif action == "free_requested":
            for band, n in self.live.pop(int(event["addr"]), ()):
                self.held[band] -= n
        if time_us is not None:
            self.time = time_us

    def sample(self, at_us: int) -> None:
        self.samples.append({band: n for band, n in self.held.items() if n})
        self.times.append(at_us)

    def series(self) -> dict[Band, list[int]]:
        """Each band's bytes at every sample (0 where it held nothing)."""
        out: dict[Band, list[int]] = {}
        for k, held in enumerate(self.samples):
            for band, n in held.items():
                out.setdefault(band, [0] * len(self.samples))[k] = n
        return out


def active_memory(
    snapshot: Mapping[str, Any],
    device: int = 0,
    owners: OwnershipIndex | None = None,
    markers: Iterable[ContextMarker] = (),
    step: int | None = None,
    max_points: int = MAX_POINTS,
    max_bands: int = MAX_BANDS,
) -> ActiveMemory | None:
    """The timeline of ``step`` (None: the whole window); None when no event is in it."""
    assert max_points >= 4 and max_bands >= 1
    trace = device_trace(snapshot, device)
    by_time = Markers(markers)
    index = owners or OwnershipIndex()
    if step is None:
        lo, hi = 0, len(trace)
    else:
        inside = [i for i, s in enumerate(_steps(trace, by_time)) if s == step]
        if not inside:
            return None
        lo, hi = inside[0], inside[-1] + 1
    changes = [i for i in range(lo, hi) if trace[i].get("action") in _CHANGES]
    if not changes:
        return None
    start, _ = window_start(snapshot, device, trace)
    # pass 1: the allocated total before the step and after each change in it
    total = sum(start.values()) + sum(allocated_delta(event) for event in trace[:lo])
    totals = [total]
    for i in changes:
        total += allocated_delta(trace[i])
        totals.append(total)
    kept = downsample_indices(totals, max_points)  # sample k: after change k-1 (0: before)
    # pass 2: each holder's bytes at the kept samples
    holders = _Holders(index, by_time)
    for addr, size in start.items():
        holders.alloc(addr, size, None, in_window=False)
    for event in trace[:lo]:
        holders.apply(event)
    step_start = next((t for e in trace[lo:hi] if (t := event_time(e)) is not None), holders.time)
    wanted = set(kept)
    if 0 in wanted:
        holders.sample(0)
    change_no = 0
    for event in trace[lo:hi]:
        holders.apply(event)
        if event.get("action") in _CHANGES:
            change_no += 1
            if change_no in wanted:
                holders.sample(max(0, (holders.time or 0) - (step_start or 0)))
    times = holders.times
    assert len(times) == len(kept)
    peak = max(range(len(kept)), key=lambda k: totals[kept[k]])
    return ActiveMemory(
        step=step,
        time_us=tuple(times),
        bands=_bounded_bands(holders.series(), max_bands),
        peak_index=peak,
        events=hi - lo,
    )


def _bounded_bands(bands: dict[Band, list[int]], max_bands: int) -> tuple[MemoryBand, ...]:
    """Holders whose bytes never changed in the step merged per category; of the others the
    ``max_bands`` largest, the rest merged per category. Stacked in :data:`CATEGORY_ORDER`,
    the merged bands first (lowest) within a category, then largest first."""
    out: dict[Band, list[int]] = {}

    def merge(category: str, label: str, values: list[int]) -> None:
        merged = out.get((category, label), [0] * len(values))
        out[(category, label)] = [a + b for a, b in zip(merged, values, strict=True)]

    changing = []
    for (category, label), values in bands.items():
        if min(values) == max(values):
            merge(category, CONSTANT, values)
        else:
            changing.append(((category, label), values))
    changing.sort(key=lambda kv: (-max(kv[1]), kv[0]))
    out.update(changing[:max_bands])
    for (category, _), values in changing[max_bands:]:
        merge(category, MERGED, values)

    def order(item: tuple[Band, list[int]]) -> tuple[int, bool, int, str]:
        (category, label), values = item
        known = category in CATEGORY_ORDER
        rank = CATEGORY_ORDER.index(category) if known else len(CATEGORY_ORDER)
        return rank, label not in (CONSTANT, MERGED), -max(values), label

    return tuple(
        MemoryBand(category, label, tuple(values))
        for (category, label), values in sorted(out.items(), key=order)
    )
