"""Removing one dispatch mode from torch's mode stack without disturbing the others.

A ``TorchDispatchMode.__exit__`` pops whatever is on top of the stack. If a user entered
another mode (a ``FlopCounterMode``, a second tracer's) after ours and it is still active when
tracing ends, exiting ours would pop theirs. :func:`remove_dispatch_mode` instead lifts the
modes above ours off, drops ours, puts them back in order, and hands our saved "was a mode
active" flags to the mode just above, so that when it exits the process-wide flags are what
they would have been had ours never been there.
"""

from __future__ import annotations

from torch.utils import _python_dispatch as pd

_SAVED_FLAGS = (
    "old_dispatch_mode_flags",
    "old_non_infra_dispatch_mode_flags",
    "old_without_ignore_compile_internals_dispatch_mode_flags",
)


def remove_dispatch_mode(mode: pd.TorchDispatchMode) -> bool:
    """Take ``mode`` off the dispatch-mode stack; returns whether it was found there."""
    if pd._get_current_dispatch_mode() is mode:
        mode.__exit__(None, None, None)
        return True
    above: list[pd.TorchDispatchMode] = []
    found = False
    try:
        while pd._len_torch_dispatch_stack() > 0:
            top = pd._pop_mode()
            if top is mode:
                found = True
                break
            above.append(top)
    finally:
        for other in reversed(above):
            pd._push_mode(other)
    if found and above:
        just_above = above[-1]
        for name in _SAVED_FLAGS:
            ours, theirs = getattr(mode, name, None), getattr(just_above, name, None)
            if ours and theirs:
                theirs[-1] = ours.pop()
    return found
