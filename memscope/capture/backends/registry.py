"""The backend registry: names, availability, and what ``auto`` picks.

A backend module registers a :class:`BackendSpec`; its ``register()`` is the one place its
name is written, and nothing else in MemScope names a backend class. The registered names
are offered to the configuration (:func:`memscope.config.offer_choices`), so a setting
naming no registered backend is put back to ``auto`` with a note naming the registered
ones. ``auto`` picks the available backend with the highest ``auto_priority``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memscope.capture.backends.base import BackendOptions, MemoryBackend
from memscope.config import offer_choices

AUTO = "auto"


@dataclass(frozen=True)
class BackendSpec:
    """How to build one backend and whether it can run here."""

    name: str
    factory: Callable[[BackendOptions], MemoryBackend]
    is_available: Callable[[], bool]
    auto_priority: int
    unavailable_reason: str = ""


_REGISTRY: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec) -> None:
    """Add ``spec`` (a spec registered again under its name replaces the earlier one)."""
    assert spec.name and spec.name != AUTO, spec.name
    _REGISTRY[spec.name] = spec


def backend_names() -> tuple[str, ...]:
    """Registered backend names, in registration order."""
    return tuple(_REGISTRY)


def backend_choices() -> tuple[str, ...]:
    """What ``--memscope-backend`` accepts: ``auto`` and every registered name."""
    return (AUTO, *_REGISTRY)


offer_choices("backend", backend_choices)


def available_backend_names() -> tuple[str, ...]:
    """Registered backends that can run on this machine."""
    return tuple(name for name, spec in _REGISTRY.items() if spec.is_available())


def resolve_backend_name(name: str) -> str:
    """``auto`` becomes the best available backend; other names are checked."""
    if name != AUTO and name not in _REGISTRY:
        raise ValueError(f"--memscope-backend must be one of {backend_choices()}, not {name!r}")
    if name == AUTO:
        available = [s for s in _REGISTRY.values() if s.is_available()]
        assert available, "no memory backend is available"
        return max(available, key=lambda s: s.auto_priority).name
    return name


def create_backend(name: str, options: BackendOptions | None = None) -> MemoryBackend:
    """Build the backend named ``name`` (``auto`` resolved first) with ``options``."""
    spec = _REGISTRY[resolve_backend_name(name)]
    if not spec.is_available():
        raise ValueError(spec.unavailable_reason or f"the {spec.name} backend cannot run here")
    return spec.factory(options or BackendOptions())
