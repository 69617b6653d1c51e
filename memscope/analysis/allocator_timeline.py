"""What was live at the true peak, from a CUDA caching allocator snapshot with history.

``torch.cuda.memory._record_memory_history`` keeps a bounded ring of allocator events per
device (``device_traces``: ``alloc``, ``free_requested``, ``free_completed``, segment events,
each with ``addr``, ``size`` and ``time_us``); ``torch.cuda.memory._snapshot()`` adds the
state at the time of the snapshot (``segments`` with their ``blocks``). This module replays
that history without torch:

1. **Window start.** The blocks allocated at snapshot time (``active_allocated``) are undone
   event by event, backwards: an ``alloc`` in the window was not live before it, a
   ``free_requested`` was. What remains is what was live when the recorded window began
   (parameters, optimizer state, anything allocated before recording started or before the
   ring wrapped).
2. **Peak.** The events are replayed forwards from that state; allocated bytes move as the
   allocator's ``allocated_bytes`` counter does (``alloc`` +size, ``free_requested`` -size),
   so the maximum is the window's ``max_memory_allocated``. The live set at that moment is
   the peak's exact composition.
3. **Attribution.** Each live block is split by an :class:`.OwnershipIndex` (parameters,
   main parameters, gradients, optimizer state, buffers) and what no owner holds is given the
   training context (phase, module, microbatch, VPP chunk) that was current when it was
   allocated, from MemScope's :class:`ContextMarker` list (the same timestamps clock,
   microseconds since the epoch). Blocks allocated before the window without an owner
   stay ``other`` (``before the window``).

``coverage`` is the share of the peak's bytes whose allocation the window saw (the rest were
live already when it started: a late start or a wrapped ring); ``inconsistencies`` counts
events the replay could not pair (a ``free_requested`` of a block it did not know as live).

Known limitations: one device per replay; blocks of private pools (CUDA graphs) count like
any other; expandable segments are treated as ordinary blocks.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memscope.events.ownership import OwnershipIndex
from memscope.events.schema import (
    ActiveMemory,
    CompositionItem,
    ContextMarker,
    IdleFinding,
    PeakContext,
    TimelineSummary,
    module_label,
)

BEFORE_WINDOW = "(before the window)"
#: Memory allocated in these phases is activations (as the storage backend's category policy
#: has it: the whole forward-backward pass, module or not).
ACTIVATION_PHASES = frozenset({"forward_backward", "forward", "backward", "recompute"})


@dataclass(frozen=True, slots=True)
class LiveBlock:
    """An allocated block: address, size, when it was allocated (None: before the window)."""

    addr: int
    size: int
    time_us: int | None
    index: int | None  # position of its ``alloc`` in the trace


@dataclass(frozen=True)
class TimelinePeak:
    """The window's peak and what was live there."""

    allocated_bytes: int  # at the peak
    time_us: int | None  # of the event that reached it (None: the window start)
    index: int  # that event's position in the trace (-1: the window start)
    live: tuple[LiveBlock, ...]
    start_bytes: int  # allocated when the window began
    events: int
    inconsistencies: int
    coverage: float  # share of the peak's bytes allocated inside the window
    composition: tuple[CompositionItem, ...] = field(default=())
    #: Allocated high-water mark of each step the markers name (empty without markers).
    step_peaks: dict[int, int] = field(default_factory=dict)
    #: The marker current when the peak was reached (None without markers).
    peak_marker: ContextMarker | None = None

    def summary(
        self,
        snapshot: str,
        source: str,
        active_memory: ActiveMemory | None = None,
        idle: tuple[int, tuple[IdleFinding, ...]] | None = None,
    ) -> TimelineSummary:
        """The plain record an ``allocator_timeline`` event carries (with the timeline of the
        peak's step, when given)."""
        m = self.peak_marker
        context = (
            None
            if m is None or m.step is None
            else PeakContext(m.step, m.phase, m.module, m.microbatch, m.virtual_chunk)
        )
        return TimelineSummary(
            snapshot=snapshot,
            source=source,
            peak_bytes=self.allocated_bytes,
            peak_time_us=self.time_us,
            peak_context=context,
            window_start_bytes=self.start_bytes,
            events=self.events,
            inconsistencies=self.inconsistencies,
            coverage=self.coverage,
            step_peaks=dict(self.step_peaks),
            active_memory=active_memory,
            idle_at_peak_bytes=None if idle is None else idle[0],
            idle_at_peak=() if idle is None else idle[1],
        )


def device_trace(snapshot: Mapping[str, Any], device: int) -> list[Mapping[str, Any]]:
    """The recorded events of ``device`` (empty when none were recorded)."""
    traces = snapshot.get("device_traces") or []
    if not isinstance(traces, list):
        raise ValueError("snapshot: device_traces is not a list")
    return list(traces[device]) if device < len(traces) and traces[device] else []


