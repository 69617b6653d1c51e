#!/usr/bin/env python3
"""Apply, check or revert MemScope's patches on a FlagScale or Megatron-LM source tree.

    python tools/memscope_patch.py apply  --tree PATH [--target flagscale|megatron-lm|auto]
    python tools/memscope_patch.py check  --tree PATH
    python tools/memscope_patch.py revert --tree PATH

``PATH`` is the repository root the patch is applied from with ``patch -p1``: the directory
holding ``flagscale/`` for FlagScale, the one holding ``megatron/`` and ``pretrain_gpt.py``
for Megatron-LM. Every change is tried with ``patch --dry-run`` first; a tree the patch does
not match exactly (another version, local edits, half applied) is refused with one line.

Exit status: ``apply``/``revert`` 0 when the tree ends in the wanted state (also when it
already was), 2 when refused. ``check`` 0 applied, 1 not applied (the patch applies cleanly),
2 does not match.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

PATCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "patches")

APPLIED, NOT_APPLIED, MISMATCH = "applied", "not applied", "does not match"


@dataclass(frozen=True)
class Target:
    """One supported framework: its patch file and the files that identify its tree."""

    name: str
    patch: str
    markers: tuple[str, ...]
    description: str


TARGETS = {
    "flagscale": Target(
        "flagscale",
        "flagscale-0.8.0.patch",
        ("flagscale/train/train.py", "flagscale/train/train_gpt.py"),
        "FlagScale 0.8.0",
    ),
    "megatron-lm": Target(
        "megatron-lm",
        "megatron-lm-0.15.0rc5.patch",
        ("megatron/training/training.py", "pretrain_gpt.py"),
        "Megatron-LM 0.15.0rc5",
    ),
}


class Refused(Exception):
    """The tree or the request cannot be handled; the message is the one line shown."""


def detect_target(tree: str, wanted: str) -> Target:
    """The target for ``tree``: ``wanted`` checked against the tree, or found (``auto``)."""
    if not os.path.isdir(tree):
        raise Refused(f"{tree}: not a directory")
    present = [t for t in TARGETS.values() if _has_markers(tree, t)]
    if wanted != "auto":
        target = TARGETS[wanted]
        if target not in present:
            raise Refused(f"{tree} is not a {target.description} tree: {_why_not(tree, target)}")
        return target
    if len(present) == 1:
        return present[0]
    if not present:
        hint = _nested_hint(tree)
        raise Refused(
            f"{tree} is neither a FlagScale tree (no flagscale/train/train.py) nor a "
            f"Megatron-LM tree (no megatron/training/training.py){hint}"
        )
    raise Refused(f"{tree} looks like both FlagScale and Megatron-LM: pass --target")


def _has_markers(tree: str, target: Target) -> bool:
    return all(os.path.isfile(os.path.join(tree, m)) for m in target.markers)


def _why_not(tree: str, target: Target) -> str:
    missing = [m for m in target.markers if not os.path.isfile(os.path.join(tree, m))]
    return "missing " + ", ".join(missing) + _nested_hint(tree)


def _nested_hint(tree: str) -> str:
    """Point at the right directory when the user gave a parent of it."""
    for sub in ("flag_scale", "FlagScale", "third_party/Megatron-LM", "Megatron-LM"):
        candidate = os.path.join(tree, sub)
        if any(_has_markers(candidate, t) for t in TARGETS.values()):
            return f"; did you mean --tree {candidate}?"
    return ""


def split_patch(text: str) -> dict[str, str]:
    """The patch's per-file sections keyed by path (the free-text header is dropped)."""
    sections: dict[str, list[str]] = {}
    lines: list[str] | None = None
    for line in text.splitlines(keepends=True):
        if line.startswith("--- "):
            path = line[4:].split("\t")[0].strip().removeprefix("a/")
            lines = sections.setdefault(path, [])
        if lines is not None:
            lines.append(line)
    if not sections:
        raise Refused("the patch file holds no file section")
    return {path: "".join(body) for path, body in sections.items()}


def run_patch(tree: str, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``patch -p1`` in ``tree`` reading ``text``: exact context, never interactive."""
    exe = shutil.which("patch")
    if exe is None:
        raise Refused("the 'patch' program is not installed (apt-get install patch)")
    cmd = [exe, "-p1", "--forward", "--fuzz=0", "--batch", "--reject-file=-", *args]
    return subprocess.run(
        [*cmd, "--no-backup-if-mismatch"], cwd=tree, input=text, capture_output=True, text=True
    )


def file_state(tree: str, section: str) -> str:
    """Whether one file's section is applied, not applied, or matches neither way."""
    if run_patch(tree, section, "--dry-run").returncode == 0:
        return NOT_APPLIED
    if run_patch(tree, section, "--dry-run", "--reverse").returncode == 0:
        return APPLIED
    return MISMATCH


def tree_state(tree: str, target: Target) -> tuple[str, dict[str, str]]:
    """Overall state of ``tree`` for ``target`` and the state of each patched file."""
    with open(os.path.join(PATCH_DIR, target.patch), encoding="utf-8") as f:
        sections = split_patch(f.read())
    states = {path: file_state(tree, body) for path, body in sections.items()}
    kinds = set(states.values())
    return (kinds.pop() if len(kinds) == 1 else MISMATCH), states


def _describe(states: dict[str, str]) -> str:
    return ", ".join(f"{path}: {state}" for path, state in states.items())


def _patch_text(target: Target) -> str:
    with open(os.path.join(PATCH_DIR, target.patch), encoding="utf-8") as f:
        return f.read()


def _change(tree: str, target: Target, *reverse: str) -> None:
    """Dry run, then the real run, of the whole patch (``reverse``: ``--reverse``)."""
    text = _patch_text(target)
    for mode in (("--dry-run",), ()):
        proc = run_patch(tree, text, *mode, *reverse)
        if proc.returncode != 0:
            detail = (proc.stdout + proc.stderr).strip().splitlines()
            raise Refused(f"patch failed in {tree}: {detail[-1] if detail else proc.returncode}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("apply", "check", "revert"))
    parser.add_argument("--tree", required=True, help="FlagScale or Megatron-LM repository root")
    parser.add_argument("--target", choices=("auto", *TARGETS), default="auto")
    opts = parser.parse_args(argv)
    tree = os.path.abspath(opts.tree)
    try:
        target = detect_target(tree, opts.target)
        state, states = tree_state(tree, target)
        label = f"{target.description} tree {tree}"
        if state == MISMATCH:
            raise Refused(
                f"{target.patch} does not match the {label} (another version or local "
                f"edits?): {_describe(states)}"
            )
        if opts.action == "check":
            print(f"memscope patch {state}: {label} ({target.patch})")
            return 0 if state == APPLIED else 1
        if opts.action == "apply":
            if state == APPLIED:
                print(f"memscope patch already applied: {label}")
                return 0
            _change(tree, target)
            print(f"memscope patch applied: {label} ({', '.join(states)})")
            return 0
        if state == NOT_APPLIED:
            print(f"memscope patch not applied, nothing to revert: {label}")
            return 0
        _change(tree, target, "--reverse")
        print(f"memscope patch reverted: {label} ({', '.join(states)})")
        return 0
    except Refused as exc:
        print(f"memscope_patch: refused: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
