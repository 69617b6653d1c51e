#!/usr/bin/env python3
"""Apply, check or revert MemScope's patches on a FlagScale or Megatron-LM source tree.

    python tools/memscope_patch.py apply  --tree PATH [--target flagscale|megatron-lm|auto]
    python tools/memscope_patch.py check  --tree PATH
    python tools/memscope_patch.py revert --tree PATH

``PATH`` is the repository root the patch is applied from with ``patch -p1``: the directory
holding ``flagscale/`` for FlagScale, the one holding ``megatron/`` and ``pretrain_gpt.py``
for Megatron-LM. The patch is chosen by the tree's release: FlagScale 0.8.0; Megatron-LM
0.15 (0.15.0rc5, bundled with FlagScale 0.8.0) or 0.19 (core_r0.19.0), read from
``megatron/core/package_info.py``. Every change is tried with ``patch --dry-run`` first; a
tree the patch does not match exactly (another version, local edits, half applied) is
refused with one line.

``apply`` and ``revert`` are atomic. Before changing anything they check that every file the
patch touches is a regular file that can be written, in a directory that can be written
(patch writes its temporary files next to the file), and that the dry run applies cleanly;
otherwise one line names the file and nothing is changed. The original bytes, mode and times
of every target are kept in memory while patch runs; on any failure (patch exits non-zero
part-way or leaves the tree in neither state, a write fails, an exception, Ctrl-C) every
target is restored byte for byte, files patch left behind (``*.orig``, ``*.rej``, its
temporary files) are removed, and one line says so. The tree is never left half patched.

Exit status: ``apply``/``revert`` 0 when the tree ends in the wanted state (also when it
already was), 2 when refused or rolled back. ``check`` 0 applied, 1 not applied (the patch
applies cleanly), 2 does not match.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PATCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "patches")

APPLIED, NOT_APPLIED, MISMATCH = "applied", "not applied", "does not match"


@dataclass(frozen=True)
class Target:
    """One supported framework release: its patch file and the files that identify its tree."""

    name: str
    patch: str
    markers: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class Framework:
    """A framework the tool recognises, with one patch per supported release.

    ``releases`` maps ``major.minor`` to (patch file, the release it was written against);
    the tree's release is read from ``version_file`` (megatron-core's ``package_info.py``
    for Megatron-LM), or is the only one listed when there is none.
    """

    name: str
    label: str
    markers: tuple[str, ...]
    releases: dict[str, tuple[str, str]]
    version_file: str | None = None


TARGETS = {
    "flagscale": Framework(
        "flagscale",
        "FlagScale",
        ("flagscale/train/train.py", "flagscale/train/train_gpt.py"),
        {"0.8": ("flagscale-0.8.0.patch", "0.8.0")},
    ),
    "megatron-lm": Framework(
        "megatron-lm",
        "Megatron-LM",
        ("megatron/training/training.py", "pretrain_gpt.py"),
        {
            "0.15": ("megatron-lm-0.15.0rc5.patch", "0.15.0rc5"),
            "0.19": ("megatron-lm-0.19.patch", "0.19"),
        },
        "megatron/core/package_info.py",
    ),
}
# megatron/core/package_info.py: MAJOR = 0 / MINOR = 19 / PATCH = 1 / PRE_RELEASE = "rc5"
_VERSION_PART = re.compile(
    r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([0-9A-Za-z]*)['\"]?", re.M
)


class Refused(Exception):
    """The tree or the request cannot be handled; the message is the one line shown."""

    kind = "refused"


class RolledBack(Refused):
    """Patching failed part-way and every touched file was restored (or the line says not)."""

    kind = "error"


def detect_target(tree: str, wanted: str) -> Target:
    """The target for ``tree``: ``wanted`` checked against the tree, or found (``auto``),
    with the patch of the tree's release."""
    if not os.path.isdir(tree):
        raise Refused(f"{tree}: not a directory")
    present = [t for t in TARGETS.values() if _has_markers(tree, t)]
    if wanted != "auto":
        framework = TARGETS[wanted]
        if framework not in present:
            raise Refused(f"{tree} is not a {framework.label} tree: {_why_not(tree, framework)}")
        return _release_target(tree, framework)
    if len(present) == 1:
        return _release_target(tree, present[0])
    if not present:
        hint = _nested_hint(tree)
        raise Refused(
            f"{tree} is neither a FlagScale tree (no flagscale/train/train.py) nor a "
            f"Megatron-LM tree (no megatron/training/training.py){hint}"
        )
    raise Refused(f"{tree} looks like both FlagScale and Megatron-LM: pass --target")


