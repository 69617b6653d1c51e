"""The rank page draws the report's ``sections`` index in its order: each section by the page
renderer its spec names (a partial in templates/sections/ and a function of RANK_SECTIONS in
templates/js/runtime_sections.js), any other by the generic partial."""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memscope.events.sections import PRE_INDEX_SECTIONS, SectionLayout, SectionSpec
from memscope.reporters.html import render_runtime_html
from memscope.reporters.html_payload import (
    BUILTIN_RENDERERS,
    MAX_ROWS,
    PAGE_RENDERERS,
    page_sections,
    runtime_payload,
)
from memscope.reporters.log_report import LOG_PAGE_RENDERERS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cpu_pp2_demo"
NODE = shutil.which("node")
SECTION_ID = re.compile(r'<section class="(rank|generic)-section" id="section-([a-z0-9_]+)">')


def _example() -> dict:
    with open(EXAMPLE / "rank00000" / "runtime_report.json", encoding="utf-8") as f:
        return json.load(f)


def _page_order(html: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in SECTION_ID.finditer(html)]


def test_every_page_renderer_has_its_partial_and_every_partial_a_renderer():
    folder = importlib.resources.files("memscope.reporters") / "templates" / "sections"
    partials = {p.name.removesuffix(".html.j2") for p in folder.iterdir() if p.name.endswith(".j2")}
    assert partials - {"_generic"} == set(PAGE_RENDERERS | LOG_PAGE_RENDERERS)
    assert {s.renderer for s in PRE_INDEX_SECTIONS if s.renderer} == BUILTIN_RENDERERS
    assert len(BUILTIN_RENDERERS) == 9


