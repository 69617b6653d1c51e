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
    (``MAJOR``.``MINOR``.``PATCH``)."""
    parts = dict(
        _VERSION_PART.findall(git(git_dir, "show", f"{commit}:megatron/core/package_info.py"))
    )
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"


def first_written(git_dir: str) -> dict[str, tuple[str, str, str]]:
    """Golden values blob id -> (commit date, commit, path) of the earliest commit, on any
    branch, that wrote that content under :data:`CASES_DIR`: where those numbers were
    measured."""
    log = git(git_dir, "log", "--all", "--raw", "--no-abbrev", "--format=commit %H %ct %cs",
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
    """The :data:`MEASURED_SERIES` of a golden values file's text (absent ones left out)."""
    data = json.loads(text)
    return {k: data[k].get("values") for k in MEASURED_SERIES if isinstance(data.get(k), dict)}


def measuring_commit(git_dir: str, start: str, path: str) -> tuple[str, str, list[str]]:
    """The commit, up to ``start``, whose run wrote the numbers the golden values file at
    ``path`` (as of ``start``) holds, with the file's path at that commit and every path it
    has had, newest first.

    That is the last commit that changed its :data:`MEASURED_SERIES`, renames followed: one
    that only moved it (``R100``) or edited other fields measured nothing. A golden file is
    rewritten from one CI run's output, so the code at that commit, and the case's
    configuration beside it then, produced its memory figures; a case kept under a new name
    or with later flags but never re-measured still carries them."""
    log = git(git_dir, "log", "--follow", "--format=commit %H", "--name-status", start,
              "--", path)  # fmt: skip
    commit = ""
    found: tuple[str, str] | None = None
    names: list[str] = []
    for line in log.splitlines():
        if line.startswith("commit "):
            commit = line.split()[1]
            continue
        if not line.strip():
            continue
        status, *paths = line.split("\t")
        names.extend(p for p in reversed(paths) if p not in names)
        if found is not None or status == "R100":
            continue
        if status.startswith(("M", "R")):
            before = git(git_dir, "show", f"{commit}^:{paths[0]}")
            after = git(git_dir, "show", f"{commit}:{paths[-1]}")
            if measured_series(before) == measured_series(after):
                continue  # an edit, not a run
        found = (commit, paths[-1])
    assert found is not None, path
    return found[0], found[1], names
