"""Atomic file writes: readers never see a half-written report.

Every write goes through :func:`memscope.io.safe_output.resolve_output` first: only a regular
file is ever created or replaced, never a device, FIFO or directory, and never one of the
writer's own ``inputs``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from typing import Any

from memscope.io.safe_output import resolve_output


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_text(path: str, text: str, inputs: Iterable[str] = ()) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and rename.

    Raises :class:`memscope.io.safe_output.OutputRefused` (before anything is written) for a
    target that is not a regular file or is one of ``inputs``. A character UTF-8 can't encode
    (a lone surrogate) is written as a backslash escape rather than failing the write.
    """
    atomic_write_bytes(path, text.encode("utf-8", errors="backslashreplace"), inputs)


def atomic_write_bytes(path: str, data: bytes, inputs: Iterable[str] = ()) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write_text`)."""
    path = resolve_output(path, inputs)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; reports are for the whole team
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, data: Any, inputs: Iterable[str] = ()) -> None:
    """Serialise ``data`` as compact JSON and write it atomically (see
    :func:`atomic_write_text`)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n"
    atomic_write_text(path, text, inputs)