def tree_version(tree: str, framework: Framework) -> str | None:
    """The release written in the tree's version file (``0.19.1``, ``0.15.0rc5``), or None
    when the framework has none; refused when the file is missing or unreadable."""
    if framework.version_file is None:
        return None
    path = os.path.join(tree, framework.version_file)
    try:
        with open(path, encoding="utf-8") as f:
            parts = dict(_VERSION_PART.findall(f.read()))
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"{path}: cannot read the {framework.label} version ({_why(exc)})") from None
    if "MAJOR" not in parts or "MINOR" not in parts:
        raise Refused(f"{path}: no MAJOR/MINOR version in it")
    version = f"{parts['MAJOR']}.{parts['MINOR']}"
    if parts.get("PATCH"):
        version += f".{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"
    return version


def _release_target(tree: str, framework: Framework) -> Target:
    """The patch for the tree's release (:func:`tree_version`)."""
    version = tree_version(tree, framework)
    if version is None:
        ((patch, written_for),) = framework.releases.values()
        return Target(framework.name, patch, framework.markers, f"{framework.label} {written_for}")
    release = ".".join(version.split(".")[:2])
    if release not in framework.releases:
        known = ", ".join(written for _, written in framework.releases.values())
        raise Refused(
            f"{tree} is {framework.label} {version}; MemScope has patches for {known} only "
            "(wire the hooks by hand: docs/tracing.md)"
        )
    patch = framework.releases[release][0]
    return Target(framework.name, patch, framework.markers, f"{framework.label} {version}")


def _has_markers(tree: str, target: Framework) -> bool:
    return all(os.path.isfile(os.path.join(tree, m)) for m in target.markers)


def _why_not(tree: str, target: Framework) -> str:
    missing = [m for m in target.markers if not os.path.isfile(os.path.join(tree, m))]
    return "missing " + ", ".join(missing) + _nested_hint(tree)


def _nested_hint(tree: str) -> str:
    """Point at the right directory when the user gave a parent of it."""
    for sub in ("flag_scale", "FlagScale", "third_party/Megatron-LM", "Megatron-LM"):
        candidate = os.path.join(tree, sub)
        if any(_has_markers(candidate, t) for t in TARGETS.values()):
            return f"; did you mean --tree {candidate}?"
    return ""


def _header_path(line: str) -> str:
    """The path of a ``---``/``+++`` header line as ``patch -p1`` sees it."""
    path = line[4:].split("\t")[0].strip()
    if path == "/dev/null":
        return path
    return path.split("/", 1)[1] if "/" in path else path


def split_patch(text: str) -> dict[str, str]:
    """The patch's per-file sections keyed by path (the free-text header is dropped).

    A section creating a file (``--- /dev/null``) is keyed by its ``+++`` path.
    """
    sections: dict[str, list[str]] = {}
    lines: list[str] | None = None
    old = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("--- "):
            old, lines = _header_path(line), [line]
            continue
        if lines is None:
            continue
        if len(lines) == 1 and line.startswith("+++ "):
            sections[_header_path(line) if old == "/dev/null" else old] = lines
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


