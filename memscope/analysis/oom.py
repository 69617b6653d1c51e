"""Why a rank ran out of memory (the ``oom`` section, also written as ``oom_report.json``).

From the ``oom`` event MemScope records when training raises ``torch.OutOfMemoryError`` (see
:meth:`~memscope.capture.tracer.MemoryTracer.record_failure`) and the sections built before:

* **where**: step, phase, module, microbatch and VPP chunk the failing request was made in;
* **the request**: bytes asked for, free and allocated when it failed, read from the error
  message (the CUDA allocator's wording, which the storage backend's capacity limit reuses;
  else MemScope's reading at the failure); reserved; memory outside PyTorch from the last
  step's device reading;
* **verdict**: *fragmentation* when the allocator held at least the requested bytes cached
  but free (reserved - allocated): no block was large enough, and ``expandable_segments``
  would have let it grow one; else *capacity*: the live tensors themselves did not fit;
* **what was live**: the composition at the failure (backends that keep a ledger);
* **growth or spike**: the last steps' peaks and the step-to-step verdict: memory that grew
  step after step (a leak candidate) is not fixed by the same remedies as one step's spike;
  when the leak has suspects (backends that keep a ledger), the ``leak`` record names it as
  the cause (rate, since which step, what is leaking: module, shape, dtype, code line) and
  the first remedy is to fix it: no setting cures a leak, a smaller batch only delays it;
* **the static estimate**, term by term, and **remedies**: settings the estimator predicts
  would lower this rank's peak (computed with the estimate, from the run's own args), kept
  only where that predicted peak, raised by the estimator's band, fits the memory that ran
  out (what PyTorch held, allocated or cached, plus what was free), cheapest by the
  planner's step-time model first; those dropped are counted with the capacity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from memscope.analysis.static.remedies import fitting_remedies
from memscope.analysis.static_comparison import StaticEstimate
from memscope.analysis.step_transitions import EXPANDABLE_SEGMENTS
from memscope.events.schema import OOM, CompositionItem, MemoryEvent, module_label
from memscope.events.sections import SectionLayout, SectionSpec

#: Steps whose peaks are shown before the failure.
RECENT_STEPS = 10
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([\d.]+) ?(B|KiB|MiB|GiB|TiB|bytes)"
_REQUESTED = re.compile(r"Tried to allocate " + _SIZE)
_FREE = re.compile(r"of which " + _SIZE + " (?:is )?free")
_OP = re.compile(r"Failing op: ([\w.:]+?)\.?$", re.M)
_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + " is allocated by PyTorch")


def _bytes(match: re.Match[str] | None) -> int | None:
    if match is None:
        return None
    number, unit = match.groups()
    return int(float(number) * _UNITS.get(unit, 1))


def parse_oom_message(message: str) -> tuple[int | None, int | None, int | None]:
    """(requested, free, allocated by PyTorch) bytes from an out-of-memory message, as the
    allocator saw them when it failed; None where absent."""
    return (
        _bytes(_REQUESTED.search(message)),
        _bytes(_FREE.search(message)),
        _bytes(_ALLOCATED.search(message)),
    )


class OomAnalyzer:
    """Keeps the ``oom`` event and explains it with the sections built before it."""

    section_specs = (SectionSpec("oom", "Out of memory", SectionLayout.CUSTOM, "oom", order=10),)

    def __init__(self, static: StaticEstimate) -> None:
        self.static = static
        self.event: MemoryEvent | None = None

    def consume(self, e: MemoryEvent) -> None:
        if e.event_type == OOM and self.event is None:
            self.event = e

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        e = self.event
        if e is None:
            return {"oom": None}
        requested, free, allocated = parse_oom_message(e.notes)
        if allocated is None:  # the reading MemScope took (after the stack unwound)
            allocated = e.mem_allocated_after
        cached_free = max(0, e.mem_reserved_after - e.mem_allocated_after)
        fragmentation = requested is not None and cached_free >= requested
        steps = list(prior.get("steps") or [])
        last_device: Mapping[str, Any] = next(
            (s["device_end"] for s in reversed(steps) if s.get("device_end")), {}
        )
        used = last_device.get("device_used_bytes")
        transitions = prior.get("step_transitions") or {}
        leaks = list(transitions.get("leaks") or [])
        growing = bool(leaks)
        estimate = self.static.estimate or {}
        capacity = None if free is None else allocated + cached_free + free
        remedies, dropped = fitting_remedies(list(estimate.get("remedies") or []), capacity)
        if fragmentation:
            remedies.insert(0, _expandable_segments(cached_free))
        leak = _leak_cause(leaks)
        if leak is not None:
            remedies.insert(0, _fix_the_leak(leak))
        return {
            "oom": {
                "where": {
                    "step": e.step,
                    "phase": e.phase,
                    "module": e.module,
                    "microbatch": e.microbatch,
                    "virtual_chunk": e.virtual_chunk,
                },
                "op": m.group(1) if (m := _OP.search(e.notes)) else None,
                "message": e.notes,
                "requested_bytes": requested,
                "free_bytes": free,
                "allocated_bytes": allocated,
                "reserved_bytes": max(e.mem_reserved_after, allocated),
                "cached_free_bytes": cached_free,
                "outside_pytorch_bytes": None
                if used is None
                else int(used) - int(steps[-1].get("reserved_end") or 0),
                "verdict": "fragmentation" if fragmentation else "capacity",
                "verdict_reason": _reason(fragmentation, requested, cached_free),
                "composition": _composition(e.peak_composition),
                "recent_steps": [
                    {k: s.get(k) for k in ("step", "peak_allocated", "allocated_end")}
                    for s in steps[-RECENT_STEPS:]
                ],
                "trend": "growth" if growing else "spike",
                "trend_reason": _trend_reason(leaks, leak),
                "leak": leak,
                "static": (prior.get("comparisons") or {}).get("components") or [],
                "remedies": remedies,
                "remedy_capacity_bytes": capacity,
                "remedies_dropped": [
                    {k: r.get(k) for k in ("name", "predicted_peak_bytes")} for r in dropped
                ],
            }
        }


def _leak_cause(leaks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The leak that caused the failure, when one with suspects was found: the latest."""
    named = [leak for leak in leaks if leak.get("suspects")]
    if not named:
        return None
    leak = named[-1]
    return {
        "first_step": leak["first_step"],
        "last_step": leak["last_step"],
        "bytes_per_step": leak["bytes_per_step"],
        "rate_basis": leak.get("rate_basis", ""),
        "suspect": leak["suspects"][0],
    }


