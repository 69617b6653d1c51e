"""Writing the HTML pages, shared by ``visualize-runtime`` and ``demo``.

Reads runtime reports, runs the job analysis, hands plain data to the HTML reporters and
writes the pages atomically. Every failure is a :class:`CliError` (one line, exit code 2).
Imports jinja2 and the reporters, so command modules import this inside their ``run``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from memscope.analysis.job import (
    RankEntry,
    entries_of_run,
    job_mixups,
    rank_row,
    rank_steps,
    rank_summary,
    summarize_job,
)
from memscope.cli.common import MALFORMED, CliError, check_output, progress, write_output
from memscope.events.bounded_input import InputRefused, read_regular
from memscope.events.file_names import (
    JOB_PAGE_NAME,
    JOB_SUMMARY_NAME,
    REPORT_NAME,
    START_FAILURE_NAME,
)
from memscope.io.rank_folders import ALL_RANK_PAGES_UP_TO, MAX_JOB_RANKS
from memscope.io.rank_folders import rank_folders as io_rank_folders
from memscope.io.report_reader import ReportError, load_report
from memscope.reporters.html import render_job_html, render_runtime_html
from memscope.reporters.html_payload import (
    MAX_POINTS,
    job_payload,
    runtime_payload,
    timeline_ranks,
)
from memscope.reporters.job_summary_json import REPORT_TYPE_JOB_SUMMARY
from memscope.reporters.runtime_json import REPORT_TYPE_RUNTIME

#: Rank pages that could not be written, said one by one (the rest are counted).
SAID_FAILURES = 3
#: What a refusal of mixed rank reports tells the user to do.
MIXED_HINT = "pass --run-id ID to keep one run's ranks, or --allow-mixed-runs to merge them flagged"


def load_runtime_report(path: str) -> dict[str, Any]:
    """A runtime report, or the reader's one-line error as a :class:`CliError`."""
    try:
        return load_report(path, REPORT_TYPE_RUNTIME)
    except ReportError as exc:
        raise CliError(str(exc)) from None


def write_page(out: str, html: str, inputs: Sequence[str] = ()) -> None:
    """Write a page atomically (a reader never sees half of it): only as a regular file,
    never over one of ``inputs`` (see :mod:`memscope.io.safe_output`)."""
    write_output(out, html, inputs)


def rank_page_path(report_path: str) -> str:
    """Where a rank's page goes by default: next to its report, ``.json`` -> ``.html``."""
    return os.path.splitext(report_path)[0] + ".html"


def rank_page_html(report: dict[str, Any], report_path: str, job_page: str | None = None) -> str:
    """One rank's page (linking ``job_page``, a URL relative to the page); a report the
    payload can't use is a one-line error naming the file."""
    try:
        return render_runtime_html(runtime_payload(report, job_page=job_page))
    except MALFORMED as exc:
        raise CliError(f"{report_path}: malformed runtime report ({exc})") from None


