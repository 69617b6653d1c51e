"""Shared CLI plumbing: the user-facing error type and progress lines."""

from __future__ import annotations

import sys


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def progress(message: str) -> None:
    """A progress line on stderr (stdout stays for results)."""
    print(f"memscope: {message}", file=sys.stderr, flush=True)
