"""CPU SHIM (test/demo only): a gloo collective has let go of its tensors once it returns.

ProcessGroupGloo runs every collective on a worker thread, which keeps the work -- and the
tensors it was given -- until it has finished the work, *after* the caller's ``wait()`` has
returned (``ProcessGroupGloo::runLoop`` resets ``workInProgress_`` after ``execute``). A
tensor whose last other reference the caller drops right after the collective (the input of
a reduce-scatter in megatron-core's sequence-parallel backward, an all-reduced gradient
consumed by the next backward op) is then freed on that thread whenever it next gets the GIL:
before or after the caller's next allocations, by chance. A memory measurement of a gloo run
therefore moves by one such tensor from run to run and rank to rank. On a GPU the caching
allocator frees where the Python reference drops; this shim gives the CPU run the same order:
each collective megatron-core's tensor-parallel code calls waits, after the work completes,
until the worker has released the tensors (their storages' use counts are back to what they
were before the call; at most :data:`RELEASE_TIMEOUT_S`). Numerics and communication are
untouched; only when a free happens is made deterministic.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

RELEASE_TIMEOUT_S = 1.0
# torch.distributed collectives megatron-core's tensor-parallel code calls
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all_single", "broadcast",
)  # fmt: skip


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += [t for t in v if isinstance(t, torch.Tensor)]
    return out


class _Held:
    """The tensors a collective was given, their storages, and the use counts of both
    before it (the work holds the tensors themselves, and views of them it makes)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.storages = [t.untyped_storage() for t in tensors]
        self.counts = self._counts()

    def _counts(self) -> list[int]:
        own = [t._use_count() for t in self.tensors]  # type: ignore[attr-defined]
        return own + [torch._C._storage_Use_Count(s._cdata) for s in self.storages]

    def await_release(self) -> None:
        deadline = time.monotonic() + RELEASE_TIMEOUT_S
        while time.monotonic() < deadline and any(
            now > before for now, before in zip(self._counts(), self.counts, strict=True)
        ):
            time.sleep(1e-5)  # lets gloo's worker thread finish with the work
        self.tensors, self.storages = [], []


class _ReleasingWork:
    """An async collective's work: ``wait()`` also waits for gloo to let go of the tensors."""

    def __init__(self, work: Any, held: _Held) -> None:
        self._work: Any = work
        self._held = held

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        work, self._work = self._work, None
        if work is None:
            return True
        result = work.wait(*args, **kwargs)
        del work
        self._held.await_release()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def releasing(collective: Callable[..., Any]) -> Callable[..., Any]:
    """``collective`` that returns only once gloo has released its tensors (async: once the
    returned work's ``wait()`` has)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        held = _Held(_tensors([*args, *kwargs.values()]))
        work = collective(*args, **kwargs)
        if work is None:
            held.await_release()
            return None
        return _ReleasingWork(work, held)

    wrapper.__name__ = getattr(collective, "__name__", "collective")
    wrapper.__doc__ = f"CPU shim around torch.distributed.{wrapper.__name__} (gloo release)."
    return wrapper


class ReleasingDistributed(types.ModuleType):
    """``torch.distributed`` as the shimmed megatron modules see it: the collectives wrapped
    by :func:`releasing`, everything else forwarded."""

    def __init__(self) -> None:
        super().__init__("torch.distributed", "memscope CPU shim proxy for torch.distributed")
        for name in COLLECTIVES:
            setattr(self, name, releasing(getattr(torch.distributed, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.distributed, name)
