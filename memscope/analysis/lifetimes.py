"""Memory live at the peak that nothing was using: what freeing it earlier would save.

From an allocator history whose frees (and live blocks) carry ``last_use_us``, the last time
an op read each allocation (the storage ledger records it while the history is recorded):
a block live at the peak whose last use came before the peak was *idle at the peak*. For
each such block the timeline is re-simulated as if the block had been freed right after its
last use; the drop of the window's peak is the finding's worth, exact on the recorded events
(a block whose idle interval does not cover every moment of the peak saves less than its
size, or nothing). Findings are ranked by that drop.

Megatron patterns are named where the block's creator says so: logits (the output layer's
activations) kept across the loss into backward; activations a recompute produced kept past
their use; buffers of a gather (sequence or context parallelism) kept to backward.

Known limitations: CUDA's own history has no last use (only the storage ledger's has); a
block allocated before the recorded window has no birth time and is not a finding.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memscope.analysis.active_memory import band_label
from memscope.analysis.allocator_timeline import (
    LiveBlock,
    Markers,
    block_parts,
    device_trace,
    replay,
)
from memscope.events.ownership import OwnershipIndex
from memscope.events.schema import ContextMarker, IdleFinding

MAX_FINDINGS = 20


def _pattern(category: str, label: str) -> str:
    if category != "activations":
        return ""
    if label.endswith("output_layer"):
        return "logits alive across the loss and into backward"
    if label.startswith("recompute "):
        return "an activation a recompute produced, kept past its use"
    if "gather" in label:
        return "a gathered (sequence / context parallel) buffer kept to backward"
    return ""


def idle_at_peak(
    snapshot: Mapping[str, Any],
    device: int = 0,
    owners: OwnershipIndex | None = None,
    markers: Iterable[ContextMarker] = (),
    limit: int = MAX_FINDINGS,
) -> tuple[int, tuple[IdleFinding, ...]]:
    """The bytes idle at the window's peak, and the findings ranked by peak drop."""
    kept = list(markers)
    trace = device_trace(snapshot, device)
    peak = replay(snapshot, device, kept)
    if peak.index < 0 or peak.time_us is None:
        return 0, ()
    totals, times = _series(trace, peak.start_bytes)
    frees = _free_events(trace)
    live_last_use = _live_last_use(snapshot, device)
    idle: list[tuple[LiveBlock, int, int, int | None]] = []  # block, birth, last use, free
    for block in peak.live:
        if block.index is None or block.time_us is None:
            continue
        born = block.time_us
        free_index = _next_free(frees, block.addr, block.index)
        if free_index is None:
            last_use = live_last_use.get(block.addr)
        else:
            last_use = trace[free_index].get("last_use_us")
        if last_use is None:
            continue
        last_use = max(int(last_use), born)  # never used: idle from its birth
        if last_use < peak.time_us:
            idle.append((block, born, last_use, free_index))
    idle_bytes = sum(b.size for b, _, _, _ in idle)
    by_time = Markers(kept)
    index = owners or OwnershipIndex()

    def label_of(addr: int, size: int, born: int) -> tuple[str, str]:
        parts = block_parts(addr, size, born, True, index, by_time)
        return band_label(max(parts, key=lambda kn: kn[1])[0])

    groups: dict[tuple[str, str], list[tuple[LiveBlock, int, int, int | None]]] = {}
    for item in idle:
        groups.setdefault(label_of(item[0].addr, item[0].size, item[1]), []).append(item)
    ranked = sorted(groups.items(), key=lambda kv: -sum(i[0].size for i in kv[1]))[:limit]
    wanted = {key for key, _ in ranked}
    members_of: dict[tuple[str, str], list[tuple[int, int, int]]] = {key: [] for key in wanted}
    for addr, size, born, last_use, end in _window_lifetimes(trace, live_last_use):
        key = label_of(addr, size, born)
        if key in wanted:
            members_of[key].append((size, last_use, end))
    findings = []
    for (category, label), items in ranked:
        # every allocation this holder made in the window, freed right after its last use
        members = members_of[(category, label)]
        new_peak = _peak_without(totals, times, members)
        block, born, last_use, free_index = max(items, key=lambda i: i[0].size)
        findings.append(
            IdleFinding(
                category=category,
                label=label,
                nbytes=sum(i[0].size for i in items),
                alloc_us=born,
                last_use_us=last_use,
                free_us=None if free_index is None else _time(trace[free_index]),
                idle_us=peak.time_us - min(i[2] for i in items),
                peak_drop=max(0, peak.allocated_bytes - new_peak),
                pattern=_pattern(category, label),
                count=len(items),
            )
        )
    findings.sort(key=lambda f: (-f.peak_drop, -f.nbytes))
    return idle_bytes, tuple(findings)


