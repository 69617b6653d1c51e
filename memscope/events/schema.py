"""The versioned on-disk event schema shared by the trace, the reports and their readers.

Every file MemScope writes carries ``schema_version``. Readers accept any version whose
major number matches :data:`SCHEMA_VERSION` and refuse newer majors with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

SCHEMA_VERSION = "1.1"

# Event types.
STEP_PHASE = "step_phase"
MODULE_FORWARD = "module_forward"
OUTPUT_GRAD = "output_grad"
PARAM_GRAD = "param_grad"
#: One per allocator-history snapshot: its replay (peak, composition, per-step peaks).
ALLOCATOR_TIMELINE = "allocator_timeline"
#: Training failed (an out-of-memory error, or any other exception) in the event's context;
#: ``notes`` holds the reason. At most one per run.
OOM = "oom"
CRASH = "crash"
FAILURE_EVENTS = frozenset({OOM, CRASH})
#: Memory readings at hook points and step boundaries: what the phase, module, hot-spot and
#: peak analyzers fold (the other event types are records about the run).
READING_EVENTS = frozenset({STEP_PHASE, MODULE_FORWARD, OUTPUT_GRAD, PARAM_GRAD})
#: Readings inside a step, at module and gradient hooks.
HOOK_EVENTS = READING_EVENTS - {STEP_PHASE}
#: The category free events carry in allocator-history snapshots MemScope writes:
#: pytorch.org/memory_viz needs some event to have it (see ``reporters/memory_viz.py``).
FREE_CATEGORY = "unknown"

#: The name module events give a model chunk's root module (``chunkN.model`` with VPP chunks;
#: its children are named from the root without it: ``decoder.layers.0``).
ROOT_MODULE = "model"

# Phases. Step phases cover an interval between two training-loop callbacks.
PHASE_FORWARD_BACKWARD = "forward_backward"
PHASE_PRE_OPTIMIZER = "pre_optimizer"
PHASE_OPTIMIZER = "optimizer"
PHASE_STEP = "step"
PHASE_FORWARD = "forward"
PHASE_RECOMPUTE = "recompute"
PHASE_BACKWARD = "backward"
PHASE_SETUP = "setup"
#: Every phase in the one order tables, steps and charts list them: before the first step,
#: the forward-backward step phase followed by the hook phases inside it, then the rest of
#: the step, then the whole step.
PHASE_ORDER = (
    PHASE_SETUP,
    PHASE_FORWARD_BACKWARD,
    PHASE_FORWARD,
    PHASE_RECOMPUTE,
    PHASE_BACKWARD,
    PHASE_PRE_OPTIMIZER,
    PHASE_OPTIMIZER,
    PHASE_STEP,
)


def phase_rank(phase: str) -> int:
    """Where ``phase`` sorts in :data:`PHASE_ORDER` (an unknown phase after every known one)."""
    return PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER)


def is_step_end(e: MemoryEvent) -> bool:
    """Whether ``e`` is the reading a step's end takes: the ``step_phase`` event of the whole
    step (phase :data:`PHASE_STEP`), the one step boundary every analyzer asks about."""
    return e.event_type == STEP_PHASE and e.phase == PHASE_STEP


#: How reports, pages and messages name the place of a reading or an allocation outside every
#: module (a step or phase boundary's reading has module ``""``); the pages' copy is
#: ``NO_MODULE`` in ``reporters/templates/js/format.js`` (``tests/test_step_boundary.py``).
NO_MODULE_LABEL = "(no module)"


def module_label(module: str | None) -> str:
    """``module``, or :data:`NO_MODULE_LABEL` where there is none."""
    return module or NO_MODULE_LABEL


# Memory categories, in the fixed order used by tuples of per-category byte counts (a trace
# stores them by name, so one written before a category existed reads it as 0). ``buffers``:
# run-long scratch a framework keeps for the whole run (Megatron's global memory buffer),
# whichever step or module first asked for it.
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other", "buffers")
(CAT_PARAMETERS, CAT_GRADIENTS, CAT_OPTIMIZER_STATE, CAT_ACTIVATIONS, CAT_OTHER, CAT_BUFFERS) = (
    range(len(CATEGORIES))
)
#: Categories whose growth is one-time by nature: model state and run-long buffers are
#: created once (the optimizer's state at its first real step) and kept, never leaked.
ONE_TIME_CATEGORIES = ("parameters", "gradients", "optimizer_state", "buffers")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Shape, dtype and storage-visible size of one tensor seen by a hook."""

    shape: tuple[int, ...]
    dtype: str
    bytes: int
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype, "bytes": self.bytes}
        if self.name:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorInfo:
        """Inverse of :meth:`to_dict`."""
        return cls(tuple(d["shape"]), str(d["dtype"]), int(d["bytes"]), str(d.get("name", "")))