def check_files(tree: str, sections: dict[str, str], action: str) -> None:
    """Refuse, naming the file, unless every target is a regular file the action can patch.

    ``apply``/``revert`` also need each file writable and its directory writable: patch
    writes its output to a temporary file there and renames it over the target. A target may
    be absent only where the action creates it (``--- /dev/null`` when applying,
    ``+++ /dev/null`` when reverting; ``check`` accepts either).
    """
    write = action != "check"
    for rel, body in sections.items():
        path = os.path.join(tree, rel)
        directory = os.path.dirname(path)
        header = body.split("\n", 2)[:2]
        creates = header[0].startswith("--- /dev/null") and action != "revert"
        deletes = len(header) > 1 and header[1].startswith("+++ /dev/null") and action != "apply"
        if os.path.islink(path):
            raise Refused(f"{path} is a symbolic link; patch refuses to patch it")
        if os.path.lexists(path) and not os.path.isfile(path):
            raise Refused(f"{path} is not a regular file")
        if not os.path.lexists(path) and not ((creates or deletes) and os.path.isdir(directory)):
            raise Refused(f"{path} does not exist")
        if not write:
            continue
        if os.path.lexists(path) and not os.access(path, os.W_OK):
            raise Refused(f"{path} cannot be written (read-only?); nothing was changed")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise Refused(
                f"{directory} cannot be written (read-only?), so {rel} cannot be patched "
                "there; nothing was changed"
            )


@dataclass
class _Saved:
    """One target's original content, or ``data is None`` when it did not exist."""

    data: bytes | None
    mode: int = 0
    times: tuple[int, int] = (0, 0)


@dataclass
class Snapshot:
    """The original bytes, mode and times of every target, and the names in their directories.

    :meth:`restore` puts the targets back byte for byte and removes the files patch leaves
    behind next to them (``NAME.orig``, ``NAME.rej``, ``NAME~``, temporary ``NAME.oXXXXXX``).
    """

    tree: str
    files: dict[str, _Saved] = field(default_factory=dict)
    listings: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def take(cls, tree: str, paths: list[str]) -> Snapshot:
        snap = cls(tree)
        for rel in paths:
            path = os.path.join(tree, rel)
            if os.path.lexists(path):
                st = os.stat(path)
                with open(path, "rb") as f:
                    data = f.read()
                saved = _Saved(data, stat.S_IMODE(st.st_mode), (st.st_atime_ns, st.st_mtime_ns))
            else:
                saved = _Saved(None)
            snap.files[path] = saved
            directory = os.path.dirname(path)
            if directory not in snap.listings:
                snap.listings[directory] = set(os.listdir(directory))
        return snap

    def leftovers(self) -> list[str]:
        """Files that appeared next to a target since :meth:`take` and belong to patch."""
        found = []
        for directory, before in self.listings.items():
            bases = [os.path.basename(p) for p in self.files if os.path.dirname(p) == directory]
            try:
                names = sorted(set(os.listdir(directory)) - before)
            except OSError:
                continue
            for name in names:
                path = os.path.join(directory, name)
                ours = name.endswith((".orig", ".rej")) or any(
                    name.startswith(base) and name != base for base in bases
                )
                if ours and path not in self.files and not os.path.isdir(path):
                    found.append(path)
        return found

    def remove_leftovers(self) -> list[str]:
        """Remove :meth:`leftovers`; returns their paths relative to the tree."""
        removed = []
        for path in self.leftovers():
            os.remove(path)
            removed.append(os.path.relpath(path, self.tree))
        return removed

    def restore(self) -> tuple[list[str], list[str], list[str]]:
        """Put every target back; returns (restored, leftovers removed, failures)."""
        restored: list[str] = []
        failures: list[str] = []
        for path, saved in self.files.items():
            rel = os.path.relpath(path, self.tree)
            try:
                if _restore_file(path, saved):
                    restored.append(rel)
            except OSError as exc:
                failures.append(f"{rel} ({exc.strerror or exc})")
        removed: list[str] = []
        for path in self.leftovers():
            try:
                os.remove(path)
                removed.append(os.path.relpath(path, self.tree))
            except OSError as exc:
                failures.append(f"remove {os.path.relpath(path, self.tree)} ({exc.strerror})")
        return restored, removed, failures

    def save_copies(self) -> str:
        """Write the original bytes to a new temporary directory; returns it."""
        keep = tempfile.mkdtemp(prefix="memscope-patch-originals-")
        for path, saved in self.files.items():
            if saved.data is None:
                continue
            dst = os.path.join(keep, os.path.relpath(path, self.tree))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(saved.data)
        return keep