def _window_lifetimes(
    trace: Sequence[Mapping[str, Any]], live_last_use: Mapping[int, int]
) -> list[tuple[int, int, int, int, int]]:
    """(address, size, birth, last use, sample index of its free or the end) of every
    allocation in the window whose last use is known."""
    out = []
    open_: dict[int, tuple[int, int, int]] = {}  # addr -> size, birth, alloc index
    for i, event in enumerate(trace):
        action, addr = event.get("action"), int(event.get("addr", 0))
        if action == "alloc":
            open_[addr] = (int(event["size"]), _time(event) or 0, i)
        elif action == "free_requested" and addr in open_:
            size, born, _ = open_.pop(addr)
            if event.get("last_use_us") is not None:
                out.append((addr, size, born, max(born, int(event["last_use_us"])), i + 1))
    for addr, (size, born, _) in open_.items():
        if addr in live_last_use:
            out.append((addr, size, born, max(born, live_last_use[addr]), len(trace) + 1))
    return out


def _peak_without(
    totals: Sequence[int], times: Sequence[int], members: Sequence[tuple[int, int, int]]
) -> int:
    """The highest allocated total had each (size, last use, end sample) been freed right
    after its last use."""
    diff = [0] * (len(totals) + 1)
    for size, last_use, end in members:
        first = bisect.bisect_right(times, last_use) + 1  # the first event after it frees it
        if first < end:
            diff[first] -= size
            diff[min(end, len(totals))] += size
    best, shift = 0, 0
    for k, total in enumerate(totals):
        shift += diff[k]
        best = max(best, total + shift)
    return best


def _time(event: Mapping[str, Any]) -> int | None:
    value = event.get("time_us")
    return None if value is None else int(value)


def _series(trace: Sequence[Mapping[str, Any]], start: int) -> tuple[list[int], list[int]]:
    """Allocated bytes at the window start and after each event; each event's time (an event
    without one takes the previous)."""
    totals, times, current, last = [start], [], start, 0
    for event in trace:
        action = event.get("action")
        if action == "alloc":
            current += int(event["size"])
        elif action == "free_requested":
            current -= int(event["size"])
        totals.append(current)
        last = _time(event) or last
        times.append(last)
    return totals, times


def _free_events(trace: Sequence[Mapping[str, Any]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, event in enumerate(trace):
        if event.get("action") == "free_requested":
            out.setdefault(int(event.get("addr", 0)), []).append(i)
    return out


def _next_free(frees: Mapping[int, list[int]], addr: int, after: int) -> int | None:
    found = frees.get(addr) or []
    i = bisect.bisect_right(found, after)
    return found[i] if i < len(found) else None


def _live_last_use(snapshot: Mapping[str, Any], device: int) -> dict[int, int]:
    out = {}
    for segment in snapshot.get("segments") or []:
        if int(segment.get("device", 0)) != device:
            continue
        for block in segment.get("blocks") or []:
            if block.get("state") == "active_allocated" and block.get("last_use_us"):
                out[int(block["address"])] = int(block["last_use_us"])
    return out
