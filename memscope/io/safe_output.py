"""Where MemScope may write a file: the one check every output goes through.

An output only ever creates or replaces a *regular* file. :func:`resolve_output` refuses

- an existing target that is not a regular file: a directory, a FIFO, a socket, a device
  such as ``/dev/full`` or ``/dev/null`` (an atomic write renames over its target, which
  would replace the device node itself), or a symlink to any of these or a dangling one;
- a target that is one of the command's own inputs (the same file after resolving
  symlinks, ``..`` and hard links): ``--out`` equal to ``--report``, an input named
  ``*.html`` whose default page would be itself, ``analyze --out`` equal to the trace.

A symlink to a regular file is followed: the file it points to is replaced, the link stays.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable


class OutputRefused(ValueError):
    """An output target MemScope won't write; the message is one line meant for the user."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def resolve_output(path: str, inputs: Iterable[str] = ()) -> str:
    """The real path to write ``path`` to, or :class:`OutputRefused` (see the module doc)."""
    if not path:
        raise OutputRefused("empty output path")
    real = os.path.realpath(path)
    try:
        st: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        st = None
        if os.path.islink(path) or os.path.islink(real):
            raise OutputRefused(f"{path}: is a dangling symlink; refusing to write") from None
    except OSError as exc:
        raise OutputRefused(f"{path}: cannot check the target ({exc.strerror})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputRefused(
            f"{path}: is {_kind(st.st_mode)}, not a regular file; refusing to write it"
        )
    for source in inputs:
        same = os.path.realpath(source) == real
        if not same and st is not None:
            try:
                same = _same_file(os.stat(source), st)
            except OSError:
                same = False
        if same:
            raise OutputRefused(f"{path}: is the input {source}; refusing to overwrite it")
    return real
