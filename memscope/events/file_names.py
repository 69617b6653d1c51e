"""The names of the files and folders MemScope writes and reads, each written once here.

The on-disk contract: a run's output directory holds one ``rankNNNNN/`` folder per traced rank
(its report, trace, OOM report or start-failure note) and, on the rank that gathered it, the job
summary; the offline commands write the static, log and job reports. Every module that names one
of these files imports it from here (``tests/test_file_names.py`` checks that none spells it).
"""

from __future__ import annotations

import re

#: A rank's runtime report, in its rank folder (a rank folder stands for this file).
REPORT_NAME = "runtime_report.json"
#: The same report, readable.
REPORT_MD_NAME = "runtime_report.md"
#: A rank's event trace, in its rank folder (rotated copies: ``trace.1.jsonl`` ...).
TRACE_NAME = "trace.jsonl"
#: The OOM report a rank that ran out of memory leaves beside its runtime report, and its Markdown.
OOM_REPORT_NAME = "oom_report.json"
OOM_REPORT_MD_NAME = "oom_report.md"
#: The note a rank whose tracing never started leaves in its folder.
START_FAILURE_NAME = "start_failure.json"
#: The job's summary, in the output directory on the rank that gathered it.
JOB_SUMMARY_NAME = "job_summary.json"
#: The job page ``visualize-runtime`` writes for a job directory.
JOB_PAGE_NAME = "job_report.html"
#: ``analyze-static``'s report and its Markdown.
STATIC_REPORT_NAME = "static_report.json"
STATIC_REPORT_MD_NAME = "static_report.md"
#: ``analyze-log``'s report as JSON, Markdown and HTML.
LOG_REPORT_NAMES = ("log_report.json", "log_report.md", "log_report.html")
#: ``diff``'s report as JSON, Markdown and HTML, in its ``--out`` folder.
DIFF_REPORT_NAMES = ("diff.json", "diff.md", "diff.html")
#: The ``torch.profiler`` traces' folder, in a rank folder.
PROFILER_DIR = "profiler"
#: Allocator-history snapshots in a rank folder: at the end of tracing, and at an OOM (the
#: window's own is :func:`snapshot_window_name`).
SNAPSHOT_FINAL_NAME = "memory_snapshot_final.pickle"
OOM_SNAPSHOT_NAME = "oom_snapshot.pickle"

#: A rank folder as read: ``rank`` and up to 15 digits (a rank JavaScript still holds exactly).
RANK_DIR = re.compile(r"^rank(\d{1,15})$")


def snapshot_window_name(first: int, last: int) -> str:
    """The allocator-history snapshot of the steps ``first`` to ``last``."""
    return f"memory_snapshot_steps{first}-{last}.pickle"


def rank_folder_name(rank: int) -> str:
    """The folder a rank's files go in, as written: ``rank`` and the rank in five digits."""
    return f"rank{rank:05d}"
