"""Memory backends and the ``auto`` choice between them."""

from __future__ import annotations

import torch

from memscope.capture.backends.base import MemoryBackend, MemorySample
from memscope.capture.backends.cuda import CudaAllocatorBackend
from memscope.capture.backends.storage import StorageLedgerBackend

BACKEND_CHOICES = ("auto", "cuda", "storage")

__all__ = [
    "BACKEND_CHOICES",
    "CudaAllocatorBackend",
    "MemoryBackend",
    "MemorySample",
    "StorageLedgerBackend",
    "create_backend",
    "resolve_backend_name",
]


def resolve_backend_name(name: str) -> str:
    """``auto`` becomes ``cuda`` when a GPU is present, else ``storage``."""
    if name not in BACKEND_CHOICES:
        raise ValueError(f"--memscope-backend must be one of {BACKEND_CHOICES}, not {name!r}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "storage"
    return name


def create_backend(name: str) -> MemoryBackend:
    """Build the backend named ``name`` (after :func:`resolve_backend_name`)."""
    resolved = resolve_backend_name(name)
    if resolved == "cuda":
        return CudaAllocatorBackend()
    return StorageLedgerBackend("cuda" if torch.cuda.is_available() else "cpu")
