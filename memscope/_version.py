"""MemScope's own version, and the installed version of a package it reads (importable from
every room: no torch, nothing of memscope)."""

from __future__ import annotations

import importlib.metadata

__version__ = "0.1.0"


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, if any."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
