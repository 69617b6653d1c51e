"""The job page draws its blocks by iterating its sections index, as the rank page does.

``JOB_PAGE_SECTIONS`` (reporters/html_payload.py) lists them; each is a partial in
``templates/sections/job/`` and a function of ``JOB_SECTIONS`` (templates/js/job_page.js), and
the page follows the order of the ``sections`` index its payload carries.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memscope.analysis.job import RankEntry, rank_steps, summarize_job
from memscope.events.file_names import REPORT_NAME, rank_folder_name
from memscope.reporters.html import render_job_html
from memscope.reporters.html_payload import JOB_PAGE_SECTIONS, job_payload

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cpu_pp2_demo"
NODE = shutil.which("node")
SECTION_ID = re.compile(r'<section class="job-section" id="section-([a-z_]+)">')


def _payload() -> dict:
    entries = []
    for rank in (0, 1):
        path = EXAMPLE / rank_folder_name(rank) / REPORT_NAME
        entries.append(RankEntry(rank, json.loads(path.read_text(encoding="utf-8"))))
    return job_payload(summarize_job(entries), rank_steps(entries))


def test_every_job_section_has_its_partial_and_every_partial_a_section():
    folder = importlib.resources.files("memscope.reporters") / "templates" / "sections" / "job"
    partials = {p.name.removesuffix(".html.j2") for p in folder.iterdir()}
    assert partials == set(JOB_PAGE_SECTIONS)


def test_the_job_scripts_registry_draws_exactly_the_listed_sections():
    if NODE is None:
        pytest.skip("no node binary: the registry is read by running the page's script")
    js = ROOT / "memscope" / "reporters" / "templates" / "js"
    files = ("format.js", "tables.js", "charts.js", "sections.js", "job_view.js", "job_page.js")
    source = "\n".join((js / f).read_text(encoding="utf-8") for f in files)
    source = source.replace("drawSections(DATA, JOB_SECTIONS);", "")  # no page to draw on
    keys = "console.log(JSON.stringify(Object.keys(JOB_SECTIONS)));"
    script = f'"use strict";\nconst RULES = {{}};\n{source}\n{keys}'
    res = subprocess.run([NODE, "-e", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout) == list(JOB_PAGE_SECTIONS)


def test_the_job_page_follows_its_index_order_and_leaves_out_what_it_does_not_list():
    payload = _payload()
    assert [s["name"] for s in payload["sections"]] == list(JOB_PAGE_SECTIONS)
    assert SECTION_ID.findall(render_job_html(payload)) == list(JOB_PAGE_SECTIONS)
    payload["sections"] = [s for s in reversed(payload["sections"]) if s["name"] != "grid"]
    html = render_job_html(payload)
    assert SECTION_ID.findall(html) == [n for n in reversed(JOB_PAGE_SECTIONS) if n != "grid"]
    assert 'id="grid"' not in html and 'id="timelines"' in html
