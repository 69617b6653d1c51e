"""Typed report sections: a new analysis is one class plus its registration, and its sections
reach the JSON, the Markdown and the HTML page without an edit to any reporter."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from memscope.analysis.base import build_sections
from memscope.analysis.runtime_sections import (
    AnalyzerSettings,
    register_analyzer,
    unregister_analyzer,
)
from memscope.cli import main
from memscope.events.schema import MemoryEvent
from memscope.events.sections import (
    PRE_INDEX_SECTIONS,
    Column,
    ColumnKind,
    SectionLayout,
    SectionSet,
    SectionSpec,
    report_sections,
)
from memscope.events.trace_reader import read_trace
from memscope.integrations.torch import MemScopeTorchRuntime
from memscope.reporters.markdown import render_runtime_markdown
from memscope.reporters.runtime_json import RuntimeReportInputs, build_runtime_report

EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "cpu_pp2_demo"
)


class EventTypeAnalyzer:
    """A toy analysis: events per type and the most allocated after one of them, plus totals
    (a table and a key/value section, both drawn by the generic renderers)."""

    section_specs = (
        SectionSpec(
            "event_types",
            "Events by type",
            SectionLayout.TABLE,
            columns=(
                Column("event_type", "event type", ColumnKind.CODE),
                Column("count", "events"),
                Column("highest_after", "most allocated after", ColumnKind.BYTES),
            ),
        ),
        SectionSpec("event_totals", "Event totals", SectionLayout.KEY_VALUES),
    )

    def __init__(self, settings: AnalyzerSettings) -> None:
        self.top_k = settings.top_k
        self.counts: Counter[str] = Counter()
        self.highest: dict[str, int] = {}

    def consume(self, event: MemoryEvent) -> None:
        self.counts[event.event_type] += 1
        after = self.highest.get(event.event_type, 0)
        self.highest[event.event_type] = max(after, event.mem_allocated_after)

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        rows = [
            {"event_type": name, "count": n, "highest_after": self.highest[name]}
            for name, n in self.counts.most_common(self.top_k)
        ]
        totals = {"events": sum(self.counts.values()), "peak_step": prior["peak"]["step"]}
        return {"event_types": rows, "event_totals": totals}


@pytest.fixture
def toy_analyzer():
    register_analyzer("event_types", EventTypeAnalyzer)
    try:
        yield
    finally:
        unregister_analyzer("event_types")


def _traced_loop(outdir: str) -> str:
    """A real traced torch loop (storage backend); returns its rank folder."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemScopeTorchRuntime(model, opt, outdir=outdir, backend="storage") as ms:
        for step in range(2):
            with ms.step(step):
                model(torch.randn(4, 8)).sum().backward()
                with ms.optimizer_step():
                    opt.step()
    return os.path.join(outdir, "rank00000")


