"""Megatron argparse integration: ``add_memscope_args`` and provider composition.

Every switch takes an optional boolean value, so it can be turned on *and* off from a
FlagScale YAML, whose runner turns ``key: true`` into a bare ``--key`` and drops
``key: false``: write ``memscope_hook_modules: "false"`` (or ``0``) to turn a default-on
switch off, or use the matching ``--memscope-no-...`` switch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from memscope.capture.backends import BACKEND_CHOICES
from memscope.config import SNAPSHOT_STACKS, RuntimeConfig

ArgsProvider = Callable[[argparse.ArgumentParser], argparse.ArgumentParser]

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


def parse_bool(text: str | bool) -> bool:
    """Parse ``true/false``, ``on/off``, ``yes/no``, ``1/0`` (any case)."""
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, on/off, 1/0), got {text!r}")


def _switch(group: argparse._ArgumentGroup, name: str, default: bool, help_text: str) -> None:
    dest = "memscope" if name == "" else f"memscope_{name.replace('-', '_')}"
    flag = "--memscope" if name == "" else f"--memscope-{name}"
    state = "on" if default else "off"
    group.add_argument(
        flag,
        dest=dest,
        nargs="?",
        const=True,
        default=default,
        type=parse_bool,
        metavar="BOOL",
        help=f"{help_text} (default {state}; '{flag} false' turns it off)",
    )
    if name:
        group.add_argument(
            f"--memscope-no-{name}", dest=dest, action="store_false", help=argparse.SUPPRESS
        )


def add_memscope_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register MemScope's arguments on ``parser`` (a Megatron ``extra_args_provider``)."""
    d = RuntimeConfig()
    g = parser.add_argument_group(title="memscope")
    _switch(g, "", False, "Enable MemScope runtime memory tracing")
    g.add_argument("--memscope-outdir", type=str, default=d.outdir, help="Report directory")
    g.add_argument("--memscope-top-k", type=int, default=d.top_k, help="Hot spots kept")
    g.add_argument(
        "--memscope-backend",
        choices=BACKEND_CHOICES,
        default=d.backend,
        help="auto: cuda on a GPU, storage (exact tensor accounting) on CPU",
    )
    _switch(g, "hook-modules", d.hook_modules, "Module forward hooks")
    _switch(g, "hook-output-grads", d.hook_output_grads, "Output-tensor grad hooks")
    _switch(g, "hook-param-grads", d.hook_param_grads, "Parameter grad hooks")
    _switch(g, "enable-profiler", False, "torch.profiler on a step schedule")
    _switch(g, "enable-memory-snapshot", False, "CUDA allocator history snapshot")
    _switch(g, "sync-on-step-boundaries", False, "torch.cuda.synchronize at step callbacks")
    _switch(g, "sync-on-module-hooks", False, "torch.cuda.synchronize in module hooks (slow)")
    _switch(g, "trace-jsonl", d.trace_jsonl, "Stream every event to rankNNNNN/trace.jsonl")
    _switch(g, "record-tensor-shapes", d.record_tensor_shapes, "Record input/output shapes")
    g.add_argument("--memscope-profiler-ranks", nargs="+", type=int, default=[0])
    g.add_argument("--memscope-snapshot-ranks", nargs="+", type=int, default=[0])
    g.add_argument(
        "--memscope-ranks", nargs="+", type=int, default=None, help="Ranks to trace (default all)"
    )
    g.add_argument(
        "--memscope-step-start",
        type=int,
        default=d.step_start,
        help="First step whose module/grad events are recorded",
    )
    g.add_argument(
        "--memscope-step-end",
        type=int,
        default=-1,
        help="Step (exclusive) after which module/grad events stop; -1: never",
    )
    g.add_argument(
        "--memscope-hook-steps",
        type=int,
        default=d.hook_steps,
        help="Module/grad hooks record this many steps inside the window, then only step "
        "boundaries are recorded (0: every step)",
    )
    g.add_argument(
        "--memscope-detail-steps",
        type=int,
        default=d.detail_steps,
        help="Traced steps whose module/grad events are kept in the report",
    )
    g.add_argument(
        "--memscope-max-trace-events",
        type=int,
        default=d.max_trace_events,
        help="Upper bound on events held in memory for the report",
    )
    g.add_argument(
        "--memscope-report-interval",
        type=int,
        default=d.report_interval,
        help="Rewrite the report every N steps (0: only at the end)",
    )
    g.add_argument("--memscope-profiler-wait", type=int, default=1)
    g.add_argument("--memscope-profiler-warmup", type=int, default=1)
    g.add_argument("--memscope-profiler-active", type=int, default=2)
    g.add_argument("--memscope-snapshot-start-step", type=int, default=0)
    g.add_argument("--memscope-snapshot-steps", type=int, default=2)
    g.add_argument("--memscope-snapshot-max-entries", type=int, default=d.snapshot_max_entries)
    g.add_argument(
        "--memscope-snapshot-stacks",
        choices=SNAPSHOT_STACKS,
        default=d.snapshot_stacks,
        help="python (fast, default) or all (adds C++ frames; dumping can take minutes)",
    )
    return parser


def compose_args_providers(*providers: ArgsProvider | None) -> ArgsProvider:
    """One ``extra_args_provider`` calling each given provider in turn (``None`` skipped).

    Megatron accepts exactly one provider; FlagScale's ``train_gpt.py`` already passes
    ``add_modelopt_args``, so pass ``compose_args_providers(add_memscope_args, that)``.
    """
    chain = [p for p in providers if p is not None]

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for p in chain:
            result = p(parser)
            parser = parser if result is None else result
        return parser

    return provider
