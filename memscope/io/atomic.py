"""Atomic file writes: readers never see a half-written report."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; reports are for the whole team
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, data: Any) -> None:
    """Serialise ``data`` as compact JSON and write it atomically."""
    atomic_write_text(path, json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n")
