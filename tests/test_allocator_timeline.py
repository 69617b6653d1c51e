"""Replaying a CUDA allocator snapshot (``memscope.analysis.allocator_timeline``) on snapshot
dictionaries in the documented ``torch.cuda.memory._snapshot()`` format: the window's start
state, the true peak and its live set, ring-buffer wrap / late start as coverage, and the
attribution of each live block to an owner or to the training context of its allocation."""

from __future__ import annotations

from typing import Any

import pytest

from memscope.analysis.allocator_timeline import (
    BEFORE_WINDOW,
    attribute_peak,
    peak_composition,
    replay,
)
from memscope.events.ownership import OwnedRange, OwnerCategory, OwnershipIndex
from memscope.events.schema import ContextMarker

SEG = 0x7F0000000000  # one 64 MiB segment


def _event(action: str, addr: int, size: int, time_us: int) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us,
            "frames": []}  # fmt: skip


def _snapshot(trace: list[dict[str, Any]], allocated: dict[int, int]) -> dict[str, Any]:
    """A snapshot whose segment holds ``allocated`` blocks (address -> size) at its end."""
    blocks = [{"address": a, "size": n, "requested_size": n, "state": "active_allocated",
               "frames": []} for a, n in sorted(allocated.items())]  # fmt: skip
    used = sum(allocated.values())
    blocks.append({"address": SEG + 2**25, "size": 2**26 - used, "state": "inactive"})
    segment = {"device": 0, "address": SEG, "total_size": 2**26, "allocated_size": used,
               "active_size": used, "stream": 0, "blocks": blocks}  # fmt: skip
    return {"segments": [segment], "device_traces": [trace]}


P, G, A1, A2, T = SEG, SEG + 0x100000, SEG + 0x200000, SEG + 0x300000, SEG + 0x400000


def _step() -> dict[str, Any]:
    """Parameters and gradients allocated before recording; then one forward/backward:
    activation a1 (forward), a2 (forward), a temporary t in backward at the peak, all freed."""
    trace = [
        _event("alloc", A1, 4096, 100),
        _event("alloc", A2, 8192, 110),
        _event("free_requested", A1, 4096, 120),
        _event("free_completed", A1, 4096, 121),
        _event("alloc", T, 8192, 130),  # peak: P + G + A2 + T
        _event("free_requested", T, 8192, 140),
        _event("free_requested", A2, 8192, 150),
    ]
    return _snapshot(trace, {P: 1024, G: 1024})


def test_the_peak_is_the_allocated_high_water_mark_and_its_live_set():
    peak = replay(_step())
    assert peak.start_bytes == 2048  # parameters and gradients, live before the window
    assert peak.allocated_bytes == 2048 + 8192 + 8192
    assert peak.index == 4 and peak.time_us == 130
    assert {(b.addr, b.size) for b in peak.live} == {(P, 1024), (G, 1024), (A2, 8192), (T, 8192)}
    assert peak.inconsistencies == 0
    assert peak.coverage == pytest.approx((8192 + 8192) / peak.allocated_bytes)


def test_a_wrapped_ring_is_a_lower_coverage_not_a_wrong_peak():
    full = _step()
    wrapped = _snapshot(full["device_traces"][0][2:], {P: 1024, G: 1024})  # lost a1, a2 allocs
    peak = replay(wrapped)
    # a2 was allocated before the surviving window: it is in the start state, not lost
    assert peak.allocated_bytes == replay(full).allocated_bytes
    assert peak.start_bytes == 2048 + 4096 + 8192
    assert peak.coverage == pytest.approx(8192 / peak.allocated_bytes)


def test_live_blocks_split_by_owner_and_by_the_context_of_their_allocation():
    owners = OwnershipIndex(
        [
            OwnedRange(P, P + 1024, "decoder.layers.0.mlp.weight", OwnerCategory.PARAMETERS),
            OwnedRange(G, G + 1024, "ddp.buffers[0].grad_data", OwnerCategory.GRADIENTS, True),
            OwnedRange(G, G + 512, "decoder.layers.0.mlp.weight", OwnerCategory.GRADIENTS),
        ]
    )
    markers = [
        ContextMarker(90, "forward", "decoder.layers.0", 0, 0),
        ContextMarker(105, "forward", "decoder.layers.1.mlp", 1, 0),
        ContextMarker(125, "backward", "decoder.layers.1.self_attention", 1, 0),
    ]
    peak = peak_composition(_step(), owners=owners, markers=markers)
    got = {(i.category, i.phase, i.module, i.microbatch): i.nbytes for i in peak.composition}
    assert got == {
        ("activations", "forward", "decoder.layers.1.mlp", 1): 8192,
        ("activations", "backward", "decoder.layers.1.self_attention", 1): 8192,
        ("parameters", "", "decoder.layers.0.mlp.weight", None): 1024,
        ("gradients", "", "decoder.layers.0.mlp.weight", None): 512,
        ("gradients", "", "ddp.buffers[0].grad_data", None): 512,  # bucket padding
    }
    assert sum(got.values()) == peak.allocated_bytes
    # without owners or markers nothing is lost: pre-window bytes are said to be so
    bare = {(i.category, i.module): i.nbytes for i in attribute_peak(replay(_step()))}
    assert bare == {("other", BEFORE_WINDOW): 2048, ("other", ""): 8192 + 8192}


def test_a_free_of_a_block_it_never_saw_is_counted_as_an_inconsistency():
    snap = _step()
    snap["device_traces"][0].insert(0, _event("free_requested", P, 1024, 50))  # P live at end
    assert replay(snap).inconsistencies == 1


def test_no_history_is_the_snapshot_state():
    peak = replay(_snapshot([], {P: 1024}))
    assert (peak.allocated_bytes, peak.index, peak.coverage, peak.events) == (1024, -1, 0.0, 0)
