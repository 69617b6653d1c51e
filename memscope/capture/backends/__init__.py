"""Memory backends, registered by name (see :mod:`.registry`)."""

from __future__ import annotations

from memscope.capture.backends import cuda, storage
from memscope.capture.backends.base import (
    BackendCapabilities,
    BackendOptions,
    Categorizer,
    MemoryBackend,
    MemorySample,
)
from memscope.capture.backends.registry import (
    BackendSpec,
    available_backend_names,
    backend_choices,
    backend_names,
    create_backend,
    register_backend,
    resolve_backend_name,
)

cuda.register()
storage.register()

__all__ = [
    "BackendCapabilities",
    "BackendOptions",
    "BackendSpec",
    "Categorizer",
    "MemoryBackend",
    "MemorySample",
    "available_backend_names",
    "backend_choices",
    "backend_names",
    "create_backend",
    "register_backend",
    "resolve_backend_name",
]
