"""A training log's run -> the estimator's :class:`TrainingSpec`.

The arguments block (or, when that is all the log has, the launch command line) is read by
the same reader as a FlagScale YAML (:func:`spec_from_flagscale_yaml`: Megatron's argument
names, its defaults, the non-GPT refusals), with the world size the log itself states.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass, replace
from typing import Any

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.megatron_versions import ReleaseRange, release_range
from memscope.analysis.static.validation import ConfigWarning
from memscope.analysis.static.workspaces import check_machine
from memscope.analysis.unlogged_settings import UnloggedSetting, older_release
from memscope.inputs.config_files import spec_from_flagscale_yaml
from memscope.inputs.training_log import LogRun

_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?$")
MAX_LITERAL = 100_000  # characters of a printed list parsed as a literal


def typed(value: Any) -> Any:
    """An argument as ``_print_args`` printed it (``str()`` of the value) -> the value:
    ``None``, ``True``/``False``, numbers and lists; anything else stays a string."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text.startswith("[") and text.endswith("]") and len(text) <= MAX_LITERAL:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return text
    return text


@dataclass(frozen=True)
class LogOptions:
    """What a log cannot say about its run, given on the command line (``None``: read from
    the log where it says it, else assumed, and the report says which)."""

    vocab_size: int | None = None  # the tokenizer's unpadded vocabulary
    world_size: int | None = None  # checked against what the log says
    gpu: str | None = None  # sizes the fixed workspaces (H100 assumed)
    transformer_engine_version: str | None = None  # workspaces, placeholder gradients

    def __post_init__(self) -> None:
        for name in ("vocab_size", "world_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        check_machine(self.gpu, self.transformer_engine_version)


#: A log read with nothing from the command line.
NO_OPTIONS = LogOptions()


@dataclass(frozen=True)
class RunSpec:
    """The spec of a run and what it was read from."""

    spec: TrainingSpec
    origin: str  # "arguments block" / "command line"
    where: str
    world_size: int
    world_origin: str
    notes: tuple[str, ...]
    #: What the log cannot show about this run beyond the general settings: the older
    #: releases it dates to whose terms differ, each with the spec read there
    #: (``log_check.explained_if``).
    unlogged: tuple[UnloggedSetting, ...] = ()


def run_args(run: LogRun) -> tuple[dict[str, Any], str, str]:
    """(Megatron args, origin, where) of a run: the arguments block, else the command line."""
    if run.args is not None:
        return {k: typed(v) for k, v in run.args.items()}, "arguments block", run.args_where
    if run.command is not None:
        return {k: typed(v) for k, v in run.command.items()}, "command line", run.command_where
    raise ValueError(
        "neither an arguments block ('------------------------ arguments "
        "------------------------', printed by rank 0 at start-up) nor a Megatron launch "
        "command line is in the log: the run's configuration is unknown"
    )


def run_world_size(run: LogRun, args: dict[str, Any], given: int | None) -> tuple[int, str]:
    """The run's world size and where it comes from; sources that disagree are an error."""
    found: list[tuple[int, str]] = []
    if given is not None:
        found.append((given, "--world-size"))
    if run.world_size is not None:
        found.append((run.world_size, "the log's 'using world size' line"))
    if isinstance(args.get("world_size"), int):
        found.append((args["world_size"], "the arguments block's world_size"))
    if run.launcher_world_size is not None:
        found.append((run.launcher_world_size, "torchrun's --nnodes x --nproc-per-node"))
    for value, where in found[1:]:
        if value != found[0][0]:
            raise ValueError(
                f"world size {found[0][0]} ({found[0][1]}) contradicts {value} ({where})"
            )
    if found:
        return found[0]
    tp_pp_cp = 1
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                 "context_parallel_size"):  # fmt: skip
        size = args.get(name)
        tp_pp_cp *= size if isinstance(size, int) and size > 0 else 1
    dp = args.get("data_parallel_size")
    if isinstance(dp, int) and dp > 0:
        return tp_pp_cp * dp, "tp x pp x cp x data_parallel_size"
    raise ValueError(
        "the world size is not in the log (no 'using world size' line, world_size argument "
        "or torchrun command): give --world-size"
    )


def run_spec(run: LogRun, options: LogOptions = NO_OPTIONS) -> RunSpec:
    """The spec of ``run``, with what ``options`` give that the log does not say (a
    vocabulary when the log has neither ``vocab_size`` nor Megatron's 'padded vocab' line)."""
    args, origin, where = run_args(run)
    world, world_origin = run_world_size(run, args, options.world_size)
    vocab = options.vocab_size if options.vocab_size is not None else run.unpadded_vocab
    args.pop("world_size", None)  # the world size found above wins, checked to agree
    args.pop("data_parallel_size", None)  # derived by Megatron from it
    # a command line names only the flags it sets: only a printed block dates the run
    releases = release_range(set(args)) if origin == "arguments block" else None
    if releases is None:
        spec, notes = _read_at(args, vocab, world, None, options)
        return RunSpec(spec, origin, where, world, world_origin, notes)
    # the newest release whose checks accept the run ran it; older ones whose terms differ
    # are alternatives the verdict may name
    read: list[tuple[str, TrainingSpec, tuple[str, ...]]] = []
    refused: list[str] = []
    for version in releases.distinct_releases():
        try:
            read.append((version, *_read_at(args, vocab, world, version, options)))
        except ValueError as exc:
            if not read:  # a newer release refusing it: the run is older
                refused.append(f"megatron-core {version} refuses it ({exc})")
        except (ArithmeticError, LookupError, TypeError):
            if not read:
                raise
            # an older alternative the reader cannot take is left out
    if not read:
        raise ValueError(
            f"the arguments block dates the run to megatron-core {releases.describe()}, and "
            f"every release of it refuses the configuration: {'; '.join(refused)}"
        )
    (version, spec, notes), older = read[0], read[1:]
    notes += (dating_note(releases, version, refused),)
    unlogged = tuple(older_release(v, s, releases.describe()) for v, s, _ in older)
    return RunSpec(spec, origin, where, world, world_origin, notes, unlogged)


def _read_at(
    args: dict[str, Any], vocab: int | None, world: int, version: str | None, options: LogOptions
) -> tuple[TrainingSpec, tuple[str, ...]]:
    """The spec of ``args`` as megatron-core ``version`` (None: the installed one) runs it on
    the machine ``options`` name, with the reader's notes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        spec = spec_from_flagscale_yaml({"system": args}, vocab, world, version)
    te = options.transformer_engine_version
    spec = replace(spec, gpu=options.gpu, transformer_engine_version=te)
    return spec, tuple(str(w.message) for w in caught)


def dating_note(releases: ReleaseRange, followed: str, refused: list[str]) -> str:
    """What a dated arguments block means for the estimate: the range, the release whose
    terms the estimate follows (``followed``), and the newer ones that refuse the run."""
    why = f"; {'; '.join(refused)}" if refused else ""
    return (
        f"the arguments block has no {releases.missing}: the run's Megatron-LM predates "
        f"megatron-core {releases.predates} (it is megatron-core {releases.describe()}){why}; "
        f"the spec is read and estimated with megatron-core {followed}'s terms "
        "(analysis/static/megatron_versions.py)"
    )
