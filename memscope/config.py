"""One typed configuration object for the runtime, built from Megatron args at the boundary.

Every runtime setting is written once, as a :class:`RuntimeConfig` field declared with
:func:`setting`: its name, type (the annotation), default, help text, and where needed its
choices or command-line spelling. :func:`runtime_settings` reads the fields back as
:class:`Setting` records, from which ``add_memscope_args`` builds the argparse flags and
:meth:`RuntimeConfig.from_megatron_args` reads a parsed namespace back.

The command line spells each field ``--memscope-<name with dashes>`` (dest
``memscope_<name>``) unless the field gives its own ``flag``.

This module imports nothing else from ``memscope``: it sits below every other layer.
"""

from __future__ import annotations

import functools
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

SNAPSHOT_STACKS = ("none", "python", "all")
FLAG_PREFIX = "--memscope-"
# Flat fields that the report nests as one schedule dict (see RuntimeConfig.to_report_dict).
_SCHEDULE_PARTS = {
    "profiler_wait": "profiler_schedule",
    "profiler_warmup": "profiler_schedule",
    "profiler_active": "profiler_schedule",
    "snapshot_start_step": "snapshot_schedule",
    "snapshot_steps": "snapshot_schedule",
}


def setting(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    flag: str | None = None,
    none_as: int | None = None,
    shown_default: str | None = None,
    metavar: str | None = None,
) -> Any:
    """A :class:`RuntimeConfig` field that is also a command-line setting.

    ``help``: the flag's help text, without the default (the parser appends it).
    ``choices``: the allowed values (argparse ``choices``; :meth:`RuntimeConfig.validate`
    checks them too). ``flag``: the option string when it is not ``--memscope-<name>``.
    ``none_as``: a negative int that spells ``None`` on the command line (the parser's
    default; any negative value reads back as ``None``). ``shown_default``: how the help
    text shows the default, when the value itself says little (``None``). ``metavar``: the
    value's name in the help (default ``N`` for numbers).
    """
    metadata = {
        "help": help,
        "choices": choices,
        "flag": flag,
        "none_as": none_as,
        "shown_default": shown_default,
        "metavar": metavar,
    }
    if isinstance(default, list):
        items = list(default)
        return field(default_factory=lambda: list(items), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """One command-line setting, as :func:`runtime_settings` derives it from its field."""

    name: str  # the RuntimeConfig attribute
    flag: str  # e.g. "--memscope-top-k"
    dest: str  # e.g. "memscope_top_k": the attribute on a parsed namespace
    value_type: type  # int, str or bool; for a list field, the type of one item
    is_list: bool  # nargs="+"
    default: Any  # the field's default (cli_default and from_cli hand out copies)
    help: str
    choices: tuple[str, ...] | None = None
    none_as: int | None = None
    shown_default: str | None = None
    metavar: str | None = None

    @property
    def is_switch(self) -> bool:
        return self.value_type is bool and not self.is_list

    @property
    def cli_default(self) -> Any:
        """The parser's default: the field default, or ``none_as`` standing for ``None``."""
        if self.default is None and self.none_as is not None:
            return self.none_as
        return _copy(self.default)

    def from_cli(self, value: Any) -> Any:
        """The field value for a namespace attribute (``None``: absent, use the default)."""
        if value is None:
            return _copy(self.default)
        if self.none_as is not None and value < 0:
            return None
        if self.is_list:
            return list(value)
        if self.is_switch:
            return bool(value)
        return value


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def _unpack(annotation: Any) -> tuple[type, bool]:
    """``(item type, is_list)`` for ``T``, ``list[T]``, ``T | None`` or ``list[T] | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) != 1:
            raise TypeError(f"setting type {annotation!r} is not T, T | None or list[T]")
        annotation = members[0]
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return item, True
    if not isinstance(annotation, type):
        raise TypeError(f"setting type {annotation!r} is not T, T | None or list[T]")
    return annotation, False


class SettingError(ValueError):
    """A setting :meth:`RuntimeConfig.validate` refuses; ``settings``: the fields to put
    back to their defaults."""

    def __init__(self, settings: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.settings = settings


def _has_type(value: Any, s: Setting) -> bool:
    """Whether ``value`` is of the setting's type (``None`` where ``None`` is allowed)."""
    if value is None:
        return s.default is None or s.none_as is not None
    if s.is_list:
        return isinstance(value, list) and all(_has_type(v, _item(s)) for v in value)
    if s.value_type is bool:
        return isinstance(value, bool)
    if s.value_type is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, s.value_type) and not isinstance(value, bool)


