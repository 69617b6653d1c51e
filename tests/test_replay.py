"""Offline replay: the analyzers rebuild a live report's sections from trace.jsonl alone."""

from __future__ import annotations

import json
import os

import pytest
from conftest import load_json

from memscope.analysis.base import replay
from memscope.analysis.runtime_sections import RUNTIME_SECTIONS, runtime_analyzers
from memscope.analysis.static_comparison import StaticEstimate
from memscope.cli import main
from memscope.events.trace_reader import read_trace

pytestmark = pytest.mark.integration


def test_replaying_the_trace_rebuilds_every_section_of_the_live_report(traced_run):
    _, report, outdir = traced_run
    header, events = read_trace(os.path.join(outdir, "rank00000", "trace.jsonl"))
    config = header.fields["config"]
    analyzers = runtime_analyzers(
        config["top_k"], StaticEstimate.from_dict(header.fields["static_estimate"])
    )
    sections = replay(events, analyzers)
    for key in RUNTIME_SECTIONS:
        assert json.loads(json.dumps(sections[key])) == report[key], key
    assert report["sections"] == sections.index()
    assert report["peak"]["attribution"] == "exact" and report["comparisons"]["status"] == "ok"


def test_memscope_analyze_writes_the_rebuilt_report(traced_run, tmp_path, capsys):
    _, report, outdir = traced_run
    out = tmp_path / "replayed.json"
    assert main(["analyze", "--trace", os.path.join(outdir, "rank00000"), "--out", str(out)]) == 0
    replayed = load_json(str(out))
    for key in ("peak", "top_events", "module_summary", "steps", "comparisons", "runtime_trace"):
        assert replayed[key] == report[key], key
    assert replayed["phase_summary"] == report["phase_summary"]
    assert replayed["rank"] == 0 and replayed["world_size"] == 1
    assert replayed["sections"] == report["sections"]
    for key in ("events_recorded", "events_in_report", "detail_steps", "max_events"):
        assert replayed["trace"][key] == report["trace"][key], key
    assert str(out) in capsys.readouterr().out


def test_a_torn_last_line_is_ignored_and_a_bad_trace_is_one_line_exit_2(tmp_path, capsys):
    good = tmp_path / "trace.jsonl"
    good.write_text('{"schema_version": "1.1", "header": {"rank": 0, "world_size": 1}}\n{"seq": 1')
    assert main(["analyze", "--trace", str(good), "--out", str(tmp_path / "r.json")]) == 0
    assert load_json(str(tmp_path / "r.json"))["trace"]["events_recorded"] == 0
    capsys.readouterr()
    for content, needle in [
        ("", "empty trace"),
        ('{"schema_version": "9.0", "header": {}}\n', "not supported"),
        ("not json\n", "not a trace header"),
        ('{"schema_version": "1.1", "header": {}}\n{"seq": 1}\n', "line 2 is not an event"),
    ]:
        good.write_text(content)
        assert main(["analyze", "--trace", str(good)]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err
    assert main(["analyze", "--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such trace file" in capsys.readouterr().err
