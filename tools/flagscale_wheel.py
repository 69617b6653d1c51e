"""Fetch and cache the FlagScale 0.8.0 wheel, unzipped (used by benchmarks and tests).

``flagscale_tree()`` returns the wheel's unzipped ``flag_scale/`` directory (holding
``flagscale/`` and ``third_party/Megatron-LM``). It looks, in order, at
``$MEMSCOPE_FLAGSCALE_TREE``, then the cache (``$MEMSCOPE_CACHE`` or
``~/.cache/memscope``), and otherwise runs
``pip download --no-deps flag-scale==0.8.0`` into the cache and unzips it there.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

VERSION = "0.8.0"


def cache_dir() -> str:
    """Where downloads are kept between runs."""
    return os.environ.get("MEMSCOPE_CACHE") or os.path.expanduser("~/.cache/memscope")


def flagscale_tree(download: bool = True) -> str:
    """Path of the unzipped FlagScale wheel; raises ``RuntimeError`` when unavailable."""
    env = os.environ.get("MEMSCOPE_FLAGSCALE_TREE")
    if env:
        if not os.path.isdir(os.path.join(env, "flagscale")):
            raise RuntimeError(f"MEMSCOPE_FLAGSCALE_TREE={env} has no flagscale/ directory")
        return env
    root = os.path.join(cache_dir(), f"flag_scale-{VERSION}")
    tree = os.path.join(root, "tree")
    top = os.path.join(tree, "flag_scale")  # the wheel's one top-level package directory
    if os.path.isdir(os.path.join(top, "flagscale")):
        return top
    wheels = glob.glob(os.path.join(root, f"flag_scale-{VERSION}-*.whl"))
    if not wheels:
        if not download:
            raise RuntimeError(f"FlagScale {VERSION} is not cached under {root}")
        os.makedirs(root, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", root]
        res = subprocess.run([*cmd, f"flag-scale=={VERSION}"], capture_output=True, text=True)
        wheels = glob.glob(os.path.join(root, f"flag_scale-{VERSION}-*.whl"))
        if res.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download flag-scale=={VERSION} failed: {res.stderr[-300:]}")
    partial = tree + ".partial"
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extractall(partial)
    os.replace(partial, tree)  # atomic: a half-unzipped tree is never taken for a good one
    return top
