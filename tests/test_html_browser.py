"""The page in a real headless Chromium: charts render, nothing is fetched from the network."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from memscope.reporters.html import render_runtime_html
from memscope.reporters.html_payload import runtime_payload

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian chromium)"
)
def test_page_renders_plotly_charts_offline(tmp_path, traced_run):
    _, report, _ = traced_run
    page = tmp_path / "report.html"
    page.write_text(render_runtime_html(runtime_payload(report)), encoding="utf-8")
    assert CHROMIUM is not None
    res = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    dom = res.stdout
    assert res.returncode == 0, res.stderr[-2000:]
    assert dom.count('class="main-svg"') >= 2  # the step timeline and the within-step chart
    assert "23" in dom or "MiB" in dom
    assert 'id="cards"' in dom and "Peak allocated" in dom
    # Everything came from the file itself: no remote script, image or style was referenced.
    assert "http://" not in dom.split('id="memscope-data"')[0].replace("http://www.w3.org", "")
