"""Why memory changed from one step to the next (the ``step_transitions`` section).

Each transition compares what a step left behind with what the step before it left (for the
first traced step: with what it started from): allocated, reserved, device memory outside
PyTorch (``device_used - reserved``: NCCL communicators, the CUDA context) and, where the
backend classifies memory, the bytes per category. A transition is

* **steady**: allocated and reserved moved by at most the tolerance;
* **one-time growth**: allocated grew once, and stopped; its cause is the category that grew
  most (``optimizer_state``: the optimizer's first step creates its state; ``gradients``:
  the first gradients fill their buffers), or memory outside PyTorch grew (a communicator
  or context initialised);
* **cache growth**: reserved grew while allocated did not: the caching allocator kept more
  than it hands out (fragmentation); ``expandable_segments:True`` lets it grow segments
  instead of adding new ones;
* **leak candidate**: allocated grew in ``leak_steps`` consecutive transitions, counting only
  growth that can recur: one-time growth is never leak. Left out are the growth of model
  state and run-long buffers (parameters, gradients, optimizer state: the optimizer's first
  real step creates its state; Megatron's global memory buffer grows to its largest use),
  where the backend classifies memory, and the first traced step as a whole (it compares
  with where tracing started: lazily allocated buffers and the allocator's warm-up land
  there). Leaks are judged on allocated bytes only: reserved memory also grows with
  fragmentation and is given back only on demand;
* **release**: allocated fell.

A leak's **rate** is the median of its steps' recurring growth (a one-time jump inside the
run, on a backend that cannot classify it, does not move a median), and ``rate_basis`` says
which steps it came from and what was left out.

A leak's **suspects** come from backends that keep a ledger of live storages (``storage``):
at each step's end, the activations and other memory born after the first step, in an
earlier step, and still live, by the module, phase, microbatch and chunk that created them,
with the steps they were born in and the bytes each step added.

The tolerance is ``tolerance`` of the allocated bytes before the transition (0.01% by
default: 4 MiB at 40 GiB), so a steady run stays steady through the noise of small
per-step tensors, while anything growing faster is flagged within ``leak_steps`` steps.

Known limitations: steps thinned away by the step analyzer (very long runs) are compared
across the gap; CUDA-graph private pools are not told apart from other allocated memory.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memscope.events.schema import (
    ONE_TIME_CATEGORIES,
    MemoryEvent,
    Survivor,
    is_step_end,
)
from memscope.events.sections import SectionLayout, SectionSpec

#: Suspects listed per leak.
MAX_SUSPECTS = 10
#: Steps whose long-lived allocations are kept (the newest), to bound memory.
KEPT_SURVIVOR_STEPS = 64
#: Consecutive growing transitions that make a leak candidate.
LEAK_STEPS = 3
#: Allocated moves within this share of the allocated bytes count as steady.
TOLERANCE = 1e-4
#: What the allocator setting that answers cache growth is.
EXPANDABLE_SEGMENTS = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"

#: The usual reason a category grows once, early in a run.
ONE_TIME_CAUSES = {
    "optimizer_state": "the optimizer's first step creates its state",
    "gradients": "the first backward fills the gradient buffers",
    "parameters": "parameters created or moved after tracing started",
    "activations": "activations kept across the step boundary",
    "other": "memory kept across the step boundary",
    "buffers": "a run-long buffer grew (Megatron's global memory buffer grows to its largest "
    "use and is never freed)",
}


class TransitionKind(str, enum.Enum):
    """What a step-to-step change of memory is."""

    STEADY = "steady"
    ONE_TIME_GROWTH = "one_time_growth"
    CACHE_GROWTH = "cache_growth"
    LEAK_CANDIDATE = "leak_candidate"
    RELEASE = "release"


@dataclass(frozen=True, slots=True)
class Transition:
    """How memory changed from the end of ``from_step`` (None: the start of ``step``) to the
    end of ``step``."""

    step: int
    from_step: int | None
    allocated_delta: int
    reserved_delta: int
    outside_delta: int | None  # device memory outside PyTorch; None without device readings
    category_deltas: dict[str, int]
    kind: TransitionKind = TransitionKind.STEADY
    cause: str = ""

    @property
    def one_time_bytes(self) -> int:
        """Growth that is one-time by nature: model state and run-long buffers created."""
        return sum(max(0, self.category_deltas.get(c, 0)) for c in ONE_TIME_CATEGORIES)

    @property
    def recurring_delta(self) -> int:
        """The allocated change that can recur (a leak's share): less one-time growth; the
        first traced step has none (see the module doc)."""
        if self.from_step is None:
            return 0
        return self.allocated_delta - self.one_time_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "from_step": self.from_step,
            "kind": self.kind.value,
            "cause": self.cause,
            "allocated_delta": self.allocated_delta,
            "reserved_delta": self.reserved_delta,
            "outside_pytorch_delta": self.outside_delta,
            "category_deltas": dict(self.category_deltas),
        }


def _outside(row: Mapping[str, Any]) -> int | None:
    device = row.get("device_end") or {}
    used = device.get("device_used_bytes")
    return None if used is None else int(used) - int(row.get("reserved_end") or 0)


def _deltas(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    b, a = before.get("categories_end"), after.get("categories_end")
    if b is None or a is None:
        return {}
    out = {k: int(a.get(k, 0)) - int(b.get(k, 0)) for k in sorted(set(a) | set(b))}
    return {k: v for k, v in out.items() if v}


def measure(steps: Sequence[Mapping[str, Any]]) -> list[Transition]:
    """The unclassified transitions of ``steps`` (rows of the ``steps`` section, in order);
    the first compares the first step's end with its start."""
    out: list[Transition] = []
    for i, row in enumerate(steps):
        if i == 0:
            before: Mapping[str, Any] = {
                "allocated_end": row.get("allocated_start", 0),
                "reserved_end": row.get("reserved_end", 0),
                "categories_end": row.get("categories_start"),
            }
            outside_delta = None
        else:
            before = steps[i - 1]
            o0, o1 = _outside(before), _outside(row)
            outside_delta = None if o0 is None or o1 is None else o1 - o0
        out.append(
            Transition(
                step=int(row["step"]),
                from_step=None if i == 0 else int(before["step"]),
                allocated_delta=int(row.get("allocated_end") or 0)
                - int(before.get("allocated_end") or 0),
                reserved_delta=0
                if i == 0
                else int(row.get("reserved_end") or 0) - int(before.get("reserved_end") or 0),
                outside_delta=outside_delta,
                category_deltas=_deltas(before, row),
            )
        )
    return out


def classify(
    transitions: Sequence[Transition],
    allocated_before: Sequence[int],
    leak_steps: int = LEAK_STEPS,
    tolerance: float = TOLERANCE,
) -> list[Transition]:
    """Label each transition (see the module doc); ``allocated_before[i]`` is the allocated
    bytes transition ``i`` started from."""
    assert len(transitions) == len(allocated_before) and leak_steps >= 2
    slack = [max(1, int(tolerance * max(0, b))) for b in allocated_before]
    grows = [t.recurring_delta > s for t, s in zip(transitions, slack, strict=True)]
    grew = [t.allocated_delta > s for t, s in zip(transitions, slack, strict=True)]
    in_leak = [False] * len(transitions)
    run = 0
    for i, growing in enumerate(grows):
        run = run + 1 if growing else 0
        if run >= leak_steps:
            for j in range(i - run + 1, i + 1):
                in_leak[j] = True
    out = []
    for t, s, growing, leak in zip(transitions, slack, grew, in_leak, strict=True):
        kind, cause = TransitionKind.STEADY, ""
        if leak:
            kind = TransitionKind.LEAK_CANDIDATE
            cause = f"allocated grew in {leak_steps} or more consecutive steps" + _top(t)
            if t.one_time_bytes:
                cause += f"; {t.one_time_bytes} bytes of it one-time growth (model state)"
        elif growing:
            kind, cause = TransitionKind.ONE_TIME_GROWTH, _growth_cause(t)
        elif t.allocated_delta < -s:
            kind, cause = TransitionKind.RELEASE, "allocated fell"
        elif t.reserved_delta > s:
            kind = TransitionKind.CACHE_GROWTH
            cause = f"reserved grew, allocated did not: fragmentation; try {EXPANDABLE_SEGMENTS}"
        elif t.outside_delta is not None and t.outside_delta > s:
            kind = TransitionKind.ONE_TIME_GROWTH
            cause = "device memory outside PyTorch grew (a communicator or context initialised)"
        out.append(Transition(**{**_fields(t), "kind": kind, "cause": cause}))
    return out


def _fields(t: Transition) -> dict[str, Any]:
    return {name: getattr(t, name) for name in Transition.__slots__}


def _top(t: Transition) -> str:
    """ "; <category> grew most" (of the categories that can leak) when the backend
    classifies memory."""
    grown = [(k, v) for k, v in t.category_deltas.items() if v > 0 and k not in ONE_TIME_CATEGORIES]
    return f"; {max(grown, key=lambda kv: kv[1])[0]} grew most" if grown else ""


def _growth_cause(t: Transition) -> str:
    if t.category_deltas:
        category, nbytes = max(t.category_deltas.items(), key=lambda kv: kv[1])
        if nbytes > 0:
            return f"{category}: {ONE_TIME_CAUSES.get(category, 'grew')}"
    if t.from_step is None:
        return "the first traced step kept memory it did not start with"
    return "allocated grew once"


def leak_runs(transitions: Sequence[Transition]) -> list[dict[str, Any]]:
    """Each run of leak-candidate transitions: its steps and bytes added per step."""
    runs: list[list[Transition]] = []
    for t in transitions:
        if t.kind is TransitionKind.LEAK_CANDIDATE:
            if runs and runs[-1][-1].step == (t.from_step if t.from_step is not None else -1):
                runs[-1].append(t)
            else:
                runs.append([t])
    out = []
    for run in runs:
        deltas = sorted(t.recurring_delta for t in run)
        half = len(deltas) // 2
        median = deltas[half] if len(deltas) % 2 else (deltas[half - 1] + deltas[half]) // 2
        one_time = sum(t.one_time_bytes for t in run)
        basis = (
            f"median of the recurring growth of steps {run[0].step}–{run[-1].step} "
            f"({len(run)} steps)"
        )
        if one_time:
            basis += f", less {one_time} bytes of one-time model-state / buffer growth"
        first = transitions[0]
        if run[0].from_step == first.step and first.kind is TransitionKind.ONE_TIME_GROWTH:
            basis += f"; the first traced step ({first.step}) grew once and is left out"
        out.append(
            {
                "first_step": run[0].step,
                "last_step": run[-1].step,
                "steps": len(run),
                "bytes_added": sum(deltas),
                "bytes_per_step": median,
                "rate_basis": basis,
            }
        )
    return out


def leak_suspects(survivors: Sequence[Survivor], limit: int = MAX_SUSPECTS) -> list[dict[str, Any]]:
    """What a leak is made of: the long-lived allocations of one step's end (see
    :class:`~memscope.events.schema.Survivor`) by where they were created, with the steps
    they were born in and the bytes each such step added; largest first."""
    groups: dict[tuple[str, str, int | None, int | None], list[Survivor]] = {}
    for item in survivors:
        key = (item.phase, item.module, item.microbatch, item.virtual_chunk)
        groups.setdefault(key, []).append(item)
    out: list[dict[str, Any]] = []
    for (phase, module, microbatch, chunk), items in groups.items():
        total = sum(i.nbytes for i in items)
        births = sorted({i.birth_step for i in items})
        largest = max(items, key=lambda i: i.nbytes)
        suspect: dict[str, Any] = {
            "module": module,
            "phase": phase,
            "microbatch": microbatch,
            "virtual_chunk": chunk,
            "birth_steps": births,
            "bytes": total,
            "bytes_per_step": total // len(births),
            "count": sum(i.count for i in items),
        }
        if largest.shape is not None:  # what it is: its largest storage's creating tensor
            suspect["shape"], suspect["dtype"] = list(largest.shape), largest.dtype
        with_stack = [i for i in items if i.stack]
        if with_stack:  # where in the code: the frames of its largest recorded storage
            suspect["stack"] = list(max(with_stack, key=lambda i: i.nbytes).stack)
            suspect["line"] = suspect["stack"][0]
        out.append(suspect)
    return sorted(out, key=lambda d: -int(d["bytes"]))[:limit]


class StepTransitionAnalyzer:
    """Classifies the step-to-step transitions of the ``steps`` section built before it, and
    names the suspects of each leak from the long-lived allocations of its steps."""

    section_specs = (
        SectionSpec(
            "step_transitions", "Step to step", SectionLayout.CUSTOM, "step_transitions", order=80
        ),
    )

    def __init__(self, leak_steps: int = LEAK_STEPS, tolerance: float = TOLERANCE) -> None:
        self.leak_steps, self.tolerance = leak_steps, tolerance
        #: Step -> long-lived allocations at its end, for the latest steps that had any.
        self.survivors: dict[int, tuple[Survivor, ...]] = {}

    def consume(self, e: MemoryEvent) -> None:
        if is_step_end(e) and e.survivors:
            self.survivors[e.step] = e.survivors
            if len(self.survivors) > KEPT_SURVIVOR_STEPS:
                del self.survivors[min(self.survivors)]

    def _suspects(self, last_step: int) -> list[dict[str, Any]]:
        known = [step for step in self.survivors if step <= last_step]
        return leak_suspects(self.survivors[max(known)]) if known else []

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        steps = list(prior.get("steps") or [])
        measured = measure(steps)
        before = [int(s.get("allocated_start") or 0) for s in steps[:1]] + [
            int(s.get("allocated_end") or 0) for s in steps[:-1]
        ]
        classified = classify(measured, before, self.leak_steps, self.tolerance)
        counts = {kind.value: 0 for kind in TransitionKind}
        for t in classified:
            counts[t.kind.value] += 1
        return {
            "step_transitions": {
                "counts": counts,
                "leaks": [
                    {**run, "suspects": self._suspects(run["last_step"])}
                    for run in leak_runs(classified)
                ],
                "leak_steps": self.leak_steps,
                "tolerance": self.tolerance,
                "transitions": [
                    t.to_dict() for t in classified if t.kind is not TransitionKind.STEADY
                ],
            }
        }