def test_a_registered_analyzer_reaches_the_json_the_markdown_and_the_page(
    toy_analyzer, tmp_path, capsys
):
    rank_dir = _traced_loop(str(tmp_path))
    with open(os.path.join(rank_dir, "runtime_report.json")) as f:
        report = json.load(f)
    # the JSON: the section under its name, counted from the events the trace holds
    _, events = read_trace(os.path.join(rank_dir, "trace.jsonl"))
    counts = Counter(e.event_type for e in events)
    assert {r["event_type"]: r["count"] for r in report["event_types"]} == counts
    assert report["event_totals"] == {"events": sum(counts.values()), "peak_step": 1}
    index = {entry["name"]: entry for entry in report["sections"]}
    assert index["event_types"]["layout"] == "table" and index["event_totals"] == {
        "name": "event_totals", "title": "Event totals", "layout": "key_values"
    }  # fmt: skip
    assert [s.name for s in report_sections(report)][-2:] == ["event_types", "event_totals"]
    # the Markdown the session wrote beside it
    with open(os.path.join(rank_dir, "runtime_report.md")) as f:
        md = f.read()
    top = report["event_types"][0]
    assert "## Events by type" in md and "| event type | events | most allocated after |" in md
    assert f"| `{top['event_type']}` | {top['count']} |" in md
    assert f"- events: {sum(counts.values())}" in md and "## Event totals" in md
    # the page `memscope visualize-runtime` builds from the JSON alone
    assert main(["visualize-runtime", "--report", rank_dir]) == 0, capsys.readouterr().err
    with open(os.path.join(rank_dir, "runtime_report.html")) as f:
        page = f.read()
    start = '<section class="generic-section" id="section-event_types">'
    section = re.search(re.escape(start) + "(.*?)</section>", page, re.S)
    assert section and "<h2>Events by type</h2>" in section.group(1)
    assert f"<td><code>{top['event_type']}</code></td><td>{top['count']}</td>" in section.group(1)
    assert 'id="section-event_totals"' in page
    # and `memscope analyze` rebuilds it from the trace
    out = tmp_path / "replayed.json"
    assert main(["analyze", "--trace", rank_dir, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["event_types"] == report["event_types"]


def test_without_the_registration_the_section_is_gone(tmp_path):
    report_path = os.path.join(_traced_loop(str(tmp_path)), "runtime_report.json")
    with open(report_path) as f:
        report = json.load(f)
    assert "event_types" not in report
    assert "event_types" not in {s["name"] for s in report["sections"]}


class _Undeclared:
    section_specs = (SectionSpec("declared", "Declared", SectionLayout.KEY_VALUES),)

    def consume(self, event: MemoryEvent) -> None:
        pass

    def sections(self, prior: Mapping[str, Any]) -> dict[str, Any]:
        return {"undeclared": {}}


def test_a_section_made_but_not_declared_is_refused():
    with pytest.raises(ValueError, match="declares"):
        build_sections([_Undeclared()])


def test_a_section_may_not_take_a_report_key_or_another_sections_name():
    spec = SectionSpec("metadata", "Metadata", SectionLayout.KEY_VALUES)
    from memscope.events.sections import Section

    with pytest.raises(ValueError, match="report keys"):
        build_runtime_report(
            RuntimeReportInputs({}, "complete", SectionSet([Section(spec, {})]), [], {})
        )
    with pytest.raises(ValueError, match="two analyzers"):
        SectionSet([Section(spec, 1), Section(spec, 2)])
    with pytest.raises(ValueError, match="already registered"):
        register_analyzer("peak", EventTypeAnalyzer)


def test_a_report_written_before_the_index_renders_as_before():
    with open(os.path.join(EXAMPLE, "rank00000", "runtime_report.json")) as f:
        report = json.load(f)
    del report["sections"]  # as a report written before the index
    assert report_sections(report) == list(PRE_INDEX_SECTIONS)
    indexed = {**report, "sections": [s.to_dict() for s in PRE_INDEX_SECTIONS]}
    assert render_runtime_markdown(indexed) == render_runtime_markdown(report)


def test_a_bad_index_is_one_line_exit_2(tmp_path, capsys):
    with open(os.path.join(EXAMPLE, "rank00000", "runtime_report.json")) as f:
        report = json.load(f)
    report["sections"] = [{"name": "Not A Name", "title": "x", "layout": "table"}]
    path = tmp_path / "runtime_report.json"
    path.write_text(json.dumps(report))
    assert main(["visualize-runtime", "--report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "sections[0]" in err and len(err.splitlines()) == 1, err


def test_a_hostile_section_index_stays_text_on_the_page_and_in_the_markdown():
    from memscope.reporters.html import render_runtime_html
    from memscope.reporters.html_payload import runtime_payload

    with open(os.path.join(EXAMPLE, "rank00000", "runtime_report.json")) as f:
        report = json.load(f)
    evil = "<img src=x onerror=alert(1)>"
    report["sections"] = [
        {"name": "evil", "title": evil, "layout": "table",
         "columns": [{"key": "m", "title": evil, "kind": "code"}]},
    ]  # fmt: skip
    report["evil"] = [{"m": evil}, {"m": "`x` | y"}]
    page = render_runtime_html(runtime_payload(report))
    assert evil not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    md = render_runtime_markdown(report)
    assert "## \\<img src=x onerror=alert(1)\\>" in md  # title and header escaped
    assert md.count(evil) == 1 and f"| `{evil}` |" in md  # only inside a code span
    assert "| `` `x` \\| y `` |" in md  # a code span longer than its backticks; the pipe escaped


def test_a_replay_takes_the_settings_the_trace_names_and_runtime_configs_defaults_for_others():
    from memscope.config import RuntimeConfig
    from memscope.report.builder import ReportSettings

    defaults = RuntimeConfig()
    assert ReportSettings.from_header({}) == ReportSettings(
        defaults.top_k, defaults.detail_steps, defaults.max_trace_events
    )
    assert ReportSettings.from_header({"top_k": 3}).top_k == 3
    for bad in ({"top_k": 0}, {"detail_steps": True}, {"max_trace_events": 10**9}):
        with pytest.raises(ValueError, match="must be an integer"):
            ReportSettings.from_header(bad)


def test_a_trace_header_with_a_setting_out_of_bounds_is_one_line_exit_2(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"schema_version": "1.1", "header": {"config": {"top_k": -1}}}\n')
    assert main(["analyze", "--trace", str(trace), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "malformed trace header" in err and "config.top_k" in err and "\n" not in err


@pytest.mark.integration
def test_a_generic_section_is_in_the_page_chromium_builds_and_the_charts_still_draw(tmp_path):
    from test_html_browser import CHROMIUM, _page_dom

    from memscope.reporters.html import render_runtime_html
    from memscope.reporters.html_payload import runtime_payload

    if CHROMIUM is None:
        pytest.skip("no chromium binary (.ci/run installs Debian chromium)")
    with open(os.path.join(EXAMPLE, "rank00000", "runtime_report.json")) as f:
        report = json.load(f)
    spec = EventTypeAnalyzer.section_specs[0]
    report["sections"] = [s.to_dict() for s in PRE_INDEX_SECTIONS] + [spec.to_dict()]
    report["event_types"] = [{"event_type": "module_forward", "count": 7, "highest_after": 3072}]
    dom = _page_dom(tmp_path, render_runtime_html(runtime_payload(report)))
    section = dom.split('id="section-event_types"')[1].split("</section>")[0]
    assert "<h2>Events by type</h2>" in section and '<td class="n">3.00 KiB</td>' in section
    assert "Peak allocated" in dom and dom.count('class="main-svg"') >= 2  # the script ran
