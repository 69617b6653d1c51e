"""When a Megatron-LM functional-test golden values file was measured: its git history.

A golden values file is rewritten from one CI run's TensorBoard output, so the commit that
wrote its content is the code that produced its memory figures; a case kept since (renamed,
given new flags, vendored into another tree) still carries them. Read from a Megatron-LM git
directory (the ``fetch`` of github:NVIDIA/Megatron-LM); the benchmarks commit what they read.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess

CASES_DIR = "tests/functional_tests/test_cases"
# What a run writes into a golden file and an edit of the file does not: a commit that leaves
# these series as they were (Megatron-LM 93ebf8d72f, "Remove leading NaN iteration times from
# golden values", edited 272 files) measured nothing.
MEASURED_SERIES = ("lm loss", "mem-allocated-bytes", "mem-max-allocated-bytes")
_VERSION_PART = re.compile(r"^(MAJOR|MINOR|PATCH) = (\d+)$", re.M)
_PRE_RELEASE = re.compile(r"^PRE_RELEASE = ['\"]([^'\"]*)['\"]", re.M)


def git(git_dir: str, *args: str) -> str:
    out = subprocess.run(
        ["git", "--git-dir", git_dir, *args], capture_output=True, text=True, check=True
    )
    return out.stdout


def blob_id(data: bytes) -> str:
    """The git blob id of a file's bytes (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def megatron_core_version(git_dir: str, commit: str) -> str:
    """The megatron-core release at ``commit``: ``megatron/core/package_info.py``
    (``MAJOR``.``MINOR``.``PATCH`` and its ``PRE_RELEASE``, e.g. ``0.14.0rc0``: a change
    first in ``rc4`` is not in a main-line commit that still says ``rc0``)."""
    info = git(git_dir, "show", f"{commit}:megatron/core/package_info.py")
    parts = dict(_VERSION_PART.findall(info))
    pre = _PRE_RELEASE.search(info)
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{pre[1] if pre else ''}"


# where a Megatron-LM commit pins the Transformer Engine its CI container builds
_TE_LOCKED = re.compile(r'^name = "transformer-engine"\nversion = "([^"]+)"', re.M)
_TE_REV = re.compile(r'^transformer-engine\s*=\s*\{[^}]*\brev\s*=\s*"([0-9a-f]{7,40})"', re.M)
_TE_COMMIT_ARG = re.compile(r"^ARG TE_COMMIT=([0-9a-f]{7,40})", re.M)
_TE_RANGE = re.compile(r'"transformer-engine(?:\[[^\]]*\])?\s*>=\s*([0-9][^,"]*)')
TE_DOCKERFILES = ("docker/Dockerfile.ci.dev", "Dockerfile.ci.dev")


def _show(git_dir: str, commit: str, path: str) -> str | None:
    try:
        return git(git_dir, "show", f"{commit}:{path}")
    except subprocess.CalledProcessError:
        return None


def transformer_engine_version(git_dir: str, te_git_dir: str, commit: str) -> tuple[str, str]:
    """The Transformer Engine release a Megatron-LM commit's CI container ran, and how that is
    known: the version ``uv.lock`` resolved; else the ``rev`` ``pyproject.toml`` pins
    (``[tool.uv.sources]``) or the ``TE_COMMIT`` the CI Dockerfile builds, read as that
    Transformer Engine commit's ``build_tools/VERSION.txt``; else the lower bound of
    ``pyproject.toml``'s version range; else (no pin: the base image's) the newest
    Transformer Engine release tagged by the commit's date (a container cannot hold a later
    release; a development build of the next one reads as before it). ``te_git_dir``: a
    Transformer Engine git directory (the ``fetch`` of github:NVIDIA/TransformerEngine)."""
    locked = _TE_LOCKED.search(_show(git_dir, commit, "uv.lock") or "")
    if locked is not None:
        return locked[1], "uv.lock"
    pyproject = _show(git_dir, commit, "pyproject.toml") or ""
    pinned = _TE_REV.search(pyproject)
    where = "pyproject.toml rev"
    if pinned is None:
        for dockerfile in TE_DOCKERFILES:
            pinned = _TE_COMMIT_ARG.search(_show(git_dir, commit, dockerfile) or "")
            if pinned is not None:
                where = f"{dockerfile} TE_COMMIT"
                break
    if pinned is not None:
        version = git(te_git_dir, "show", f"{pinned[1]}:build_tools/VERSION.txt").strip()
        return version, f"{where} {pinned[1][:12]}"
    ranged = _TE_RANGE.search(pyproject)
    if ranged is not None:
        return ranged[1].strip(), "pyproject.toml range: its lower bound"
    date = git(git_dir, "show", "-s", "--format=%cI", commit).strip()
    tags = git(te_git_dir, "tag", "--list", "v*",
               "--format=%(refname:short) %(creatordate:iso-strict)")  # fmt: skip
    released = [
        (tuple(int(x) for x in tag[1:].split(".")), tag)
        for tag, when in (line.split() for line in tags.splitlines())
        if re.fullmatch(r"v\d+\.\d+(\.\d+)?", tag) and when <= date
    ]
    _, tag = max(released)
    return tag[1:], f"no pin: the newest Transformer Engine release by {date[:10]}"


