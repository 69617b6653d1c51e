"""Where MemScope may write a file: the one check every output goes through.

An output only ever creates or replaces a *regular* file. :func:`resolve_output` refuses

- an existing target that is not a regular file: a directory, a FIFO, a socket, a device
  such as ``/dev/full`` or ``/dev/null`` (an atomic write renames over its target, which
  would replace the device node itself), or a symlink to any of these or a dangling one;
- a target that is one of the command's own inputs (the same file after resolving
  symlinks, ``..`` and hard links): ``--out`` equal to ``--report``, an input named
  ``*.html`` whose default page would be itself, ``analyze --out`` equal to the trace;
- a symlink in a directory other users can write (sticky, group- or other-writable:
  ``/tmp``, a team's shared output folder) as the file's own name, or on the way to it when
  it belongs neither to us nor to that directory's owner: anyone could have planted it
  there to make MemScope write a file of their choosing. The kernel's ``fs.protected_symlinks``
  applies the same rule to its own path walks, but not once a path is resolved in user
  space, so it is applied here.

A symlink in a directory only its owner can write, or one of our own, was put there by the
user: it is followed (the file it points to is replaced, the link stays). Everything else
is written as a temporary file in the real directory, then renamed over the name, and a
rename replaces a link planted after the check, never the file it points to.
"""

from __future__ import annotations

import os
import re
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


def others_can_write(directory: str) -> bool:
    """Whether users other than the directory's owner may create names in it: it is sticky
    (``/tmp``), or group- or other-writable. Unknown (unreadable) counts as shared."""
    try:
        mode = os.stat(directory).st_mode
    except OSError:
        return True
    return bool(mode & (stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH))


def foreign_link(path: str) -> str | None:
    """The first symlink on the way to ``path`` that someone else could have planted: it sits
    in a directory others can write and is the final name (the file written, never followed
    there), or a directory on the way owned neither by us nor by that directory's owner
    (``fs.protected_symlinks``' rule); ``None`` if none."""
    target = os.path.abspath(path)
    parts = target.split(os.sep)
    current = os.sep
    for part in parts[1:]:
        if not part:
            continue
        parent, current = os.path.realpath(current), os.path.join(current, part)
        try:
            link = os.lstat(current)
        except OSError:
            return None  # nothing further exists: nothing further to follow
        if not stat.S_ISLNK(link.st_mode) or not others_can_write(parent):
            continue
        try:
            owner = os.stat(parent).st_uid
        except OSError:
            owner = -1
        if current == target or link.st_uid not in (os.geteuid(), owner):
            return current
    return None


def resolve_output(path: str, inputs: Iterable[str] = ()) -> str:
    """The real path to write ``path`` to, or :class:`OutputRefused` (see the module doc)."""
    if not path:
        raise OutputRefused("empty output path")
    planted = foreign_link(path)
    if planted is not None:
        what = "is" if planted == os.path.abspath(path) else f"goes through {planted}, which is"
        raise OutputRefused(
            f"{path}: {what} a symlink in a directory other users can write; refusing to "
            "follow it (remove the link or write elsewhere)"
        )
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


#: What may stand in a file name made from an id (a run id from a launcher or a file).
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def name_part(text: str, limit: int = 80) -> str:
    """``text`` as a piece of a file name: anything but letters, digits, ``_ . -`` becomes
    ``_``, at most ``limit`` characters."""
    return _UNSAFE_IN_NAME.sub("_", text)[:limit]


def free_name(stem: str, suffix: str = "") -> str:
    """``stem + suffix``, or ``stem.N + suffix`` with the first ``N`` (from 2) that nothing
    (not even a dangling link) holds yet."""
    candidate, n = stem + suffix, 1
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{stem}.{n}{suffix}"
    return candidate
