"""The bounded-input rules every MemScope reader shares (reports, traces, job folders).

- :func:`open_regular` opens only a regular file, without blocking (a FIFO, ``/dev/zero`` or
  any other device is refused before a byte is read) and refuses one larger than a cap;
- :func:`strict_json_loads` parses JSON that is bounded: no ``NaN``/``Infinity`` tokens, no
  number beyond +-2**63 (``1e400`` would be infinite, a 5000-digit integer would stall),
  nesting at most :data:`MAX_JSON_DEPTH` deep (a ``[[[[...`` bomb is refused, never a
  ``RecursionError``).

Every refusal is an :class:`InputRefused` with a one-line message meant for the user.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import IO, Any

#: Deepest JSON nesting a reader accepts (a report is about 6 deep).
MAX_JSON_DEPTH = 64
#: Numbers beyond this magnitude are refused (nothing MemScope writes comes near it).
MAX_JSON_NUMBER = 2**63
_MAX_INT_DIGITS = 20  # 2**63 has 19 digits; longer is refused before int() sees it


class InputRefused(ValueError):
    """An input a reader refuses to use; the message is one line (without the path)."""


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str, max_bytes: int | None = None) -> IO[bytes]:
    """``path`` opened for binary reading, only if it is a regular file of at most
    ``max_bytes``. Never blocks: the check is made on the opened descriptor (opened
    non-blocking, so a FIFO without a writer can't hang us), not on a path that could change."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputRefused("no such file") from None
    except IsADirectoryError:
        raise InputRefused("is a directory, expected a file") from None
    except OSError as exc:
        raise InputRefused(f"cannot open ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputRefused(f"is {_file_kind(st.st_mode)}, expected a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise InputRefused(f"is {st.st_size} bytes, more than the {max_bytes} allowed")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, max_bytes: int) -> bytes:
    """The whole content of a regular file of at most ``max_bytes`` (checked again while
    reading: a file that grows past the cap is refused too)."""
    with open_regular(path, max_bytes) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise InputRefused(f"cannot read ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise InputRefused(f"is more than the {max_bytes} bytes allowed")
    return data


def _refuse_constant(token: str) -> Any:
    raise InputRefused(f"{token} is not a number MemScope accepts (non-finite)")


def _bounded_int(token: str) -> int:
    digits = len(token) - token.startswith("-")
    value = int(token) if digits <= _MAX_INT_DIGITS else MAX_JSON_NUMBER
    if abs(value) >= MAX_JSON_NUMBER:
        shown = token if len(token) <= 24 else f"{token[:12]}... ({len(token)} digits)"
        raise InputRefused(f"integer {shown} is beyond +-2**63")
    return value


def _bounded_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value) or abs(value) >= MAX_JSON_NUMBER:
        raise InputRefused(f"number {token[:24]} is beyond +-2**63 or not finite")
    return value


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep ``value`` nests (a scalar is 0, ``[]`` is 1), counting no further than
    ``limit + 1``; iterative, so any depth is safe to measure."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


def strict_json_loads(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` within the bounds above. Raises :class:`json.JSONDecodeError` for
    malformed JSON (its position tells truncated from invalid) and :class:`InputRefused`
    for JSON that is well formed but out of bounds."""
    try:
        value = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
        )
    except RecursionError:
        raise InputRefused(f"JSON nested more than {max_depth} deep") from None
    # every level of nesting opens a bracket: a text with few enough (strings included) is
    # within the limit without walking what it holds
    brackets = (
        text.count(b"[") + text.count(b"{")
        if isinstance(text, bytes)
        else text.count("[") + text.count("{")
    )
    if brackets > max_depth and json_depth(value, max_depth) > max_depth:
        raise InputRefused(f"JSON nested more than {max_depth} deep")
    return value
