"""FlagScale 0.8.0 source trees for the integration tests: pristine (cached) and patched copies.

The wheel is fetched once with ``pip download --no-deps flag-scale==0.8.0`` into the cache
(``$MEMSCOPE_CACHE`` or ``~/.cache/memscope``) by ``tools/flagscale_wheel.py`` and reused.
Tests never modify the cached tree: :func:`tree_copy` gives each caller a private copy.
"""

from __future__ import annotations

import atexit
import functools
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "memscope_patch.py")
PATCHES = os.path.join(ROOT, "patches")
MEGATRON = os.path.join("third_party", "Megatron-LM")
# sha256 of flag_scale-0.8.0-py3-none-manylinux2014_x86_64.whl as published on PyPI.
WHEEL_SHA256 = "c3fbbcc585266a320c72805aee037d2f60085234e1a1432b75321e32284007c6"

sys.path.insert(0, os.path.join(ROOT, "tools"))
from flagscale_args import compose, training_args  # noqa: E402
from flagscale_wheel import VERSION, cache_dir, flagscale_tree  # noqa: E402

__all__ = ["compose", "patched_tree", "pristine_tree", "training_args", "tree_copy"]


@functools.lru_cache(maxsize=1)
def pristine_tree() -> str:
    """The cached, unmodified FlagScale tree (skips the test when it cannot be fetched)."""
    try:
        return flagscale_tree()
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"FlagScale {VERSION} unavailable (no network?): {exc}")


def cached_wheel() -> str | None:
    """The cached wheel file, when the tree came from the cache's own download."""
    found = glob.glob(os.path.join(cache_dir(), f"flag_scale-{VERSION}", "flag_scale-*.whl"))
    return found[0] if found else None


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_copy(parent: str) -> str:
    """A private copy of the pristine tree under ``parent``; returns its FlagScale root."""
    dst = os.path.join(parent, "flag_scale")
    shutil.copytree(pristine_tree(), dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    """``python tools/memscope_patch.py ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, TOOL, *args], capture_output=True, text=True, timeout=120
    )


@functools.lru_cache(maxsize=1)
def patched_tree() -> str:
    """A copy of the tree with both patches applied by the tool (shared, read-only)."""
    parent = tempfile.mkdtemp(prefix="memscope-patched-")
    atexit.register(shutil.rmtree, parent, True)
    tree = tree_copy(parent)
    for target_tree in (tree, os.path.join(tree, MEGATRON)):
        proc = run_tool("apply", "--tree", target_tree)
        assert proc.returncode == 0, proc.stderr
    return tree
