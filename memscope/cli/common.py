"""Shared CLI plumbing: the user-facing error type, progress lines and ``--help`` defaults.

Command modules import only this, argparse and the standard library at their top level;
everything heavy is imported inside their ``run`` so ``--help`` and offline commands start
fast (and never import torch).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable

#: Where the commands that derive files from a config or a log write them by default
#: (``analyze-static``, ``plan``, ``analyze-log``; git-ignored).
DEFAULT_OUTDIR = "outputs"

#: What rendering a report that passed the reader's checks but has a malformed section raises
#: (said as "malformed ... report", one line, exit code 2).
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def naming(path: str, exc: object) -> str:
    """``path: message``, the path said once: a message that already names it is kept."""
    message = str(exc)
    return message if path in message else f"{path}: {message}"


def progress(message: str) -> None:
    """A progress line on stderr (stdout stays for results); control characters escaped."""
    from memscope.units import printable

    print(f"memscope: {printable(message)}", file=sys.stderr, flush=True)


def wrote(paths: Iterable[str], outdir: str, default_outdir: str) -> None:
    """The progress line naming the files a command wrote, by absolute path; when ``outdir``
    is the default (``--outdir`` most likely not given) the line says so."""
    import os

    line = "wrote " + " and ".join(os.path.abspath(p) for p in paths)
    if outdir == default_outdir:
        line += f" (the default --outdir {default_outdir}/ in the working directory)"
    progress(line)


def check_output(path: str, inputs: Iterable[str] = ()) -> str:
    """Fail early (before any work) when ``path`` can't be an output: not a regular file, or
    one of the command's ``inputs`` (see :mod:`memscope.io.safe_output`)."""
    from memscope.io.safe_output import OutputRefused, resolve_output

    try:
        return resolve_output(path, inputs)
    except OutputRefused as exc:
        raise CliError(str(exc)) from None


def write_output(path: str, text: str, inputs: Iterable[str] = ()) -> None:
    """Write a command's text output file atomically (see :func:`_guarded_write`)."""
    from memscope.io.atomic import atomic_write_text

    _guarded_write(path, lambda: atomic_write_text(path, text, inputs))


def write_pickle_output(path: str, data: object, inputs: Iterable[str] = ()) -> None:
    """A plain-data pickle, protocol 4 (what pytorch.org/memory_viz reads), written
    atomically (see :func:`_guarded_write`)."""
    import pickle

    from memscope.io.atomic import atomic_write_bytes

    payload = pickle.dumps(data, protocol=4)
    _guarded_write(path, lambda: atomic_write_bytes(path, payload, inputs))


def _guarded_write(path: str, write: Callable[[], None]) -> None:
    """Run ``write``; every refusal or OS error becomes a :class:`CliError` naming the file
    (the only way commands write files)."""
    from memscope.io.safe_output import OutputRefused

    try:
        write()
    except OutputRefused as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        # strerror only: str(exc) would name the temporary file the write went through
        raise CliError(f"{path}: cannot write ({exc.strerror or type(exc).__name__})") from None


def write_json_output(path: str, data: object, inputs: Iterable[str] = ()) -> None:
    """:func:`write_output` of compact JSON (no NaN: a report never holds one)."""
    import json

    write_output(path, json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n", inputs)


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    """``--report`` and the options that choose among mixed rank reports of a job."""
    p.add_argument(
        "--report",
        required=True,
        help="runtime_report.json or its rank folder, job_summary.json, or a job directory",
    )
    p.add_argument(
        "--run-id",
        default=None,
        help="job: keep the rank reports of this run only (the others are left out)",
    )
    p.add_argument(
        "--allow-mixed-runs",
        action="store_true",
        help="job: merge rank reports of different runs, world sizes or duplicate grid "
        "positions, flagged on the page, instead of refusing them",
    )


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
