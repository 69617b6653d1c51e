"""``memscope`` command line: each subcommand lives in its own module under ``memscope.cli``.

Only this layer touches file paths: it reads reports, calls analysis and reporters on plain
data, and writes results. Bad input ends with one line on stderr and exit code 2.

Registering a command imports nothing heavy: each command module imports only argparse, the
standard library and :mod:`memscope.cli.common` at its top level, and the rest (reporters,
jinja2, the static estimator, yaml, the demo harness) inside its ``run``. ``memscope --help``
and the offline commands never import torch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from memscope._version import __version__
from memscope.cli import (
    analyze_cmd,
    analyze_log_cmd,
    analyze_static_cmd,
    demo_cmd,
    diff_cmd,
    export_cmd,
    plan_cmd,
    snapshot_cmd,
    summarize_cmd,
    visualize_cmd,
)
from memscope.cli.common import CliError, CommandParser
from memscope.units import printable

COMMANDS = (
    visualize_cmd,
    demo_cmd,
    summarize_cmd,
    analyze_cmd,
    analyze_static_cmd,
    analyze_log_cmd,
    plan_cmd,
    snapshot_cmd,
    export_cmd,
    diff_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``memscope`` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="memscope",
        description="Memory tracing and analysis for Megatron-LM / FlagScale training.",
    )
    parser.add_argument("--version", action="version", version=f"memscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.run(args) or 0)
    except CliError as exc:  # one line: whatever a path or a report holds is escaped
        print(f"memscope {args.command}: error: {printable(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memscope {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `memscope summarize ... | head`: the reader left; not an error
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