def test_the_scripts_registry_has_the_built_in_renderers_and_only_page_renderers():
    if NODE is None:
        pytest.skip("no node binary: the registry is read by running the page's script")
    js = ROOT / "memscope" / "reporters" / "templates" / "js"
    files = ("format.js", "tables.js", "charts.js", "runtime_view.js", "runtime_sections.js")
    source = "\n".join((js / f).read_text(encoding="utf-8") for f in files)
    keys = "console.log(JSON.stringify(Object.keys(RANK_SECTIONS)));"
    script = f'"use strict";\nconst RULES = {{}};\n{source}\n{keys}'
    res = subprocess.run([NODE, "-e", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    scripted = set(json.loads(res.stdout))
    # every built-in renderer draws charts or tables; a new one may be its partial alone
    assert BUILTIN_RENDERERS <= scripted <= PAGE_RENDERERS


def test_the_example_page_draws_the_built_in_sections_in_the_index_order():
    report = _example()
    del report["sections"]  # as a report written before the index: the built-in sections, in order
    html = render_runtime_html(runtime_payload(report))
    shown = [s.name for s in PRE_INDEX_SECTIONS if s.layout is not SectionLayout.DATA]
    assert _page_order(html) == [("rank", name) for name in shown]
    # each built-in partial's own markup is there once, inside its section
    for name, marker in (
        ("peak", 'id="cards"'),
        ("steps", 'id="step-select"'),
        ("oom", 'id="oom"'),
    ):
        body = html.split(f'id="section-{name}">')[1].split("</section>")[0]
        assert marker in body and html.count(marker) == 1


def test_the_page_follows_a_reordered_index_and_draws_a_generic_section_where_it_stands():
    report = _example()
    toy = SectionSpec("toy_table", "Toy table", SectionLayout.TABLE)
    by_name = {s.name: s for s in PRE_INDEX_SECTIONS}
    index = [by_name["steps"], toy, by_name["peak"], by_name["step_compositions"]]
    report["sections"] = [s.to_dict() for s in index]
    report["toy_table"] = [{"what": "a", "n": 1}]
    payload = runtime_payload(report)
    assert [s["name"] for s in payload["sections"]] == [
        "steps",
        "toy_table",
        "peak",
    ]  # data: no page
    html = render_runtime_html(payload)
    assert _page_order(html) == [("rank", "steps"), ("generic", "toy_table"), ("rank", "peak")]
    assert 'id="section-top_events"' not in html and 'id="top"' not in html  # not in the index


def test_a_section_with_a_renderer_the_page_lacks_is_drawn_by_its_layout():
    report = _example()
    spec = SectionSpec("extra", "Extra", SectionLayout.KEY_VALUES, renderer="fancy_chart")
    report["sections"] = [spec.to_dict()]
    report["extra"] = {"bytes": 3}
    (entry,) = page_sections(report, MAX_ROWS)
    assert "renderer" not in entry and entry["rows"] == [["bytes", "3"]]


def test_a_new_page_renderer_gets_its_sections_value_and_the_built_in_ones_their_payload():
    report = _example()
    spec = SectionSpec("extra", "Extra", SectionLayout.CUSTOM, renderer="fancy_chart")
    report["sections"] = [by.to_dict() for by in PRE_INDEX_SECTIONS[:2]] + [spec.to_dict()]
    report["extra"] = {"points": [1, 2, 3]}
    entries = page_sections(report, MAX_ROWS, PAGE_RENDERERS | {"fancy_chart"})
    assert entries[-1] == {
        "name": "extra", "title": "Extra", "renderer": "fancy_chart", "value": {"points": [1, 2, 3]}
    }  # fmt: skip
    assert all("value" not in e for e in entries[:-1])  # oom, peak: runtime_payload lays them out
    # without the registration it is a custom section the page has no renderer of: a note
    plain = page_sections(report, MAX_ROWS)[-1]
    assert "renderer" not in plain and "value" not in plain and plain["rows"] == []
    assert plain["note"] == "No generic view of this section: the JSON report has it under extra."


def test_a_payload_made_by_hand_gets_the_built_in_sections():
    html = render_runtime_html(
        {"rank": 0, "world_size": 1, "grid": "", "job_page": "", "status": "complete"}
    )
    assert [name for _, name in _page_order(html)] == [
        s.name for s in PRE_INDEX_SECTIONS if s.layout is not SectionLayout.DATA
    ]


@pytest.mark.integration
def test_a_reordered_page_in_chromium_draws_its_charts_in_the_new_order(tmp_path):
    from test_html_browser import CHROMIUM, _page_dom

    if CHROMIUM is None:
        pytest.skip("no chromium binary (.ci/run installs Debian chromium)")
    report = _example()
    by_name = {s.name: s for s in PRE_INDEX_SECTIONS}
    order = ["steps", "comparisons", "top_events", "peak"]
    report["sections"] = [by_name[name].to_dict() for name in order]
    dom = _page_dom(tmp_path, render_runtime_html(runtime_payload(report)))
    headings = re.findall(r"<h2>([^<]+)</h2>", dom)
    assert headings == [
        "Step timeline", "GPU signals per step", "Within one step", "Static estimate vs runtime",
        "Top events", "Live at the peak", "Errors and warnings", "Metadata",
    ]  # fmt: skip
    steps = dom.split('id="section-steps"')[1].split("</section>")[0]
    assert steps.count('class="main-svg"') >= 2  # the step timeline and the within-step chart
    assert 'class="peak-row"' in dom and "Peak allocated" in dom  # top events, cards drawn


def test_a_built_in_renderer_draws_only_its_own_section_once():
    """The built-in renderers draw what runtime_payload laid out for their own section (fixed
    element ids): an index naming one for another section, or twice, gets the generic view."""
    report = _example()
    peak = next(s for s in PRE_INDEX_SECTIONS if s.name == "peak")
    other = SectionSpec("borrowed", "Borrowed", SectionLayout.KEY_VALUES, renderer="peak")
    report["sections"] = [peak.to_dict(), other.to_dict(), peak.to_dict()]
    report["borrowed"] = {"a": 1}
    entries = page_sections(report, MAX_ROWS)
    assert [(e["name"], e.get("renderer")) for e in entries] == [
        ("peak", "peak"), ("borrowed", None), ("peak", None)
    ]  # fmt: skip
    assert entries[1]["rows"] == [["a", "1"]]
    html = render_runtime_html(runtime_payload(report))
    assert html.count('id="cards"') == 1 and html.count('id="composition"') == 1