def first_written(git_dir: str, ref: str) -> dict[str, tuple[str, str, str]]:
    """Golden values blob id -> (commit date, commit, path) of the earliest commit among
    ``ref`` and its ancestors that wrote that content under :data:`CASES_DIR`, whatever the
    case (a byte-identical copy carries another run's numbers). Ancestors only: a pull
    request's own branch, squashed into one commit on the main line, is not history every
    clone has."""
    log = git(git_dir, "log", ref, "--full-history", "--raw", "--no-abbrev",
              "--format=commit %H %ct %cs",
              "--", CASES_DIR)  # fmt: skip
    out: dict[str, tuple[str, str, str]] = {}
    when: dict[str, int] = {}
    commit = date = ""
    stamp = 0
    for line in log.splitlines():
        if line.startswith("commit "):
            _, commit, seconds, date = line.split()
            stamp = int(seconds)
        elif line.startswith(":"):
            meta, *paths = line.split("\t")
            blob = meta.split()[3]
            if set(blob) == {"0"} or "golden_values" not in paths[-1]:
                continue  # a deletion, or not a golden values file
            if blob not in when or stamp <= when[blob]:  # the log runs newest first
                when[blob] = stamp
                out[blob] = (date, commit, paths[-1])
    return out


def measured_series(text: str) -> dict[str, object]:
    """The :data:`MEASURED_SERIES` of a golden values file's text (absent ones left out); a
    text that is no JSON object (some commits hold an empty file) is its own series."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return {"text": text}
    return {k: data[k].get("values") for k in MEASURED_SERIES if isinstance(data.get(k), dict)}


def previous_version(git_dir: str, commit: str, path: str) -> tuple[str, str] | None:
    """(path, blob id) of what ``path`` was in ``commit``'s first parent, as rename detection
    over the whole commit pairs it (``git log --follow`` pairs a file with any deleted file of
    the same bytes, another case's); None where ``commit`` added it or has no parent."""
    try:
        out = git(git_dir, "diff-tree", "-r", "-M", "--no-commit-id", "--raw", "--no-abbrev",
                  f"{commit}^", commit)  # fmt: skip
    except subprocess.CalledProcessError:  # a root commit
        return None
    for line in out.splitlines():
        meta, *paths = line.split("\t")
        fields = meta.split()
        if paths and paths[-1] == path:
            return None if fields[4].startswith("A") else (paths[0], fields[2])
    return None


def measuring_commit(
    git_dir: str, written: dict[str, tuple[str, str, str]], blob: str
) -> tuple[str, str, str, list[str]]:
    """The commit whose run wrote the numbers a golden values file with bytes ``blob``
    holds, its date, the file's path there, and the paths it had on the way to ``blob``,
    oldest first.

    The earliest commit that wrote those bytes (:func:`first_written`, under whatever case's
    path: a byte-identical copy carries another run's numbers), then back past every commit
    that left the :data:`MEASURED_SERIES` as they were (a rename with edits, or an edit of
    other fields such as Megatron-LM 93ebf8d72f's removal of leading NaN iteration times) to
    the one that changed them. A golden file is rewritten from one CI run's output, so the
    code at that commit, and the case's configuration beside it then, produced its memory
    figures; a case kept under a new name or with later flags but never re-measured still
    carries them."""
    date, commit, path = written[blob]
    names = [path]
    series = measured_series(git(git_dir, "show", blob))
    while True:
        before = previous_version(git_dir, commit, path)
        if before is None or before[1] not in written:
            break
        if measured_series(git(git_dir, "show", before[1])) != series:
            break  # this commit's run changed them
        date, commit, path = written[before[1]]
        names.insert(0, path)
    return commit, date, path, names