@dataclass(slots=True)
class MemoryEvent:
    """One recorded memory observation.

    ``mem_*_before``/``after`` are sampled at the start and end of the interval the event
    covers; ``max_mem_*`` is the backend's true high-water mark up to the end of it within
    the current step window (reset at every step start).
    """

    seq: int
    event_type: str
    phase: str
    step: int
    module: str
    timestamp: float
    rank: int
    mem_allocated_before: int
    mem_allocated_after: int
    mem_reserved_before: int
    mem_reserved_after: int
    max_mem_allocated: int
    max_mem_reserved: int
    module_class: str = ""
    microbatch: int | None = None
    pipeline_stage: int | None = None
    virtual_chunk: int | None = None
    recompute: bool = False
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)
    grads: list[TensorInfo] = field(default_factory=list)
    categories: tuple[int, ...] | None = None
    host_rss_bytes: int | None = None
    device: dict[str, int] | None = None
    notes: str = ""
    #: Step-phase events of a backend that sees every allocation: where the window's
    #: high-water mark was set (step, phase, module, microbatch) and the bytes per category
    #: live at that moment.
    peak_context: PeakContext | None = None
    peak_categories: tuple[int, ...] | None = None
    #: ... and what was live there by category x creation context (largest first, bounded).
    peak_composition: tuple[CompositionItem, ...] | None = None
    #: When the event's interval began (seconds since tracing started): module forwards and
    #: step phases, so that exports can draw them as slices.
    start_timestamp: float | None = None
    #: ``allocator_timeline`` events: what replaying the allocator history found.
    timeline: TimelineSummary | None = None
    #: Whole-step events of a backend that classifies memory: the bytes per category when
    #: the step began (what ``categories`` are compared with to explain the step's growth).
    categories_before: tuple[int, ...] | None = None
    #: Whole-step events of a backend that keeps a ledger: activations and other memory born
    #: after the first step, in an earlier step than this one, and still live (largest first).
    survivors: tuple[Survivor, ...] | None = None
    #: Step-phase events (not the whole step) of a backend with a true running peak: the
    #: highest allocation within this phase alone (the window's mark covers the whole step).
    phase_max_allocated: int | None = None

    @property
    def delta_allocated(self) -> int:
        return self.mem_allocated_after - self.mem_allocated_before

    @property
    def delta_reserved(self) -> int:
        return self.mem_reserved_after - self.mem_reserved_before

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; the original report's keys keep their names."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "event_type": self.event_type,
            "module": self.module,
            "module_class": self.module_class,
            "phase": self.phase,
            "step": self.step,
            "microbatch": self.microbatch,
            "pipeline_stage": self.pipeline_stage,
            "virtual_chunk": self.virtual_chunk,
            "recompute": self.recompute,
            "timestamp": round(self.timestamp, 6),
            "rank": self.rank,
            "mem_allocated_before": self.mem_allocated_before,
            "mem_allocated_after": self.mem_allocated_after,
            "mem_reserved_before": self.mem_reserved_before,
            "mem_reserved_after": self.mem_reserved_after,
            "max_mem_allocated": self.max_mem_allocated,
            "max_mem_reserved": self.max_mem_reserved,
            "delta_allocated": self.delta_allocated,
            "delta_reserved": self.delta_reserved,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "grads": [t.to_dict() for t in self.grads],
            "notes": self.notes,
        }
        if self.categories is not None:
            out["categories"] = dict(zip(CATEGORIES, self.categories, strict=True))
        if self.host_rss_bytes is not None:
            out["host_rss_bytes"] = self.host_rss_bytes
        if self.device is not None:
            out["device"] = dict(self.device)
        if self.peak_context is not None:
            out["peak_context"] = self.peak_context.to_dict()
        if self.peak_categories is not None:
            out["peak_categories"] = dict(zip(CATEGORIES, self.peak_categories, strict=True))
        if self.peak_composition is not None:
            out["peak_composition"] = [item.to_dict() for item in self.peak_composition]
        if self.start_timestamp is not None:
            out["start_timestamp"] = round(self.start_timestamp, 6)
        if self.timeline is not None:
            out["timeline"] = self.timeline.to_dict()
        if self.categories_before is not None:
            out["categories_before"] = dict(zip(CATEGORIES, self.categories_before, strict=True))
        if self.survivors is not None:
            out["survivors"] = [item.to_dict() for item in self.survivors]
        if self.phase_max_allocated is not None:
            out["phase_max_allocated"] = self.phase_max_allocated
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryEvent:
        """Inverse of :meth:`to_dict` (a line of ``trace.jsonl``); raises on a bad shape."""
        cats = d.get("categories")
        peak_cats = d.get("peak_categories")
        ctx = d.get("peak_context")
        return cls(
            seq=int(d["seq"]),
            event_type=str(d["event_type"]),
            phase=str(d["phase"]),
            step=int(d["step"]),
            module=str(d["module"]),
            timestamp=float(d["timestamp"]),
            rank=int(d["rank"]),
            mem_allocated_before=int(d["mem_allocated_before"]),
            mem_allocated_after=int(d["mem_allocated_after"]),
            mem_reserved_before=int(d["mem_reserved_before"]),
            mem_reserved_after=int(d["mem_reserved_after"]),
            max_mem_allocated=int(d["max_mem_allocated"]),
            max_mem_reserved=int(d["max_mem_reserved"]),
            module_class=str(d.get("module_class", "")),
            microbatch=_opt_int(d.get("microbatch")),
            pipeline_stage=_opt_int(d.get("pipeline_stage")),
            virtual_chunk=_opt_int(d.get("virtual_chunk")),
            recompute=bool(d.get("recompute", False)),
            inputs=[TensorInfo.from_dict(t) for t in d.get("inputs", ())],
            outputs=[TensorInfo.from_dict(t) for t in d.get("outputs", ())],
            grads=[TensorInfo.from_dict(t) for t in d.get("grads", ())],
            categories=_category_tuple(cats) if cats is not None else None,
            host_rss_bytes=_opt_int(d.get("host_rss_bytes")),
            device={str(k): int(v) for k, v in d["device"].items()} if d.get("device") else None,
            notes=str(d.get("notes", "")),
            peak_context=PeakContext.from_dict(ctx) if ctx is not None else None,
            peak_categories=_category_tuple(peak_cats) if peak_cats is not None else None,
            peak_composition=tuple(CompositionItem.from_dict(i) for i in d["peak_composition"])
            if d.get("peak_composition") is not None
            else None,
            start_timestamp=None
            if d.get("start_timestamp") is None
            else float(d["start_timestamp"]),
            timeline=TimelineSummary.from_dict(d["timeline"]) if d.get("timeline") else None,
            categories_before=_category_tuple(d["categories_before"])
            if d.get("categories_before") is not None
            else None,
            survivors=tuple(Survivor.from_dict(i) for i in d["survivors"])
            if d.get("survivors") is not None
            else None,
            phase_max_allocated=_opt_int(d.get("phase_max_allocated")),
        )


