"""Shared CLI plumbing: the user-facing error type, progress lines and ``--help`` defaults.

Command modules import only this, argparse and the standard library at their top level;
everything heavy is imported inside their ``run`` so ``--help`` and offline commands start
fast (and never import torch).
"""

from __future__ import annotations

import argparse
import sys


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def progress(message: str) -> None:
    """A progress line on stderr (stdout stays for results)."""
    print(f"memscope: {message}", file=sys.stderr, flush=True)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when X says something: not for required
    options, flags, options without a default, or help that already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or not action.option_strings
            or action.required
            or default is None
            or default is False
            or default is argparse.SUPPRESS
        ):
            return action.help
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """The parser of each subcommand: ``--help`` shows the defaults."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
