"""``job_summary.json``: every rank's summary, gathered in-run by one rank.

The document carries the identity every MemScope file has (schema version, type, tool), the
job's run id, the writing rank with its start time and host, the world size, one summary per
rank that sent one (see :func:`memscope.analysis.job.rank_summary`), and the ranks that did
not, with why.
``memscope visualize-runtime --report job_summary.json`` makes the job page from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memscope.reporters.runtime_json import document_identity

REPORT_TYPE_JOB_SUMMARY = "job_summary"


def job_summary_document(
    summaries: Mapping[int, Mapping[str, Any]],
    missing: Mapping[int, str],
    *,
    world_size: int,
    written_by: int,
    run_id: str,
    collection: Mapping[str, Any],
    start_time: str = "",
    hostname: str = "",
) -> dict[str, Any]:
    """The ``job_summary.json`` document. ``summaries``: rank -> its summary; ``missing``:
    rank -> why it has none; ``collection``: how the summaries were gathered (transport,
    timeout, seconds waited); ``start_time`` and ``hostname``: the writing rank's."""
    return {
        **document_identity(REPORT_TYPE_JOB_SUMMARY),
        "run_id": run_id,
        "start_time": start_time,
        "hostname": hostname,
        "rank": written_by,
        "world_size": world_size,
        "ranks_reported": len(summaries),
        "collection": dict(collection),
        "missing_ranks": [{"rank": r, "reason": missing[r]} for r in sorted(missing)],
        "ranks": [dict(summaries[r]) for r in sorted(summaries)],
    }