def write_rank_page(
    report_path: str,
    out: str | None = None,
    report: dict[str, Any] | None = None,
    job_page: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """Load (unless given) a rank's report, render its page and write it to ``out`` (default
    next to the report), linking the job page at ``job_page`` (a path) when given. Returns
    the page's path and the report."""
    out = out or rank_page_path(report_path)
    check_output(out, [report_path])  # before reading: a page never replaces its report
    if report is None:
        report = load_runtime_report(report_path)
    link = None
    if job_page is not None:
        link = os.path.relpath(job_page, os.path.dirname(os.path.abspath(out)) or ".")
        link = link.replace(os.sep, "/")
    write_page(out, rank_page_html(report, report_path, link), [report_path])
    return out, report


def job_page_beside(report_path: str) -> str | None:
    """The job page of the job directory holding this rank folder's report, if written."""
    folder = os.path.dirname(os.path.abspath(report_path))
    page = job_page_path(os.path.dirname(folder))
    return page if os.path.isfile(page) else None


def job_page_html(entries: Sequence[RankEntry]) -> str:
    """The job page from its ranks: the job analysis, then the reporter. A folder that mixes
    runs is said on the terminal too."""
    summary = summarize_job(entries)
    if summary["runs_warning"]:
        progress(summary["runs_warning"])
    return render_job_html(job_payload(summary, rank_steps(entries)))


def rank_folders(directory: str) -> list[tuple[int, str]]:
    """:func:`memscope.io.rank_folders.rank_folders`, its refusal as a :class:`CliError`."""
    try:
        return io_rank_folders(directory)
    except ReportError as exc:
        raise CliError(str(exc)) from None


def start_failure(folder: str) -> str | None:
    """Why tracing never started on the rank of ``folder`` (its ``start_failure.json``), if
    it left that note."""
    try:
        raw = read_regular(os.path.join(folder, START_FAILURE_NAME), 1 << 20)
        reason = json.loads(raw).get("reason")
    except (InputRefused, ValueError, AttributeError):
        return None
    return str(reason)[:300] if reason else None


def job_entries(directory: str) -> list[RankEntry]:
    """One entry per ``rankNNNNN/`` folder of a job directory, in rank order. A rank whose
    report can't be read or used is an entry with the reason, so one bad rank never takes the
    job page down. Only the parts of a report the job page shows are kept in memory."""
    entries = []
    for rank, folder in rank_folders(directory):
        name = os.path.basename(folder)
        try:
            report = load_report(os.path.join(folder, REPORT_NAME), REPORT_TYPE_RUNTIME)
        except ReportError as exc:
            # a folder with no report at all may be a stray beside the job; one whose report
            # is unreadable is a rank that failed to write it; one with a start note is a
            # rank whose tracing never started, and says why
            absent = not os.path.lexists(os.path.join(folder, REPORT_NAME))
            note = start_failure(folder) if absent else None
            problem = f"tracing did not start: {note}" if note else str(exc)
            where = name if absent and not note else ""
            entries.append(RankEntry(rank, None, problem, where=where))
            continue
        summary = rank_summary(report, max_steps=MAX_POINTS)  # no more than a page plots
        entry = _checked_entry(rank, summary, f"{name}/{REPORT_NAME}")
        entry.where = name
        entries.append(entry)
    return entries


def one_launch(
    entries: list[RankEntry], where: str, run_id: str | None = None, allow_mixed: bool = False
) -> list[RankEntry]:
    """``entries``, or those of run ``run_id``; refused (a one-line :class:`CliError` naming
    the folders and saying how to go on) when they mix runs, world sizes, ranks or grid
    positions, unless ``allow_mixed``."""
    if run_id is not None:
        kept = entries_of_run(entries, run_id)
        if not any(e.report is not None for e in kept):
            runs = sorted({e.run_id for e in entries if e.report is not None})
            raise CliError(f"{where}: no rank report of run {run_id} (runs: {', '.join(runs)})")
        entries = kept
    mixups = job_mixups(entries)
    if mixups and not allow_mixed:
        raise CliError(f"{where}: {'; '.join(mixups.values())}; {MIXED_HINT}")
    return entries


def rank_pages_to_write(reported: Sequence[RankEntry], every: bool) -> set[int]:
    """Of the ranks with a report in a folder, those whose page is written: every one when
    ``every`` or when there are at most :data:`ALL_RANK_PAGES_UP_TO`; else those the job page
    plots (failed ranks, each stage's heaviest, then the highest peaks)."""
    if every or len(reported) <= ALL_RANK_PAGES_UP_TO:
        return {e.rank for e in reported}
    return timeline_ranks([rank_row(e.rank, e.report) for e in reported if e.report is not None])


def write_rank_pages(
    entries: Sequence[RankEntry], directory: str, job_page: str, every: bool = False
) -> tuple[int, int]:
    """Write the page of each rank of :func:`rank_pages_to_write`, next to its report in its
    folder of the job ``directory`` (read again: only one full report is in memory at a
    time), linking each to the job page (``job_page``, a path) and it from the entry. A
    rank whose page can't be made is said and left unlinked. Returns (pages written, ranks
    with a report)."""
    page_dir = os.path.dirname(job_page) or "."
    reported = [e for e in entries if e.report is not None and e.where]
    chosen = rank_pages_to_write(reported, every)
    written, failed = 0, []
    for entry in reported:
        if entry.rank not in chosen:
            continue
        report_path = os.path.join(directory, entry.where, REPORT_NAME)
        try:
            page, _ = write_rank_page(report_path, job_page=job_page)
        except CliError as exc:
            failed.append(str(exc))
            continue
        entry.page = os.path.relpath(page, page_dir).replace(os.sep, "/")
        written += 1
    for problem in failed[:SAID_FAILURES]:
        progress(f"no rank page: {problem}")
    if len(failed) > SAID_FAILURES:
        progress(f"no rank page for {len(failed) - SAID_FAILURES} more rank(s)")
    return written, len(reported)


def _checked_entry(rank: int, summary: dict[str, Any], where: str) -> RankEntry:
    """The rank's entry, or one saying why its summary can't be used: the same analysis and
    payload as the page, on this rank alone, must go through."""
    try:
        one = [RankEntry(rank, summary)]
        job_payload(summarize_job(one), rank_steps(one), max_points=16)
    except MALFORMED as exc:
        return RankEntry(rank, None, f"{where}: malformed ({exc})")
    return RankEntry(rank, summary)


def load_page_input(path: str) -> dict[str, Any]:
    """A runtime report or a ``job_summary.json``; anything else is a :class:`CliError`."""
    try:
        doc = load_report(path)
    except ReportError as exc:
        raise CliError(str(exc)) from None
    kind = doc.get("report_type")
    if kind not in (REPORT_TYPE_RUNTIME, REPORT_TYPE_JOB_SUMMARY):
        raise CliError(
            f"{path}: is a {kind!r:.40} report; visualize-runtime takes a runtime report, a "
            f"{JOB_SUMMARY_NAME} or a job directory"
        )
    return doc


def job_summary_entries(doc: dict[str, Any], path: str) -> list[RankEntry]:
    """One entry per rank of a ``job_summary.json``: its summary, or why it has none."""
    ranks, missing = doc.get("ranks"), doc.get("missing_ranks")
    if not isinstance(ranks, list) or not isinstance(missing, list):
        raise CliError(f"{path}: malformed job summary (ranks and missing_ranks must be lists)")
    entries = []
    for i, summary in enumerate(ranks):
        rank = summary.get("rank") if isinstance(summary, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise CliError(f"{path}: malformed job summary (ranks[{i}] has no valid rank)")
        entries.append(_checked_entry(rank, summary, f"{path}: rank {rank}"))
    for i, item in enumerate(missing):
        rank = item.get("rank") if isinstance(item, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise CliError(f"{path}: malformed job summary (missing_ranks[{i}] has no rank)")
        entries.append(RankEntry(rank, None, str(item.get("reason") or "no summary")))
    if len(entries) > MAX_JOB_RANKS:
        raise CliError(f"{path}: more than {MAX_JOB_RANKS} ranks")
    return sorted(entries, key=lambda e: e.rank)


def job_page_path(directory: str) -> str:
    """Where a job's page goes by default: ``<directory>/job_report.html``."""
    return os.path.join(directory, JOB_PAGE_NAME)


def job_inputs(directory: str) -> list[str]:
    """The report files a job page is made from (an output may never replace one)."""
    return [os.path.join(folder, REPORT_NAME) for _, folder in rank_folders(directory)]


def write_job_page(entries: Sequence[RankEntry], out: str, inputs: Sequence[str] = ()) -> str:
    """Render the job page of ``entries`` and write it to ``out``; returns ``out``."""
    write_page(out, job_page_html(entries), inputs)
    return out


def readable_job_entries(directory: str) -> list[RankEntry]:
    """:func:`job_entries`, failing when no rank folder holds a readable report."""
    entries = job_entries(directory)
    if not any(e.report is not None for e in entries):
        found = f"{len(entries)} rank folder(s), none readable" if entries else "no rankNNNNN/"
        raise CliError(f"{directory}: no readable {REPORT_NAME} ({found})")
    return entries