@dataclass(frozen=True, slots=True)
class PeakContext:
    """Where in the training loop a backend saw its high-water mark being set."""

    step: int
    phase: str
    module: str
    microbatch: int | None
    virtual_chunk: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "phase": self.phase,
            "module": self.module,
            "microbatch": self.microbatch,
            "virtual_chunk": self.virtual_chunk,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PeakContext:
        return cls(
            int(d["step"]),
            str(d["phase"]),
            str(d["module"]),
            _opt_int(d["microbatch"]),
            _opt_int(d.get("virtual_chunk")),
        )


@dataclass(frozen=True, slots=True)
class ContextMarker:
    """From ``time_us`` (microseconds since the epoch, the allocator history's clock) on,
    training was in this context, until the next marker."""

    time_us: int
    phase: str
    module: str
    microbatch: int | None = None
    virtual_chunk: int | None = None
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_us": self.time_us,
            "phase": self.phase,
            "module": self.module,
            "microbatch": self.microbatch,
            "virtual_chunk": self.virtual_chunk,
            "step": self.step,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ContextMarker:
        return cls(
            int(d["time_us"]),
            str(d["phase"]),
            str(d["module"]),
            _opt_int(d.get("microbatch")),
            _opt_int(d.get("virtual_chunk")),
            _opt_int(d.get("step")),
        )


