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
from typing import Any, NamedTuple

from memscope.analysis.active_memory import band_label
from memscope.analysis.allocator_timeline import (
    Markers,
    allocated_delta,
    block_parts,
    device_trace,
    event_time,
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


class _Lifetime(NamedTuple):
    """One allocation of the window whose last use is known."""

    addr: int
    size: int
    born: int  # µs
    last_use: int  # µs, never before its birth (an allocation never read is idle from then)
    alloc: int  # its event's position in the trace
    end: int  # the sample that no longer holds it: after its free, or past the end
    free_us: int | None  # None: still live when the history was dumped


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
    peak_time = peak.time_us
    totals, times = _series(trace, peak.start_bytes)
    lifetimes = _window_lifetimes(trace, _live_last_use(snapshot, device))
    # live at the peak (allocated at or before its event, not yet freed) and unused since
    idle = [
        life
        for life in lifetimes
        if life.alloc <= peak.index < life.end - 1 and life.last_use < peak_time
    ]
    by_time = Markers(kept)
    index = owners or OwnershipIndex()

    def label_of(life: _Lifetime) -> tuple[str, str]:
        parts = block_parts(life.addr, life.size, life.born, True, index, by_time)
        return band_label(max(parts, key=lambda kn: kn[1])[0])

    groups: dict[tuple[str, str], list[_Lifetime]] = {}
    for life in idle:
        groups.setdefault(label_of(life), []).append(life)
    ranked = sorted(groups.items(), key=lambda kv: -sum(life.size for life in kv[1]))[:limit]
    wanted = {key for key, _ in ranked}
    members_of: dict[tuple[str, str], list[_Lifetime]] = {key: [] for key in wanted}
    for life in lifetimes:
        key = label_of(life)
        if key in wanted:
            members_of[key].append(life)
    findings = []
    for (category, label), items in ranked:
        # every allocation this holder made in the window, freed right after its last use
        new_peak = _peak_without(totals, times, members_of[(category, label)])
        largest = max(items, key=lambda life: life.size)
        findings.append(
            IdleFinding(
                category=category,
                label=label,
                nbytes=sum(life.size for life in items),
                alloc_us=largest.born,
                last_use_us=largest.last_use,
                free_us=largest.free_us,
                idle_us=peak_time - min(life.last_use for life in items),
                peak_drop=max(0, peak.allocated_bytes - new_peak),
                pattern=_pattern(category, label),
                count=len(items),
            )
        )
    findings.sort(key=lambda f: (-f.peak_drop, -f.nbytes))
    return sum(life.size for life in idle), tuple(findings)


def _window_lifetimes(
    trace: Sequence[Mapping[str, Any]], live_last_use: Mapping[int, int]
) -> list[_Lifetime]:
    """Every allocation in the window with a time and a known last use (from its free, or
    from the block still live at the dump)."""
    out = []
    open_: dict[int, tuple[int, int | None, int]] = {}  # addr -> size, birth, alloc index
    for i, event in enumerate(trace):
        action, addr = event.get("action"), int(event.get("addr", 0))
        if action == "alloc":
            open_[addr] = (int(event["size"]), event_time(event), i)
        elif action == "free_requested" and addr in open_:
            size, born, at = open_.pop(addr)
            if born is not None and event.get("last_use_us") is not None:
                last_use = max(born, int(event["last_use_us"]))
                out.append(_Lifetime(addr, size, born, last_use, at, i + 1, event_time(event)))
    for addr, (size, born, at) in open_.items():
        if born is not None and addr in live_last_use:
            last_use = max(born, live_last_use[addr])
            out.append(_Lifetime(addr, size, born, last_use, at, len(trace) + 1, None))
    return out


def _peak_without(totals: Sequence[int], times: Sequence[int], members: Sequence[_Lifetime]) -> int:
    """The highest allocated total had each member been freed right after its last use."""
    diff = [0] * (len(totals) + 1)
    for life in members:
        first = bisect.bisect_right(times, life.last_use) + 1  # the first event after it
        if first < life.end:
            diff[first] -= life.size
            diff[min(life.end, len(totals))] += life.size
    best, shift = 0, 0
    for k, total in enumerate(totals):
        shift += diff[k]
        best = max(best, total + shift)
    return best


def _series(trace: Sequence[Mapping[str, Any]], start: int) -> tuple[list[int], list[int]]:
    """Allocated bytes at the window start and after each event; each event's time (an event
    without one takes the previous)."""
    totals, times, current, last = [start], [], start, 0
    for event in trace:
        current += allocated_delta(event)
        totals.append(current)
        last = event_time(event) or last
        times.append(last)
    return totals, times


def _live_last_use(snapshot: Mapping[str, Any], device: int) -> dict[int, int]:
    out = {}
    for segment in snapshot.get("segments") or []:
        if int(segment.get("device", 0)) != device:
            continue
        for block in segment.get("blocks") or []:
            if block.get("state") == "active_allocated" and block.get("last_use_us"):
                out[int(block["address"])] = int(block["last_use_us"])
    return out