def _restore_file(path: str, saved: _Saved) -> bool:
    """Put one target back as saved; returns whether anything had to change."""
    if saved.data is None:
        if not os.path.lexists(path):
            return False
        os.remove(path)
        return True
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
            same = f.read() == saved.data
        if same and stat.S_IMODE(os.stat(path).st_mode) == saved.mode:
            return False
    directory = os.path.dirname(path)
    try:  # a new file renamed over the target, as patch itself does: never half written
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    except OSError:  # the directory cannot take a new file: rewrite the target in place
        with open(path, "wb") as f:
            f.write(saved.data)
    else:
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(saved.data)
            os.chmod(tmp, saved.mode)
            os.replace(tmp, path)
        except BaseException:
            os.remove(tmp)
            raise
    os.chmod(path, saved.mode)
    os.utime(path, ns=saved.times)
    return True


@contextmanager
def _no_interrupt() -> Iterator[None]:
    """Ignore Ctrl-C while the tree is being restored (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, RolledBack):
        return str(exc)
    return _one_line(f"{type(exc).__name__}: {exc}")


def _change(tree: str, target: Target, action: str) -> None:
    """Dry run, then the real run, of the whole patch, atomically (``action``: apply/revert).

    Raises :class:`Refused` before any change, :class:`RolledBack` after restoring the tree.
    """
    text = _patch_text(target)
    reverse = ("--reverse",) if action == "revert" else ()
    sections = split_patch(text)
    check_files(tree, sections, action)
    paths = list(sections)
    proc = run_patch(tree, text, "--dry-run", *reverse)
    if proc.returncode != 0:
        raise Refused(f"patch --dry-run failed in {tree}: {_last_line(proc)}; nothing was changed")
    snapshot = Snapshot.take(tree, paths)  # reads only: an interruption here changes nothing
    try:
        proc = run_patch(tree, text, *reverse)
        if proc.returncode != 0:
            raise RolledBack(f"patch exited {proc.returncode}: {_last_line(proc)}")
        wanted = APPLIED if action == "apply" else NOT_APPLIED
        state, states = tree_state(tree, target)
        if state != wanted:
            raise RolledBack(f"patch exited 0 but left {_describe(states)}")
        snapshot.remove_leftovers()
    except BaseException as exc:
        with _no_interrupt():
            why = _why(exc)
            try:
                restored, removed, failures = snapshot.restore()
            except BaseException as inner:  # reported, and the originals are kept
                restored, removed, failures = [], [], [_why(inner)]
            if failures:
                try:
                    kept = f"the original files are in {snapshot.save_copies()}"
                except OSError as err:
                    kept = f"the originals could not be saved either ({err.strerror})"
                raise RolledBack(
                    f"{action} failed ({why}) and the tree could not be fully restored: "
                    f"{'; '.join(failures)}; {kept}"
                ) from None
            what = ", ".join(restored) if restored else "no file had changed"
            gone = f", removed {', '.join(removed)}" if removed else ""
            raise RolledBack(
                f"{action} failed ({why}); rolled back, the tree is as before: restored "
                f"{what} byte for byte{gone}"
            ) from None


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    detail = (proc.stdout + proc.stderr).strip().splitlines()
    return _one_line(detail[-1]) if detail else f"exit status {proc.returncode}"


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
        check_files(tree, split_patch(_patch_text(target)), "check")
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
            _change(tree, target, "apply")
            print(f"memscope patch applied: {label} ({', '.join(states)})")
            return 0
        if state == NOT_APPLIED:
            print(f"memscope patch not applied, nothing to revert: {label}")
            return 0
        _change(tree, target, "revert")
        print(f"memscope patch reverted: {label} ({', '.join(states)})")
        return 0
    except Refused as exc:
        print(f"memscope_patch: {exc.kind}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # _change turns one while patching into RolledBack
        print("memscope_patch: interrupted; nothing was changed", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
