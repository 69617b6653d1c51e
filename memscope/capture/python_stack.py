"""The Python frames that asked for an allocation, without torch's and MemScope's own.

Used by the ``storage`` backend when the allocation history is recorded with stacks
(``--memscope-snapshot-stacks python|all``): each new storage remembers where in the
training code it was created, so a leak suspect can name the line that keeps it.

Walking ``sys._getframe`` costs a few microseconds per allocation; nothing here runs unless
stacks were asked for.
"""

from __future__ import annotations

import os
import sys

import torch

Frame = tuple[str, int, str]  # filename, line, function
#: Frames kept per allocation, innermost first.
MAX_FRAMES = 8

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_MEMSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# MemScope's own machinery (the dispatch mode, hooks, the session); its demo and tools are
# training code like any other and stay in the stack.
_OWN_DIRS = tuple(
    os.path.join(_MEMSCOPE_DIR, part) + os.sep
    for part in ("capture", "session", "integrations", "events")
)


def _is_internal(filename: str) -> bool:
    return (
        filename.startswith(_TORCH_DIR)
        or filename.startswith(_OWN_DIRS)
        or filename.startswith("<frozen ")
    )


def caller_frames(limit: int = MAX_FRAMES) -> tuple[Frame, ...]:
    """Up to ``limit`` frames of the current Python stack outside torch and MemScope's
    capture code, innermost first."""
    out: list[Frame] = []
    frame = sys._getframe(1)
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not _is_internal(code.co_filename):
            out.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(out)


def format_frame(frame: Frame) -> str:
    """``file:line in function``, as a report shows one frame."""
    filename, line, name = frame
    return f"{filename}:{line} in {name}"
