"""The ``analyze-log`` report's typed sections: every declared section reaches the JSON index,
the Markdown and the page in index order, and a section registered by a test reaches all three
with no reporter edited."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

from memscope.analysis.log_sections import (
    BUILTIN_LOG_SECTIONS,
    LogSection,
    log_sections,
    register_log_section,
    unregister_log_section,
    verdict_text,
)
from memscope.cli import main
from memscope.events.sections import Column, ColumnKind, SectionLayout, SectionSpec
from memscope.reporters.html import render_log_html
from memscope.reporters.log_report import LOG_PAGE_RENDERERS, render_log_markdown
from memscope.reporters.section_views import column_value, section_view

DATA = pathlib.Path(__file__).parent / "data" / "logs"
OOM_LOG = DATA / "gpt2_774m_fp16_oom_v100.log"
TWO_STAGE_LOG = DATA / "gpt_56l_6144h_tp4_pp2_sp_rocm_after1.log"


def _outputs(tmp_path, log, capsys) -> tuple[dict, str, str]:
    rc = main(["analyze-log", str(log), "--outdir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 0, err
    doc = json.loads((tmp_path / "log_report.json").read_text())
    md = (tmp_path / "log_report.md").read_text()
    return doc, md, (tmp_path / "log_report.html").read_text()


def _headroom(measured: dict) -> int:
    return measured["max_reserved"] - measured["max_allocated"]


def _positions(text: str, needles: list[str]) -> list[int]:
    return [text.index(n) for n in needles]


@pytest.mark.parametrize("log", [OOM_LOG, TWO_STAGE_LOG], ids=["oom", "two_stages"])
def test_every_declared_section_is_in_json_markdown_and_html_in_index_order(tmp_path, capsys, log):
    doc, md, html = _outputs(tmp_path, log, capsys)
    declared = sorted((s.spec for s in log_sections()), key=lambda spec: spec.order)
    assert [e["name"] for e in doc["sections"]] == [spec.name for spec in declared]
    assert doc["sections"][0] == {"name": "configuration", "title": "Configuration",
                                  "layout": "key_values"}  # fmt: skip
    run = doc["runs"][0]
    assert all(spec.name in run for spec in declared)
    # every section with something to show, in the order of the index, in both outputs
    shown = [e for e in doc["sections"] if run[e["name"]] is not None]
    assert len(shown) >= 6
    md_titles = [f"### {e['title']}" for e in shown]
    assert _positions(md, md_titles) == sorted(_positions(md, md_titles))
    html_ids = [f'id="run0-section-{e["name"]}"' for e in shown]
    assert _positions(html, html_ids) == sorted(_positions(html, html_ids))
    # the chart section is drawn by its renderer on the page, as its table in the Markdown
    assert 'id="run0-stages-chart"' in html
    header = "| stage | rank | after iteration | measured | predicted | verdict |"
    assert (header in md) == bool(run["stages"])


def test_the_two_stage_run_reads_the_same_figures_through_its_sections(tmp_path, capsys):
    doc, _md, _ = _outputs(tmp_path, TWO_STAGE_LOG, capsys)
    run = doc["runs"][0]
    stage1 = run["stages"][1]
    rank4 = next(r for r in run["ranks"] if r["rank"] == 4)
    assert stage1["rank"] == 4 and rank4["place"] == "tp0 cp0 ep0 dp0 pp1"
    assert stage1["measured_max_allocated_bytes"] == rank4["measured"]["max_allocated"]
    verdict4 = next(v for v in run["verdicts"] if v["rank"] == 4)
    assert verdict4["max_allocated"] == verdict_text(rank4["verdict"])
    assert verdict4["allocated"].startswith("within")  # the allocated figure matches (docs)
    terms = run["estimate_terms"]
    assert {t["term"] for t in terms} == set(run["ranks"][0]["estimate"]["terms"])


def test_a_toy_section_reaches_all_three_outputs_with_no_reporter_edit(tmp_path, capsys):
    toy = LogSection(
        SectionSpec("toy_headroom", "Toy: reserved above max allocated", SectionLayout.TABLE,
                    columns=(Column("rank", "rank"),
                             Column("headroom", "headroom", ColumnKind.BYTES)),
                    order=25),
        lambda run: [
            {"rank": r["rank"], "headroom": _headroom(r["measured"])} for r in run["ranks"]
        ] or None,
    )  # fmt: skip
    register_log_section(toy)
    try:
        doc, md, html = _outputs(tmp_path, TWO_STAGE_LOG, capsys)
    finally:
        unregister_log_section("toy_headroom")
    names = [e["name"] for e in doc["sections"]]
    assert names.index("stages") < names.index("toy_headroom") < names.index("ranks")
    row = doc["runs"][0]["toy_headroom"][0]
    rank0 = doc["runs"][0]["ranks"][0]["measured"]
    assert row == {"rank": 0, "headroom": _headroom(rank0)}
    assert "### Toy: reserved above max allocated" in md
    assert "| 0 | 16.74 GiB |" in md  # 88.76 GiB reserved - 72.02 GiB max allocated
    page = html[html.index('id="run0-section-toy_headroom"') :]
    assert "Toy: reserved above max allocated" in page and ">16.74 GiB<" in page
    assert "toy_headroom" not in [s.spec.name for s in log_sections()]


def test_registering_a_section_twice_or_removing_a_built_in_one_is_refused():
    with pytest.raises(ValueError, match="already has a section 'ranks'"):
        register_log_section(BUILTIN_LOG_SECTIONS[0].__class__(
            SectionSpec("ranks", "again", SectionLayout.TABLE), lambda run: None))  # fmt: skip
    with pytest.raises(ValueError, match="built-in"):
        unregister_log_section("ranks")


def test_a_document_without_an_index_still_renders_its_runs():
    doc = {"logs": ["old.log"], "runs": [{"index": 0, "stages": [], "ooms": []}]}
    assert "## Run 1" in render_log_markdown(doc)
    assert "Run 1" in render_log_html(doc)


def test_verdict_text_says_the_band_or_the_gap_and_the_terms_too_small():
    assert verdict_text(None) == "not estimated"
    assert verdict_text({"status": "within_band", "band": 0.05}) == "within ±5.0%"
    gap = {"status": "below", "error_bytes": -(2**20), "error_ratio": -0.1,
           "cannot_explain": ["fp8"]}  # fmt: skip
    assert verdict_text(gap) == "below by -1.00 MiB (-10.0%); too small alone: fp8"


def test_generic_columns_read_nested_values_and_an_empty_table_says_none():
    row = {"measured": {"max_allocated": 3 * 2**20}, "a.b": 1}
    assert column_value(row, "measured.max_allocated") == 3 * 2**20
    assert column_value(row, "a.b") == 1 and column_value(row, "measured.x.y") is None
    column = Column("measured.max_allocated", "max", ColumnKind.BYTES)
    spec = SectionSpec("t", "T", SectionLayout.TABLE, columns=(column,))
    view = section_view(spec, [row], 10)
    assert view is not None and view.rows == [["3.00 MiB"]]
    empty = section_view(spec, [], 10)
    assert empty is not None and empty.rows == [] and empty.headers == [] and empty.note == "None."


@pytest.mark.skipif(shutil.which("node") is None, reason="no node binary")
def test_the_log_pages_script_registry_is_the_log_page_renderers():
    """Every renderer the log page names has its function in ``LOG_SECTIONS``, and only those."""
    js = pathlib.Path(__file__).parent.parent / "memscope" / "reporters" / "templates" / "js"
    page = (js / "log_page.js").read_text(encoding="utf-8")
    assert page.rstrip().endswith("showLogPage(DATA);")
    source = page.rstrip().removesuffix("showLogPage(DATA);")
    script = f'"use strict";\n{source}\nconsole.log(JSON.stringify(Object.keys(LOG_SECTIONS)));'
    node = shutil.which("node")
    assert node is not None
    res = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert set(json.loads(res.stdout)) == set(LOG_PAGE_RENDERERS)


def test_each_run_of_a_two_run_log_has_its_own_sections_and_only_the_first_is_shown(
    tmp_path, capsys
):
    doc, md, html = _outputs(tmp_path, DATA / "gpt2_345m_tp4_fp16_two_runs.log", capsys)
    assert len(doc["runs"]) == 2
    assert '<div class="log-run" id="run-0">' in html
    assert '<div class="log-run" id="run-1" hidden>' in html
    for i in (0, 1):
        assert html.count(f'id="run{i}-section-ranks"') == 1
        assert html.count(f'id="run{i}-stages-chart"') == 1
    assert md.index("## Run 1") < md.index("## Run 2")
    assert md.count("### Ranks that printed memory: measured vs estimate") == 2
