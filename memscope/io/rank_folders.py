"""The ``rankNNNNN/`` folders of a job's output directory, each holding one rank's report.

Shared by every reader of a job directory (the job page, ``diff``, ``plan --calibrate``, the
FlagScale auto-tuner's trial reader), so they agree on which folders count.
"""

from __future__ import annotations

import os
import re

from memscope.io.report_reader import ReportError

#: A rank folder: ``rank`` and up to 15 digits (a rank JavaScript still holds exactly).
RANK_DIR = re.compile(r"^rank(\d{1,15})$")
#: The runtime report inside a rank folder.
REPORT_NAME = "runtime_report.json"
#: Most rank folders a job directory may hold (more is refused: one line, exit code 2).
MAX_JOB_RANKS = 100_000


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