@dataclass(frozen=True)
class TimelineSummary:
    """What replaying one allocator-history snapshot found (see
    :mod:`memscope.analysis.allocator_timeline`); carried by an ``allocator_timeline`` event,
    whose ``peak_composition`` holds the live set at the window's peak."""

    snapshot: str  # file name of the snapshot
    source: str  # "cuda_allocator" (torch's history) or "storage_ledger" (MemScope's)
    peak_bytes: int
    peak_time_us: int | None
    peak_context: PeakContext | None  # the marker current when the peak was reached
    window_start_bytes: int
    events: int
    inconsistencies: int
    coverage: float  # share of the peak's bytes allocated inside the window
    step_peaks: dict[int, int]  # allocated high-water mark of each recorded step
    #: Live bytes through the peak's step, by who holds them (None: not computed).
    active_memory: ActiveMemory | None = None
    #: Bytes live at the peak whose last use came before it, and the largest findings.
    idle_at_peak_bytes: int | None = None
    idle_at_peak: tuple[IdleFinding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot,
            "source": self.source,
            "peak_bytes": self.peak_bytes,
            "peak_time_us": self.peak_time_us,
            "peak_context": None if self.peak_context is None else self.peak_context.to_dict(),
            "window_start_bytes": self.window_start_bytes,
            "events": self.events,
            "inconsistencies": self.inconsistencies,
            "coverage": round(self.coverage, 6),
            "step_peaks": {str(k): v for k, v in sorted(self.step_peaks.items())},
            "active_memory": None if self.active_memory is None else self.active_memory.to_dict(),
            "idle_at_peak_bytes": self.idle_at_peak_bytes,
            "idle_at_peak": [f.to_dict() for f in self.idle_at_peak],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimelineSummary:
        ctx = d.get("peak_context")
        return cls(
            snapshot=str(d["snapshot"]),
            source=str(d["source"]),
            peak_bytes=int(d["peak_bytes"]),
            peak_time_us=_opt_int(d.get("peak_time_us")),
            peak_context=None if ctx is None else PeakContext.from_dict(ctx),
            window_start_bytes=int(d["window_start_bytes"]),
            events=int(d["events"]),
            inconsistencies=int(d["inconsistencies"]),
            coverage=float(d["coverage"]),
            step_peaks={int(k): int(v) for k, v in (d.get("step_peaks") or {}).items()},
            active_memory=ActiveMemory.from_dict(active)
            if (active := d.get("active_memory"))
            else None,
            idle_at_peak_bytes=_opt_int(d.get("idle_at_peak_bytes")),
            idle_at_peak=tuple(IdleFinding.from_dict(f) for f in d.get("idle_at_peak") or ()),
        )


@dataclass(frozen=True, slots=True)
class IdleFinding:
    """A block live at the peak that no op used since ``last_use_us``, and how much lower the
    peak would have been had it been freed then (see :mod:`memscope.analysis.lifetimes`)."""

    category: str
    label: str  # the phase · module that allocated it, or its owner
    nbytes: int
    alloc_us: int
    last_use_us: int
    free_us: int | None  # None: still live when the history was dumped
    idle_us: int  # from its last use to the peak
    peak_drop: int
    pattern: str = ""  # a Megatron pattern it matches
    count: int = 1  # blocks of this holder idle at the peak (the times above: the largest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "label": self.label,
            "bytes": self.nbytes,
            "alloc_us": self.alloc_us,
            "last_use_us": self.last_use_us,
            "free_us": self.free_us,
            "idle_us": self.idle_us,
            "peak_drop": self.peak_drop,
            "pattern": self.pattern,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IdleFinding:
        return cls(
            str(d["category"]),
            str(d["label"]),
            int(d["bytes"]),
            int(d["alloc_us"]),
            int(d["last_use_us"]),
            _opt_int(d.get("free_us")),
            int(d["idle_us"]),
            int(d["peak_drop"]),
            str(d.get("pattern", "")),
            int(d.get("count", 1)),
        )


@dataclass(frozen=True, slots=True)
class Survivor:
    """Bytes allocated in one context and step that are still live steps later (what a leak
    is made of): the creation context, the step they were born in, how many storages, and
    (when the history recorded stacks) the Python frames that created the largest of them,
    innermost first, each ``file:line in function``; the shape and dtype of the tensor that
    created that storage (empty where the ledger did not see one)."""

    phase: str
    module: str
    microbatch: int | None
    virtual_chunk: int | None
    birth_step: int
    nbytes: int
    count: int
    stack: tuple[str, ...] = ()
    shape: tuple[int, ...] | None = None
    dtype: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase,
            "module": self.module,
            "microbatch": self.microbatch,
            "virtual_chunk": self.virtual_chunk,
            "birth_step": self.birth_step,
            "bytes": self.nbytes,
            "count": self.count,
        }
        if self.stack:
            out["stack"] = list(self.stack)
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.dtype:
            out["dtype"] = self.dtype
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Survivor:
        shape = d.get("shape")
        return cls(
            str(d["phase"]),
            str(d["module"]),
            _opt_int(d.get("microbatch")),
            _opt_int(d.get("virtual_chunk")),
            int(d["birth_step"]),
            int(d["bytes"]),
            int(d["count"]),
            tuple(str(f) for f in d.get("stack") or ()),
            None if shape is None else tuple(int(n) for n in shape),
            str(d.get("dtype") or ""),
        )


