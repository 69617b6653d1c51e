"""Which of torch's allocator APIs this torch has, checked before use.

MemScope supports torch 2.7.1 (the version FlagScale 0.8.0 pins) and newer. Every allocator
API it calls exists in 2.7.1 with the keywords it passes (``tools/check_torch_wheel.py`` reads
them from the 2.7.1 wheel), but several are private
(``torch.cuda.memory._record_memory_history``, ``_snapshot``, ``torch._C`` hooks) and have
changed signature before (``_record_memory_history`` took ``trace_alloc_max_entries`` until
2.1), so each is feature-detected here: a missing attribute or keyword turns that one
feature off with one logged reason, never an exception in training.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable

import torch

# what SnapshotController passes to torch.cuda.memory._record_memory_history
HISTORY_KEYWORDS = ("enabled", "context", "stacks", "max_entries")

_logged: set[str] = set()


def missing_api(owner: object, where: str, name: str, keywords: Iterable[str] = ()) -> str | None:
    """``None`` when ``owner.name`` is callable and accepts ``keywords``; else why not, in one
    line (``where`` is how the owner is spelled, e.g. ``torch.cuda.memory``). A callable whose
    signature Python cannot inspect (a C function) is taken as accepting them."""
    fn = getattr(owner, name, None)
    if not callable(fn):
        return f"{where}.{name} is not in torch {torch.__version__}"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    lacking = [k for k in keywords if k not in params]
    if lacking:
        return f"{where}.{name} of torch {torch.__version__} takes no {', '.join(lacking)}"
    return None


def cuda_history_unsupported() -> str | None:
    """Why CUDA allocator history snapshots can't be recorded with this torch, or ``None``."""
    memory = getattr(torch.cuda, "memory", None)
    return missing_api(
        memory, "torch.cuda.memory", "_record_memory_history", HISTORY_KEYWORDS
    ) or missing_api(memory, "torch.cuda.memory", "_snapshot")


def device_used_unsupported() -> str | None:
    """Why device-level used memory (``cudaMemGetInfo``) can't be read, or ``None``."""
    return missing_api(torch.cuda, "torch.cuda", "mem_get_info")


def log_once(reason: str) -> str:
    """Warn with ``reason`` once per process; returns it (for the report's warnings)."""
    if reason not in _logged:
        _logged.add(reason)
        warnings.warn(f"memscope: {reason}", RuntimeWarning, stacklevel=2)
    return reason