def suspect_text(suspect: dict[str, Any]) -> str:
    """One suspect in words: module (phase, microbatch), shape and dtype, code line."""
    where = f"{module_label(suspect.get('module'))} ({suspect.get('phase')}"
    if suspect.get("microbatch") is not None:
        where += f", microbatch {suspect['microbatch']}"
    where += ")"
    if suspect.get("shape") is not None:
        shape = "×".join(str(n) for n in suspect["shape"])
        where += f", tensors of shape [{shape}] {suspect.get('dtype', '')}".rstrip()
    if suspect.get("line"):
        where += f", created at {suspect['line']}"
    return where


def _trend_reason(leaks: list[dict[str, Any]], leak: dict[str, Any] | None) -> str:
    if leak is not None:
        return (
            f"a leak: allocated grew {leak['bytes_per_step']} bytes per step since step "
            f"{leak['first_step']}, kept by {suspect_text(leak['suspect'])}"
        )
    if leaks:
        return (
            "allocated grew step after step before the failure (a leak candidate: see "
            "step_transitions)"
        )
    return "no step-to-step growth: the failing step's own peak is too high"


def _fix_the_leak(leak: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "fix the leak",
        "flags": "",
        "args": {},
        "predicted_peak_bytes": None,
        "saving_bytes": None,
        "note": f"{leak['bytes_per_step']} bytes per step kept since step {leak['first_step']} "
        f"by {suspect_text(leak['suspect'])}; release them (no setting cures a leak; a "
        "smaller batch or more recompute only delays the failure)",
    }


def _reason(fragmentation: bool, requested: int | None, cached_free: int) -> str:
    if requested is None:
        return "the error message gives no requested size"
    if fragmentation:
        return (
            f"the allocator held {cached_free} bytes cached but free, at least the "
            f"{requested} requested, yet no block that large: fragmentation"
        )
    return (
        f"{requested} bytes were requested and only {cached_free} were cached free: the live "
        "tensors do not fit"
    )


def _expandable_segments(cached_free: int) -> dict[str, Any]:
    return {
        "name": "expandable segments",
        "flags": EXPANDABLE_SEGMENTS,
        "args": {},
        "predicted_peak_bytes": None,
        "saving_bytes": cached_free,
        "note": "lets the allocator grow a segment instead of needing one free block; "
        "recovers up to the cached-free bytes",
    }


def _composition(items: tuple[CompositionItem, ...] | None) -> list[dict[str, Any]]:
    return [i.to_dict() for i in items or ()]
