"""One typed configuration object for the runtime, built from Megatron args at the boundary."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from typing import Any

from memscope.capture.backends import BACKEND_CHOICES

SNAPSHOT_STACKS = ("python", "all")


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

    enabled: bool = False
    outdir: str = "memscope_outputs"
    top_k: int = 20
    backend: str = "auto"
    hook_modules: bool = True
    hook_output_grads: bool = True
    hook_param_grads: bool = True
    sync_on_step_boundaries: bool = False
    sync_on_module_hooks: bool = False
    ranks: list[int] | None = None  # None: every rank
    step_start: int = 0
    step_end: int | None = None  # exclusive; None: until the end
    hook_steps: int = 20  # module/grad hooks record this many steps of the window; 0: all
    detail_steps: int = 2
    max_trace_events: int = 200_000
    trace_jsonl: bool = True
    report_interval: int = 50
    record_tensor_shapes: bool = True
    enable_profiler: bool = False
    profiler_ranks: list[int] = field(default_factory=lambda: [0])
    profiler_schedule: ProfilerSchedule = field(default_factory=ProfilerSchedule)
    enable_memory_snapshot: bool = False
    snapshot_ranks: list[int] = field(default_factory=lambda: [0])
    snapshot_schedule: ProfilerSchedule = field(
        default_factory=lambda: ProfilerSchedule(wait=0, warmup=0, active=2)
    )
    snapshot_max_entries: int = 100_000
    snapshot_stacks: str = "python"

    def validate(self) -> RuntimeConfig:
        """Raise ``ValueError`` naming the offending setting; return ``self``."""
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(
                f"memscope backend must be one of {BACKEND_CHOICES}, not {self.backend!r}"
            )
        if self.top_k < 1:
            raise ValueError(f"memscope top_k must be >= 1, got {self.top_k}")
        if self.step_start < 0:
            raise ValueError(f"memscope step_start must be >= 0, got {self.step_start}")
        if self.step_end is not None and self.step_end <= self.step_start:
            raise ValueError(
                f"memscope step_end ({self.step_end}) must be greater than step_start "
                f"({self.step_start})"
            )
        if self.detail_steps < 0 or self.max_trace_events < 0 or self.report_interval < 0:
            raise ValueError(
                "memscope detail_steps, max_trace_events, report_interval must be >= 0"
            )
        if self.snapshot_stacks not in SNAPSHOT_STACKS:
            raise ValueError(
                f"memscope snapshot_stacks must be one of {SNAPSHOT_STACKS}, not "
                f"{self.snapshot_stacks!r}"
            )
        self.profiler_schedule.validate("memscope profiler")
        self.snapshot_schedule.validate("memscope snapshot")
        return self

    def traces_rank(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def in_step_window(self, step: int) -> bool:
        return step >= self.step_start and (self.step_end is None or step < self.step_end)

    def warn_ignored(self, cuda_available: bool, backend: str) -> list[str]:
        """Warn (and return the messages) for settings that this run will ignore."""
        notes: list[str] = []
        if not cuda_available and self.enable_memory_snapshot:
            notes.append(
                "memscope: memory snapshot needs CUDA; --memscope-enable-memory-snapshot ignored"
            )
        if backend != "cuda" and (self.sync_on_module_hooks or self.sync_on_step_boundaries):
            notes.append(f"memscope: CUDA sync options have no effect with the {backend} backend")
        if not self.hook_modules and self.hook_output_grads:
            notes.append(
                "memscope: output-grad hooks are attached from module forwards; "
                "--memscope-hook-output-grads ignored while --memscope-hook-modules is off"
            )
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return notes

    @classmethod
    def from_megatron_args(cls, args: Any) -> RuntimeConfig:
        """Build from an argparse namespace produced with :func:`add_memscope_args`.

        Missing attributes fall back to the defaults, so a namespace from an older provider
        (the original flag set) works too.
        """
        base = cls()

        def get(name: str, default: Any) -> Any:
            value = getattr(args, f"memscope_{name}", None)
            return default if value is None else value

        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in ("enabled", "profiler_schedule", "snapshot_schedule"):
                continue
            kwargs[f.name] = get(f.name, getattr(base, f.name))
        kwargs["enabled"] = bool(getattr(args, "memscope", False))
        kwargs["ranks"] = list(kwargs["ranks"]) if kwargs["ranks"] is not None else None
        if kwargs["step_end"] is not None and kwargs["step_end"] < 0:
            kwargs["step_end"] = None
        kwargs["profiler_schedule"] = ProfilerSchedule(
            get("profiler_wait", 1), get("profiler_warmup", 1), get("profiler_active", 2)
        )
        kwargs["snapshot_schedule"] = ProfilerSchedule(
            get("snapshot_start_step", 0), 0, get("snapshot_steps", 2)
        )
        return cls(**kwargs).validate()
