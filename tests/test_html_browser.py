"""The page in a real headless Chromium: charts render, nothing is fetched from the network."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memscope.analysis.job import RankEntry, rank_steps, summarize_job
from memscope.reporters.html import plotly_js, render_job_html, render_runtime_html
from memscope.reporters.html_payload import job_payload, runtime_payload
from memscope.units import format_ratio

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _run_chromium(tmp_path, page):
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         "--enable-logging=stderr", "--v=0",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _dump_dom(tmp_path, page):
    """Chromium's DOM of ``page`` after its script ran; the page's script raised nothing
    (Chromium logs the console to stderr, an uncaught error as ``Uncaught ...``)."""
    res = _run_chromium(tmp_path, page)
    assert _script_errors(res.stderr) == []
    return res


def _script_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line and "Uncaught" in line]


def _page_dom(tmp_path, html: str) -> str:
    """The DOM Chromium builds from ``html`` (written to a page under ``tmp_path``)."""
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    res = _dump_dom(tmp_path, page)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


NO_REMOTE = re.compile(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", re.I)


def _remote_refs(text: str) -> list[str]:
    """Remote src/href in the page's own markup and code (the inlined plotly.js bundle holds
    attribution strings for map tiles that a page without maps never uses)."""
    return [m.group(0) for m in NO_REMOTE.finditer(text.replace(plotly_js(), ""))]


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_page_renders_plotly_charts_offline(tmp_path, traced_run):
    _, report, _ = traced_run
    page = tmp_path / "report.html"
    html = render_runtime_html(runtime_payload(report))
    assert _remote_refs(html) == []  # nothing the page could fetch
    page.write_text(html, encoding="utf-8")
    res = _dump_dom(tmp_path, page)
    dom = res.stdout
    assert res.returncode == 0, res.stderr[-2000:]
    assert dom.count('class="main-svg"') >= 2  # the step timeline and the within-step chart
    assert "23" in dom or "MiB" in dom
    assert 'id="cards"' in dom and "Peak allocated" in dom
    # Everything came from the file itself: no remote script, image or style was referenced.
    assert "http://" not in dom.split('id="memscope-data"')[0].replace("http://www.w3.org", "")


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_active_memory_of_the_peak_step_is_drawn_band_by_band(tmp_path, history_run):
    _, report, _ = history_run
    page = tmp_path / "history.html"
    page.write_text(render_runtime_html(runtime_payload(report)), encoding="utf-8")
    res = _dump_dom(tmp_path, page)
    assert res.returncode == 0, res.stderr[-2000:]
    active = res.stdout.split('id="active"')[1].split('id="active-note"')[0]
    bands = report["allocator_timeline"]["active_memory"]["bands"]
    assert active.count('class="trace scatter') == len(bands)  # one filled band each
    categories = {b["category"] for b in bands}
    assert active.count('class="legendtext"') == len(categories)  # legend: one per category
    assert "peak " in active  # the annotation at the step's peak


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_job_page_renders_with_a_missing_rank(tmp_path, traced_run):
    _, report, _ = traced_run
    entries = [RankEntry(0, dict(report, world_size=3)), RankEntry(1, None, "truncated JSON")]
    html = render_job_html(job_payload(summarize_job(entries), rank_steps(entries)))
    assert _remote_refs(html) == []
    page = tmp_path / "job.html"
    page.write_text(html, encoding="utf-8")
    res = _dump_dom(tmp_path, page)
    assert res.returncode == 0, res.stderr[-2000:]
    assert 'class="main-svg"' in res.stdout and _remote_refs(res.stdout) == []
    assert "truncated JSON" in res.stdout and "no rank directory" in res.stdout
    assert "<th>static estimate</th>" in res.stdout  # rendered by the page's own script
    ratio = report["comparisons"]["peak_diff_ratio"]
    assert format_ratio(ratio) in res.stdout  # the Markdown's rule ("0.0%", never "-0.0%")
    assert "-0.0%" not in res.stdout
    assert "<th>(static − runtime) / runtime peak</th>" in res.stdout


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_markup_in_names_reaches_plotly_as_text(tmp_path, traced_run):
    """Plotly reads trace names and hover text as pseudo-HTML; the page escapes every data
    string (plotlyText), so a phase named like a link is a legend label, not a link."""
    _, report, _ = traced_run
    link = '<a href="javascript:alert(1)">evil</a><b>bold</b>'
    evil = dict(report, runtime_trace=[
        dict(e, phase=link, module=link) if e["event_type"] != "step_phase" else e
        for e in report["runtime_trace"]
    ])  # fmt: skip
    page = tmp_path / "evil.html"
    page.write_text(render_runtime_html(runtime_payload(evil)), encoding="utf-8")
    res = _dump_dom(tmp_path, page)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    assert 'class="legendtext"' in dom
    shown = dom.split('id="memscope-data"')[0]
    assert "&lt;a href=" in shown  # the legend label is the name as text
    assert not re.search(r"<a[\s>]", shown) and "<b>bold" not in shown  # no link, no bold


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_job_page_explains_stages_and_draws_the_rank_grid(tmp_path, traced_run):
    _, report, _ = traced_run
    entries = []
    for rank in range(4):  # a PP=2 x DP=2 job made of the real report, stage 0 heavier
        meta = dict(report["metadata"], pp_rank=rank // 2, dp_rank=rank % 2, tp_rank=0)
        extra = 4096 if rank // 2 == 0 else 0
        categories = dict(report["peak"]["categories"])
        categories["activations"] += extra
        peak = dict(report["peak"], memory_bytes=report["peak"]["memory_bytes"] + extra,
                    categories=categories)  # fmt: skip
        entries.append(RankEntry(rank, dict(report, metadata=meta, peak=peak, world_size=4)))
    payload = job_payload(summarize_job(entries), rank_steps(entries))
    assert payload["imbalance_by_term"]["sentence"].startswith("stage 0 (rank 0) peaks 4.00 KiB")
    page = tmp_path / "job.html"
    page.write_text(render_job_html(payload), encoding="utf-8")
    res = _dump_dom(tmp_path, page)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "<th>in flight: measured / predicted</th>" in res.stdout
    assert payload["imbalance_by_term"]["sentence"] in res.stdout
    assert 'class="hm' in res.stdout or "heatmaplayer" in res.stdout  # the grid was drawn


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_cpu_page_marks_the_peak_and_says_what_the_backend_cannot_show(tmp_path, traced_run):
    _, report, _ = traced_run
    dom = _page_dom(tmp_path, render_runtime_html(runtime_payload(report)))
    assert 'class="peak-row"' in dom and "← peak" in dom  # the top event holding the peak
    assert "run peak " in dom  # the within-step chart's peak marker, named as the card names it
    peak = report["peak"]
    assert f"· {peak['phase']} · {peak['module']} · microbatch {peak['microbatch']}" in dom
    assert "no caching allocator on CPU" in dom  # the reserved card, not a figure
    assert "Not available with the storage backend" in dom and "--memscope-backend cuda" in dom
    assert "-0.0%" not in dom
    phases = dom.split('id="phases"')[1].split("</table>")[0]
    assert "≥" not in phases  # storage backend: each phase's own running peak, exact
    assert '<span id="phase-bound-note"></span>' in dom  # no lower bound to explain


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_cuda_page_shows_the_gpu_signals_per_step(tmp_path):
    from test_gpu_signals import _cuda_report

    dom = _page_dom(tmp_path, render_runtime_html(runtime_payload(_cuda_report())))
    gpu = dom.split('id="gpu"')[1].split("</table>")[0]
    assert "75.00 MiB" in gpu and "11.00 MiB" in gpu and "24.00 MiB" in gpu
    assert "Device used (most at a step end)" in dom
    # the cuda backend's optimizer phase stayed below the step's mark: a marked lower bound
    assert "≥ 40.00 MiB" in dom
    assert '<span id="phase-bound-note">; ≥ marks a phase' in dom


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_a_script_error_in_a_page_is_reported(tmp_path):
    """The no-script-error check above can fail: a payload without the steps the rank page's
    script reads makes it throw, and Chromium's log names the error."""
    payload = {"rank": 0, "world_size": 1, "grid": "", "job_page": "", "status": "complete"}
    page = tmp_path / "broken.html"
    page.write_text(render_runtime_html(payload), encoding="utf-8")
    res = _run_chromium(tmp_path, page)
    assert res.returncode == 0, res.stderr[-2000:]
    errors = _script_errors(res.stderr)
    assert len(errors) == 1 and "TypeError" in errors[0], res.stderr[-2000:]


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_diff_page_of_the_example_ranks_renders(tmp_path):
    from memscope.cli import main

    out = tmp_path / "diff"
    a, b = (str(EXAMPLE / f"rank{r:05d}") for r in (0, 1))
    assert main(["diff", a, b, "--out", str(out)]) == 0
    dom = _page_dom(tmp_path, (out / "diff.html").read_text(encoding="utf-8"))
    assert 'class="main-svg"' in dom  # the per-category bars
    assert dom.count('class="card"') == 3 and "Peak A" in dom and "Peak B" in dom
    rows = dom.split('id="rows"')[1].split("</table>")[0]
    assert rows.count("<tr>") > 2 and "<th>B − A</th>" in rows