def allocated_blocks(snapshot: Mapping[str, Any], device: int) -> dict[int, int]:
    """Blocks allocated (not yet freed by their owner) at snapshot time: address -> size."""
    out: dict[int, int] = {}
    for segment in snapshot.get("segments") or []:
        if int(segment.get("device", 0)) != device:
            continue
        for block in segment.get("blocks") or []:
            if block.get("state") == "active_allocated":
                out[int(block["address"])] = int(block["size"])
    return out


def window_start(
    snapshot: Mapping[str, Any], device: int, trace: Sequence[Mapping[str, Any]]
) -> tuple[dict[int, int], int]:
    """The blocks live when ``trace`` began (address -> size), found by undoing it from the
    snapshot's allocated blocks, and how many of its events could not be undone."""
    live = allocated_blocks(snapshot, device)
    inconsistencies = 0
    for event in reversed(trace):
        action, addr = event.get("action"), int(event.get("addr", 0))
        if action == "alloc":
            if live.pop(addr, None) is None:
                inconsistencies += 1
        elif action == "free_requested":
            if addr in live:
                inconsistencies += 1
            live[addr] = int(event["size"])
    return live, inconsistencies


class Markers:
    """Context markers by time: which one was current at a given moment."""

    def __init__(self, markers: Iterable[ContextMarker]) -> None:
        self.ordered = sorted(markers, key=lambda m: m.time_us)
        self.times = [m.time_us for m in self.ordered]

    def at(self, time_us: int | None) -> ContextMarker | None:
        """The marker current at ``time_us`` (None: no time, or before the first marker)."""
        if time_us is None or not self.ordered:
            return None
        i = bisect.bisect_right(self.times, time_us) - 1
        return self.ordered[i] if i >= 0 else None


def _context_category(marker: ContextMarker) -> str:
    """What unowned memory allocated in ``marker``'s context is."""
    return "activations" if marker.phase in ACTIVATION_PHASES else "other"


def replay(
    snapshot: Mapping[str, Any], device: int = 0, markers: Iterable[ContextMarker] = ()
) -> TimelinePeak:
    """Replay ``device``'s recorded history to its allocated peak (see the module doc); with
    ``markers``, also each step's high-water mark and the context at the peak."""
    trace = device_trace(snapshot, device)
    start, inconsistencies = window_start(snapshot, device, trace)
    current = start_bytes = sum(start.values())
    best, best_index = current, -1
    index = Markers(markers)
    step_peaks: dict[int, int] = {}
    marker = peak_marker = index.at(event_time(trace[0])) if trace else None
    for i, event in enumerate(trace):
        action = event.get("action")
        if action not in ("alloc", "free_requested"):
            continue
        time_us = event_time(event)
        if time_us is not None:  # an event without a time stays in the last context
            marker = index.at(time_us)
        step = None if marker is None else marker.step
        if step is not None and current > step_peaks.get(step, -1):
            step_peaks[step] = current  # the level the step found
        if action == "alloc":
            current += int(event["size"])
            if current > best:
                best, best_index, peak_marker = current, i, marker
            if step is not None and current > step_peaks[step]:
                step_peaks[step] = current
        else:
            current -= int(event["size"])
    # the live set at the peak: the start state plus the window up to the peak
    blocks: dict[int, LiveBlock] = {a: LiveBlock(a, n, None, None) for a, n in start.items()}
    for i, event in enumerate(trace[: best_index + 1]):
        action, addr = event.get("action"), int(event.get("addr", 0))
        if action == "alloc":
            blocks[addr] = LiveBlock(addr, int(event["size"]), event_time(event), i)
        elif action == "free_requested":
            blocks.pop(addr, None)
    peak_blocks = tuple(sorted(blocks.values(), key=lambda b: b.addr))
    seen = sum(b.size for b in peak_blocks if b.index is not None)
    time_us = event_time(trace[best_index]) if best_index >= 0 else None
    return TimelinePeak(
        allocated_bytes=best,
        time_us=time_us,
        index=best_index,
        live=peak_blocks,
        start_bytes=start_bytes,
        events=len(trace),
        inconsistencies=inconsistencies,
        coverage=seen / best if best else 1.0,
        step_peaks=step_peaks,
        peak_marker=peak_marker,
    )


#: Who holds some bytes: category, phase, owner or module, microbatch, VPP chunk.
PartKey = tuple[str, str, str, int | None, int | None]


