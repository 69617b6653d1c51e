"""The ``rankNNNNN/`` folders of a job's output directory, each holding one rank's report.

Shared by every reader of a job directory (the job page, ``summarize``, ``diff``, ``export``,
``plan --calibrate``, the FlagScale auto-tuner's trial reader), so they agree on which folders
count; and the one rule by which a rank folder stands for the file in it wherever a command
takes a report (or trace) file: ``--report rank00001/`` is ``rank00001/runtime_report.json``.
"""

from __future__ import annotations

import os

from memscope.events.file_names import RANK_DIR, REPORT_NAME
from memscope.io.report_reader import ReportError

#: Most rank folders a job directory may hold (more is refused: one line, exit code 2).
MAX_JOB_RANKS = 100_000
#: A job of at most this many ranks gets every rank's page from ``visualize-runtime`` (each
#: page carries plotly.js, ~5 MB); a larger one the pages of the ranks its job page plots.
ALL_RANK_PAGES_UP_TO = 64


def rank_folders(directory: str) -> list[tuple[int, str]]:
    """``(rank, folder path)`` of each ``rankNNNNN/`` folder of a job directory, in rank order;
    the first folder of a rank counts (``rank00001`` before ``rank1``). A directory that can't
    be listed, or holds more than :data:`MAX_JOB_RANKS` of them, is a :class:`ReportError`."""
    found: dict[int, str] = {}
    try:
        with os.scandir(directory) as it:
            for item in it:
                m = RANK_DIR.match(item.name)
                if not m:
                    continue
                try:
                    if not item.is_dir():
                        continue
                except OSError:
                    continue
                rank = int(m.group(1))
                if rank not in found or item.name < os.path.basename(found[rank]):
                    found[rank] = item.path
                if len(found) > MAX_JOB_RANKS:
                    raise ReportError(f"{directory}: more than {MAX_JOB_RANKS} rank folders")
    except OSError as exc:
        raise ReportError(f"{directory}: cannot list ({exc.strerror})") from None
    return sorted(found.items())


def folder_file(path: str, name: str = REPORT_NAME) -> str:
    """``path/name`` when ``path`` is a folder holding that file (a rank folder), else
    ``path`` itself (a file, a job directory, or a path that does not exist)."""
    inside = os.path.join(path, name)
    return inside if os.path.isdir(path) and os.path.isfile(inside) else path


def is_job_directory(path: str, name: str = REPORT_NAME) -> bool:
    """Whether ``path`` is a directory that is not itself a rank folder holding ``name``."""
    return os.path.isdir(path) and folder_file(path, name) == path


def rank_files(path: str, name: str = REPORT_NAME) -> list[tuple[int, str]]:
    """``(rank, file)`` of what ``path`` names: a file or a rank folder's ``name`` (rank -1:
    whichever it is), or the ``name`` of every ``rankNNNNN/`` folder of a job directory that
    has one, in rank order. Nothing found is a :class:`ReportError`."""
    own = folder_file(path, name)
    if not os.path.isdir(own):
        if not os.path.lexists(own):
            what = "report" if name == REPORT_NAME else "file"
            raise ReportError(f"{path}: no such {what}, rank folder or job directory")
        return [(-1, own)]
    found = [(rank, os.path.join(folder, name)) for rank, folder in rank_folders(path)]
    found = [(rank, file) for rank, file in found if os.path.isfile(file)]
    if not found:
        raise ReportError(f"{path}: no {name} here or in rankNNNNN/ folders")
    return found
