"""Memory idle at the peak (``memscope.analysis.lifetimes``): on snapshot dictionaries whose
frees carry ``last_use_us`` (as the storage ledger writes them), and on a real megatron-core
GPT with a planted late free, whose predicted peak drop equals the measured one."""

from __future__ import annotations

import difflib
import os

import pytest
from conftest import load_json, run_in_process
from test_allocator_timeline import SEG, _snapshot

from memscope.analysis.lifetimes import idle_at_peak
from memscope.events.schema import ContextMarker
from memscope.io.snapshot_reader import read_snapshot

A, B, C = SEG + 0x200000, SEG + 0x300000, SEG + 0x400000


def _ev(action: str, addr: int, size: int, t: int, last_use: int | None = None) -> dict:
    event = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
             "frames": []}  # fmt: skip
    if last_use is not None:
        event["last_use_us"] = last_use
    return event


MARKERS = [
    ContextMarker(90, "forward", "embedding", 0, 0, step=0),
    ContextMarker(105, "forward", "layers.0", 0, 0, step=0),
    ContextMarker(125, "backward", "layers.0", 0, 0, step=0),
]


def test_a_block_idle_through_the_peak_is_found_with_the_drop_its_early_free_gives():
    trace = [
        _ev("alloc", A, 4096, 100),  # embedding output, last read at 110, freed at 200
        _ev("alloc", B, 8192, 110),
        _ev("alloc", C, 8192, 130),  # the peak: A + B + C
        _ev("free_requested", C, 8192, 140, last_use=135),
        _ev("free_requested", B, 8192, 150, last_use=145),
        _ev("free_requested", A, 4096, 200, last_use=110),
    ]
    idle_bytes, findings = idle_at_peak(_snapshot(trace, {}), markers=MARKERS)
    assert idle_bytes == 4096
    (f,) = findings
    assert (f.category, f.label, f.nbytes, f.count) == ("activations", "forward · embedding",
                                                         4096, 1)  # fmt: skip
    assert (f.last_use_us, f.free_us, f.idle_us) == (110, 200, 130 - 110)
    assert f.peak_drop == 4096  # freed after 110, the peak would be B + C


def test_the_drop_is_what_the_timeline_allows_not_the_blocks_size():
    D = SEG + 0x500000
    trace = [
        _ev("alloc", D, 18432, 90),  # an earlier high that A is not part of
        _ev("free_requested", D, 18432, 95, last_use=94),
        _ev("alloc", A, 4096, 100),
        _ev("alloc", B, 16384, 102),  # the peak: A + B = 20480, A idle since 101
        _ev("free_requested", B, 16384, 104, last_use=103),
        _ev("free_requested", A, 4096, 200, last_use=101),
    ]
    _, findings = idle_at_peak(_snapshot(trace, {}), markers=MARKERS)
    (f,) = findings
    assert f.nbytes == 4096 and f.peak_drop == 20480 - 18432  # D's high is what remains


def test_without_last_uses_there_is_no_finding():
    trace = [_ev("alloc", A, 4096, 100), _ev("free_requested", A, 4096, 200)]
    assert idle_at_peak(_snapshot(trace, {}), markers=MARKERS) == (0, ())


@pytest.mark.integration
def test_a_planted_late_free_is_flagged_with_the_peak_drop_measured_without_it(tmp_path, small_cfg):
    argv = ["--memscope-enable-memory-snapshot", "--memscope-snapshot-start-step", "1",
            "--memscope-snapshot-steps", "2"]  # fmt: skip
    peaks, histories = {}, {}
    for late in (False, True):
        out = ["--memscope", "--memscope-outdir", str(tmp_path / str(late)), *argv]
        path = run_in_process(small_cfg, 4, out, late_free=late).report_path
        peaks[late] = load_json(path)["allocator_timeline"]
        histories[late] = _history(
            os.path.join(os.path.dirname(path), "memory_snapshot_steps1-2.pickle")
        )
    top = peaks[True]["idle_at_peak"][0]
    measured = peaks[True]["peak_bytes"] - peaks[False]["peak_bytes"]
    assert (top["category"], top["label"]) == ("activations", "forward · decoder.layers.0")
    # the layer output held until the next step; exact where the two runs differ only by the
    # planted block's frees, else within the bytes whose place differs (listed if it fails)
    by_chance = _moved_by_chance(histories[False], histories[True], "forward decoder.layers.0 ")
    assert sum(size for _, size, _ in by_chance) < top["bytes"] // 8, by_chance
    assert abs(top["peak_drop"] - measured) <= sum(size for _, size, _ in by_chance), by_chance
    assert measured > 0
    assert top["bytes"] == small_cfg.seq_length * small_cfg.micro_batch_size * 64 * 4
    assert peaks[True]["idle_at_peak_bytes"] >= top["bytes"]


def _history(path: str) -> list[tuple[str, int, str]]:
    """A storage-ledger history's allocations and frees: action, size, creator."""
    trace = read_snapshot(path)["device_traces"][0]
    return [
        (e["action"], int(e["size"]), e["frames"][0]["name"] if e.get("frames") else "")
        for e in trace
        if e["action"] in ("alloc", "free_requested")
    ]


def _moved_by_chance(
    plain: list[tuple[str, int, str]], planted: list[tuple[str, int, str]], held: str
) -> list[tuple[str, int, str]]:
    """The events where two runs' histories differ, other than the frees of what the plant
    holds (created by ``held``): what moved between the runs by chance, not by the plant."""
    matcher = difflib.SequenceMatcher(a=plain, b=planted, autojunk=False)
    return [
        event
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
        for event in plain[i1:i2] + planted[j1:j2]
        if not (event[0] == "free_requested" and event[2].startswith(held))
    ]