def block_parts(
    addr: int,
    size: int,
    time_us: int | None,
    in_window: bool,
    owners: OwnershipIndex,
    markers: Markers,
) -> list[tuple[PartKey, int]]:
    """A block's bytes split by owner; what no owner holds goes to the training context that
    was current when it was allocated (``in_window``: its allocation was recorded)."""
    parts: list[tuple[PartKey, int]] = []
    for owner, nbytes in owners.attribute(addr, size):
        if owner is not None:
            parts.append(((owner.category.value, "", owner.owner, None, None), nbytes))
            continue
        marker = markers.at(time_us)
        if marker is None:
            parts.append((("other", "", "" if in_window else BEFORE_WINDOW, None, None), nbytes))
            continue
        key = (
            _context_category(marker),
            marker.phase,
            marker.module,
            marker.microbatch,
            marker.virtual_chunk,
        )
        parts.append((key, nbytes))
    return parts


def attribute_peak(
    peak: TimelinePeak,
    owners: OwnershipIndex | None = None,
    markers: Sequence[ContextMarker] = (),
) -> tuple[CompositionItem, ...]:
    """The peak's live bytes by category x context, largest first (see the module doc)."""
    by_time = Markers(markers)
    index = owners or OwnershipIndex()
    totals: dict[PartKey, int] = {}
    for block in peak.live:
        in_window = block.index is not None
        for key, nbytes in block_parts(block.addr, block.size, block.time_us, in_window, index,
                                       by_time):  # fmt: skip
            totals[key] = totals.get(key, 0) + nbytes
    items = [CompositionItem(*key, nbytes) for key, nbytes in totals.items()]
    return tuple(sorted(items, key=lambda i: -i.nbytes))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def event_time(event: Mapping[str, Any]) -> int | None:
    """An allocator event's ``time_us`` (None when it has none)."""
    return _opt_int(event.get("time_us"))


def allocated_delta(event: Mapping[str, Any]) -> int:
    """How an allocator event moves the allocated total (``alloc`` up, ``free_requested``
    down; the other actions not at all)."""
    action = event.get("action")
    if action == "alloc":
        return int(event["size"])
    return -int(event["size"]) if action == "free_requested" else 0


def peak_composition(
    snapshot: Mapping[str, Any],
    device: int = 0,
    owners: OwnershipIndex | None = None,
    markers: Iterable[ContextMarker] = (),
) -> TimelinePeak:
    """:func:`replay` then :func:`attribute_peak`: the peak with its composition."""
    kept = list(markers)
    peak = replay(snapshot, device, kept)
    return dataclasses.replace(peak, composition=attribute_peak(peak, owners, kept))


@dataclass(frozen=True, slots=True)
class AllocationLabel:
    """Who one allocation belongs to: a category and where it was made (for viewers)."""

    category: str
    where: str  # owner name, or phase · module · microbatch · chunk


def _context_text(marker: ContextMarker) -> str:
    parts = [
        marker.phase,
        module_label(marker.module),
        None if marker.microbatch is None else f"microbatch {marker.microbatch}",
        None if marker.virtual_chunk is None else f"chunk {marker.virtual_chunk}",
        None if marker.step is None else f"step {marker.step}",
    ]
    return " · ".join(p for p in parts if p)


def _label_allocation(
    addr: int, size: int, time_us: int | None, owners: OwnershipIndex, markers: Markers
) -> AllocationLabel:
    """The category of the block at ``addr`` (its largest owner, else the training context
    of its allocation, as :func:`attribute_peak` splits it) and a one-line description."""
    owned = [(o, n) for o, n in owners.attribute(addr, size) if o is not None]
    if owned:
        owner = max(owned, key=lambda on: on[1])[0]
        return AllocationLabel(owner.category.value, owner.owner)
    marker = markers.at(time_us)
    if marker is None:
        return AllocationLabel("other", BEFORE_WINDOW if time_us is None else "")
    return AllocationLabel(_context_category(marker), _context_text(marker))


def allocation_labels(
    snapshot: Mapping[str, Any],
    device: int = 0,
    owners: OwnershipIndex | None = None,
    markers: Iterable[ContextMarker] = (),
) -> tuple[dict[int, AllocationLabel], dict[int, AllocationLabel]]:
    """Labels of ``device``'s ``alloc`` events (by position in its trace) and of the blocks
    allocated at snapshot time (by address; a block allocated in the window gets the label
    of its allocation)."""
    by_time = Markers(markers)
    index = owners or OwnershipIndex()
    events: dict[int, AllocationLabel] = {}
    latest: dict[int, AllocationLabel] = {}
    for i, event in enumerate(device_trace(snapshot, device)):
        if event.get("action") == "alloc":
            addr = int(event["addr"])
            label = _label_allocation(addr, int(event["size"]), event_time(event), index, by_time)
            events[i] = latest[addr] = label
    blocks = {
        addr: latest.get(addr) or _label_allocation(addr, size, None, index, by_time)
        for addr, size in allocated_blocks(snapshot, device).items()
    }
    return events, blocks