@dataclass(frozen=True, slots=True)
class MemoryBand:
    """One band of an active-memory timeline: the bytes one holder had live at each sample
    (an owner such as a grad buffer, or what one module allocated in one phase)."""

    category: str
    label: str
    values: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "label": self.label, "bytes": list(self.values)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryBand:
        return cls(str(d["category"]), str(d["label"]), tuple(int(v) for v in d["bytes"]))


@dataclass(frozen=True)
class ActiveMemory:
    """Allocated bytes through one step, sampled at allocator events and stacked by holder
    (see :mod:`memscope.analysis.active_memory`); the bands sum to the allocated total."""

    step: int | None  # None: the whole recorded window (no step markers)
    time_us: tuple[int, ...]  # of each sample, since the step's first event
    bands: tuple[MemoryBand, ...]
    peak_index: int  # the sample at the step's high-water mark
    events: int  # allocator events in the step, before sampling

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "time_us": list(self.time_us),
            "bands": [band.to_dict() for band in self.bands],
            "peak_index": self.peak_index,
            "events": self.events,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ActiveMemory:
        return cls(
            step=_opt_int(d.get("step")),
            time_us=tuple(int(t) for t in d["time_us"]),
            bands=tuple(MemoryBand.from_dict(b) for b in d["bands"]),
            peak_index=int(d["peak_index"]),
            events=int(d["events"]),
        )


@dataclass(frozen=True, slots=True)
class CompositionItem:
    """Bytes live at a peak with one category, created in one context (phase, module,
    microbatch, VPP chunk; empty module and ``None`` where there was none)."""

    category: str
    phase: str
    module: str
    microbatch: int | None
    virtual_chunk: int | None
    nbytes: int
    #: Activations: whether autograd saved them for backward (else temporaries); None when
    #: not known (other categories, backends that cannot tell).
    saved: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "phase": self.phase,
            "module": self.module,
            "microbatch": self.microbatch,
            "virtual_chunk": self.virtual_chunk,
            "bytes": self.nbytes,
            "saved": self.saved,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompositionItem:
        saved = d.get("saved")
        return cls(
            str(d["category"]),
            str(d["phase"]),
            str(d["module"]),
            _opt_int(d.get("microbatch")),
            _opt_int(d.get("virtual_chunk")),
            int(d["bytes"]),
            None if saved is None else bool(saved),
        )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _category_tuple(by_name: dict[str, Any]) -> tuple[int, ...]:
    return tuple(int(by_name.get(name, 0)) for name in CATEGORIES)


class EventConsumer(Protocol):
    """Anything fed the event stream: the bounded store, an analyzer, the trace writer."""

    def consume(self, event: MemoryEvent) -> None:
        """Take one event (called in emission order)."""


def schema_major(version: str) -> int:
    """The major number of a ``schema_version`` string such as ``"1.0"``."""
    head = str(version).split(".", 1)[0]
    if not head.isdigit():
        raise ValueError(f"schema_version {version!r} is not of the form MAJOR.MINOR")
    return int(head)
