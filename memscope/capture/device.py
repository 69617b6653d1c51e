"""The accelerator as the rest of MemScope may ask about it: the one place outside a backend
that touches ``torch.cuda``.

A backend owns its readings (counters, peaks, snapshots); what a session or an adapter needs
beyond them (is there a GPU, its name, where estimates should assume tensors live, the
allocator's OOM observer) is asked here, so ``session/`` and ``integrations/`` never call the
device themselves (``tests/test_layering.py`` checks that no module outside ``capture/``
mentions ``torch.cuda``).
"""

from __future__ import annotations

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


def attach_oom_observer(observer: OomObserver) -> bool:
    """Have the CUDA caching allocator call ``observer`` when an allocation fails; whether it
    was attached (not without a GPU, nor with a torch that lacks the hook). torch offers no
    way to detach it: the observer must turn itself into a no-op when its owner is done."""
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if not accelerator_available() or not callable(attach):
        return False
    attach(observer)
    return True
