"""The accelerator as the rest of MemScope may ask about it: the one place outside a backend
that touches ``torch.cuda``.

A backend owns its readings (counters, peaks, snapshots); what a session or an adapter needs
beyond them (is there a GPU, its name, where estimates should assume tensors live, the
allocator's OOM observer) is asked here, so ``session/`` and ``integrations/`` never call the
device themselves (``tests/test_layering.py`` checks that no module outside ``capture/``
mentions ``torch.cuda``).
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable

import torch

#: ``observer(device, bytes asked, bytes allocated on the device, bytes free)``.
OomObserver = Callable[[int, int, int, int], None]


def accelerator_available() -> bool:
    """Whether a CUDA device can be used by this process."""
    return bool(torch.cuda.is_available())


def device_type() -> str:
    """``cuda`` on a GPU, else ``cpu``: where this process's tensors live by default."""
    return "cuda" if accelerator_available() else "cpu"


def device_name() -> str:
    """The current CUDA device's name, or ``cpu`` without one."""
    return torch.cuda.get_device_name() if accelerator_available() else "cpu"


# The observers of this process. torch cannot detach what it was given, so it is given one
# dispatcher, once; the observers are held weakly (a bound method by ``WeakMethod``) so that a
# finished session, and the model and optimizer it references, can be freed.
_observers: list[Callable[[], OomObserver | None]] = []
_dispatcher_attached = False


def _dispatch(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
    for ref in list(_observers):
        observer = ref()
        if observer is None:
            _observers.remove(ref)
            continue
        # one observer's bug must not hide the allocator's own error from the others
        with contextlib.suppress(Exception):
            observer(device, alloc, device_alloc, device_free)


def _weak(observer: OomObserver) -> Callable[[], OomObserver | None]:
    if inspect.ismethod(observer):
        return weakref.WeakMethod(observer)
    return weakref.ref(observer)


def attach_oom_observer(observer: OomObserver) -> bool:
    """Have the CUDA caching allocator call ``observer`` when an allocation fails; whether it
    was attached (not without a GPU, nor with a torch that lacks the hook). ``observer`` is
    held weakly and :func:`detach_oom_observer` removes it; torch itself is given one
    dispatcher per process, which cannot be detached."""
    global _dispatcher_attached
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if not accelerator_available() or not callable(attach):
        return False
    if not _dispatcher_attached:
        attach(_dispatch)
        _dispatcher_attached = True
    _observers.append(_weak(observer))
    return True


def detach_oom_observer(observer: OomObserver) -> None:
    """Stop calling ``observer`` (a no-op when it was never attached)."""
    _observers[:] = [ref for ref in _observers if ref() not in (None, observer)]