def _item(s: Setting) -> Setting:
    return replace(s, is_list=False, default=0, none_as=None)


@dataclass
class ProfilerSchedule:
    """A schedule in training steps: skip ``wait``, warm up ``warmup``, record ``active``."""

    wait: int = 1
    warmup: int = 1
    active: int = 2

    def validate(self, what: str) -> None:
        if self.wait < 0 or self.warmup < 0 or self.active < 1:
            raise ValueError(
                f"{what} schedule needs wait >= 0, warmup >= 0, active >= 1; got "
                f"wait={self.wait} warmup={self.warmup} active={self.active}"
            )


@dataclass
class RuntimeConfig:
    """Everything the runtime tracer needs; defaults are what ``--memscope`` alone gives."""

    enabled: bool = setting(False, "Enable MemScope runtime memory tracing", flag="--memscope")
    #: Settings put back to their default when the config was read (not a setting itself).
    notes: list[str] = field(default_factory=list, compare=False, repr=False)
    outdir: str = setting("memscope_outputs", "Report directory", metavar="DIR")
    top_k: int = setting(20, "Hot spots kept")
    # Any name here: the backend registry (capture/backends) offers the valid ones.
    backend: str = setting(
        "auto",
        "Memory backend: auto (the best one available: the CUDA allocator on a GPU, exact "
        "tensor accounting on CPU) or a registered backend's name; an unknown name falls "
        "back to auto with a warning naming the registered ones",
        metavar="NAME",
    )
    hook_modules: bool = setting(True, "Module forward hooks")
    hook_output_grads: bool = setting(True, "Output-tensor grad hooks")
    hook_param_grads: bool = setting(True, "Parameter grad hooks")
    sync_on_step_boundaries: bool = setting(False, "torch.cuda.synchronize at step callbacks")
    sync_on_module_hooks: bool = setting(False, "torch.cuda.synchronize in module hooks (slow)")
    reset_peak_stats: bool = setting(
        False,
        "cuda backend: reset torch.cuda's process-wide peak counters at every step start, "
        "for exact per-step peaks; Megatron's own 'max allocated' log then shows per-step "
        "values (off: the counters are left to the host, and only steps that raise the run's "
        "high-water mark have an exact peak)",
    )
    storage_capacity_mib: float = setting(
        0.0,
        "storage backend: raise torch.OutOfMemoryError when live tensor memory would exceed "
        "this many MiB, as a device of that size would (rehearse an OOM, or check that a "
        "setting fits, on CPU); 0: no limit",
        metavar="MIB",
    )
    job_summary: bool = setting(
        True,
        "At the end (and at an OOM or crash), send this rank's summary to the lowest traced "
        "rank through torch.distributed's store; that rank writes OUTDIR/job_summary.json "
        "(no shared file system needed; no collective, so a dead rank cannot hang the others)",
    )
    job_summary_timeout: float = setting(
        60.0,
        "Seconds the rank writing job_summary.json waits for the other ranks' summaries; "
        "those not in by then are named as missing",
        metavar="SECONDS",
    )
    dashboard_peaks: bool = setting(
        True,
        "Every rank's per-step peak, shared through torch.distributed's store, is logged by "
        "the rank that has the training's TensorBoard / W&B writers (job maximum, its rank, "
        "each rank up to 64); ranks send nothing while no rank has a writer",
    )
    # RUF009 waived on list fields: setting() returns a field with a default_factory.
    ranks: list[int] | None = setting(None, "Ranks to trace", shown_default="all", metavar="RANK")  # noqa: RUF009
    step_start: int = setting(0, "First step whose module/grad events are recorded")
    step_end: int | None = setting(
        None,
        "Step (exclusive) after which module/grad events stop; -1: never",
        none_as=-1,
    )
    hook_steps: int = setting(
        20,
        "Module/grad hooks record this many steps inside the window, then only step "
        "boundaries are recorded (0: every step)",
    )
    detail_steps: int = setting(2, "Traced steps whose module/grad events are kept in the report")
    max_trace_events: int = setting(200_000, "Upper bound on events held in memory for the report")
    trace_jsonl: bool = setting(True, "Stream every event to rankNNNNN/trace.jsonl")
    trace_max_mib: int = setting(
        1024,
        "Size cap of trace.jsonl in MiB: past it the trace rotates to trace.1.jsonl (0: no cap)",
        metavar="MIB",
    )
    report_interval: int = setting(50, "Rewrite the report every N steps (0: only at the end)")
    record_tensor_shapes: bool = setting(True, "Record input/output shapes")
    enable_profiler: bool = setting(False, "torch.profiler on a step schedule")
    profiler_ranks: list[int] = setting([0], "Ranks that run torch.profiler", metavar="RANK")  # noqa: RUF009
    profiler_wait: int = setting(1, "Profiler schedule: steps skipped before warm-up")
    profiler_warmup: int = setting(1, "Profiler schedule: warm-up steps (traced, discarded)")
    profiler_active: int = setting(2, "Profiler schedule: steps recorded")
    enable_memory_snapshot: bool = setting(False, "CUDA allocator history snapshot")
    snapshot_ranks: list[int] = setting([0], "Ranks recording allocator history", metavar="RANK")  # noqa: RUF009
    snapshot_start_step: int = setting(0, "First step the allocator history is recorded from")
    snapshot_steps: int = setting(2, "Steps of allocator history recorded, then dumped")
    snapshot_max_entries: int = setting(100_000, "Allocator history entries kept")
    snapshot_stacks: str = setting(
        "none",
        "none (cheapest: no stacks), python, or all (adds C++ frames; dumping can take minutes)",
        choices=SNAPSHOT_STACKS,
    )

    @property
    def profiler_schedule(self) -> ProfilerSchedule:
        return ProfilerSchedule(self.profiler_wait, self.profiler_warmup, self.profiler_active)

    @property
    def snapshot_schedule(self) -> ProfilerSchedule:
        return ProfilerSchedule(self.snapshot_start_step, 0, self.snapshot_steps)

    def to_report_dict(self) -> dict[str, Any]:
        """The report's ``config`` block: the fields, each schedule as one nested dict.

        Same keys, order and values as ``dataclasses.asdict`` gave when the schedules were
        ``ProfilerSchedule`` fields, so the report schema does not change.
        """
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "notes":
                continue
            schedule = _SCHEDULE_PARTS.get(f.name)
            if schedule is None:
                out[f.name] = _copy(getattr(self, f.name))
            elif schedule not in out:
                out[schedule] = asdict(getattr(self, schedule))
        return out

    def validate(self) -> RuntimeConfig:
        """Raise :class:`SettingError` (a ``ValueError``) naming the offending setting;
        return ``self``."""
        for s in runtime_settings():
            value = getattr(self, s.name)
            choices = choices_of(s)
            if choices is not None and value not in choices:
                raise SettingError(
                    (s.name,), f"memscope {s.name} must be one of {choices}, not {value!r}"
                )
            if not _has_type(value, s):
                raise SettingError((s.name,), f"memscope {s.name} has the wrong type: {value!r}")
        if self.top_k < 1:
            raise SettingError(("top_k",), f"memscope top_k must be >= 1, got {self.top_k}")
        for name in ("storage_capacity_mib", "job_summary_timeout", "step_start", "detail_steps",
                     "max_trace_events", "report_interval", "trace_max_mib"):  # fmt: skip
            if not getattr(self, name) >= 0:  # NaN too
                raise SettingError(
                    (name,), f"memscope {name} must be >= 0, got {getattr(self, name)}"
                )
        if self.step_end is not None and self.step_end <= self.step_start:
            raise SettingError(
                ("step_end",),
                f"memscope step_end ({self.step_end}) must be greater than step_start "
                f"({self.step_start})",
            )
        for schedule in ("profiler_schedule", "snapshot_schedule"):
            try:
                getattr(self, schedule).validate("memscope " + schedule.split("_")[0])
            except ValueError as exc:
                parts = tuple(f for f, owner in _SCHEDULE_PARTS.items() if owner == schedule)
                raise SettingError(parts, str(exc)) from None
        return self

    def settled(self) -> tuple[RuntimeConfig, list[str]]:
        """This config with every setting :meth:`validate` refuses put back to its default,
        and one note per setting put back (what training sees instead of an exception)."""
        current = self
        notes: list[str] = []
        defaults = {s.name: s.default for s in runtime_settings()}
        for _ in range(len(defaults) + 1):
            try:
                return current.validate(), notes
            except SettingError as exc:
                reset = {name: _copy(defaults[name]) for name in exc.settings}
                shown = ", ".join(f"{k}={v!r}" for k, v in reset.items())
                notes.append(f"{exc}; using the default ({shown})")
                current = replace(current, **reset)
        raise AssertionError("the defaults themselves do not validate")  # pragma: no cover

    def traces_rank(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def traced_ranks(self, world_size: int) -> list[int]:
        """The ranks of a ``world_size`` job that this config traces, in order."""
        return [r for r in range(world_size) if self.traces_rank(r)]

    def in_step_window(self, step: int) -> bool:
        return step >= self.step_start and (self.step_end is None or step < self.step_end)

    def warn_ignored(self, cuda_available: bool, backend: str) -> list[str]:
        """Warn (and return the messages) for settings that this run will ignore."""
        flag = {s.name: s.flag for s in runtime_settings()}
        notes: list[str] = []
        if not cuda_available and self.enable_memory_snapshot and backend != "storage":
            notes.append(
                f"memscope: memory snapshot needs CUDA; {flag['enable_memory_snapshot']} ignored"
            )
        if backend != "cuda" and (self.sync_on_module_hooks or self.sync_on_step_boundaries):
            notes.append(f"memscope: CUDA sync options have no effect with the {backend} backend")
        if backend != "storage" and self.storage_capacity_mib:
            notes.append(
                f"memscope: {flag['storage_capacity_mib']} applies to the storage backend only; "
                f"ignored with the {backend} backend"
            )
        if backend != "cuda" and self.reset_peak_stats:
            notes.append(
                f"memscope: {flag['reset_peak_stats']} has no effect with the {backend} backend "
                "(it resets no counter of the host)"
            )
        if not self.hook_modules and self.hook_output_grads:
            notes.append(
                "memscope: output-grad hooks are attached from module forwards; "
                f"{flag['hook_output_grads']} ignored while {flag['hook_modules']} is off"
            )
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return notes

    @classmethod
    def from_megatron_args(cls, args: Any) -> RuntimeConfig:
        """Build from an argparse namespace produced with ``add_memscope_args``. Never
        raises into training: a value that can't be used (a wrong type, ``-1`` where a size
        belongs, an unregistered backend, ...) takes its default, said once as a warning and
        in :attr:`notes` (and so in the report's warnings).

        Missing attributes fall back to the defaults, so a namespace from an older provider
        (the original flag set) works too.
        """
        kwargs, notes = {}, []
        for s in runtime_settings():
            try:
                kwargs[s.name] = s.from_cli(getattr(args, s.dest, None))
            except (TypeError, ValueError) as exc:
                kwargs[s.name] = _copy(s.default)
                notes.append(f"memscope {s.name} could not be read ({exc}); using the default")
        config, more = cls(**kwargs).settled()
        config.notes = notes + more
        for note in config.notes:  # logged once here; the session reports them
            warnings.warn(note, stacklevel=2)
        return config


# Settings whose valid values the module owning them declares at run time (the backend
# registry offers the registered backends' names): setting name -> the values valid now.
_OFFERED: dict[str, Callable[[], tuple[str, ...]]] = {}


def offer_choices(name: str, offered: Callable[[], tuple[str, ...]]) -> None:
    """Let the module that owns the values of setting ``name`` say which are valid (the
    backend registry offers the registered backends). :meth:`RuntimeConfig.validate` then
    refuses any other value, so :meth:`RuntimeConfig.settled` puts it back to its default
    with a note naming the valid ones; until something is offered, any value passes."""
    assert name in {s.name for s in runtime_settings() if s.choices is None}, name
    _OFFERED[name] = offered


def choices_of(s: Setting) -> tuple[str, ...] | None:
    """The values setting ``s`` accepts now: its declared choices, or those offered."""
    if s.choices is not None:
        return s.choices
    offered = _OFFERED.get(s.name)
    return None if offered is None else offered()


@functools.cache
def runtime_settings() -> tuple[Setting, ...]:
    """Every :class:`RuntimeConfig` field declared with :func:`setting`, in field order."""
    hints = typing.get_type_hints(RuntimeConfig)
    out = []
    for f in fields(RuntimeConfig):
        if "help" not in f.metadata:
            continue
        item, is_list = _unpack(hints[f.name])
        flag = f.metadata["flag"] or FLAG_PREFIX + f.name.replace("_", "-")
        default = f.default if f.default_factory is MISSING else f.default_factory()
        out.append(
            Setting(
                name=f.name,
                flag=flag,
                dest=flag.lstrip("-").replace("-", "_"),
                value_type=item,
                is_list=is_list,
                default=default,
                help=f.metadata["help"],
                choices=f.metadata["choices"],
                none_as=f.metadata["none_as"],
                shown_default=f.metadata["shown_default"],
                metavar=f.metadata["metavar"] or ("N" if item is int else None),
            )
        )
    return tuple(out)
