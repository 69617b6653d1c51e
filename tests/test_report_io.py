"""Units, markdown rendering, atomic writes and the report reader's error messages."""

import json
import os
from pathlib import Path

import pytest

from memscope.cli import main
from memscope.io.atomic import atomic_write_json, atomic_write_text
from memscope.io.report_reader import ReportError, load_report
from memscope.units import format_bytes, format_ratio


def test_format_bytes_keeps_signs_and_units():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(-3 * 1024**3) == "-3.00 GiB"
    assert format_bytes(2048, signed=True) == "+2.00 KiB"
    assert format_bytes(None) == "n/a"
    assert format_ratio(-0.0312) == "-3.1%"


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(str(path), {"a": 1})
    atomic_write_text(str(path), '{"a": 2}')
    assert json.loads(path.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["r.json"]


def test_atomic_write_failure_keeps_previous_content(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(str(path), {"ok": True})
    with pytest.raises(ValueError):
        atomic_write_json(str(path), {"bad": float("nan")})
    assert json.loads(path.read_text()) == {"ok": True}
    assert os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("", "empty"),
        ('{"schema_version": "1.0", "peak": {', "truncated JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"peak": {}}', "no schema_version"),
        ('{"schema_version": "2.0"}', "newer than this memscope"),
        ('{"schema_version": "x"}', "MAJOR.MINOR"),
        ('{"schema_version": "1.0", "report_type": "static"}', "expected 'runtime'"),
    ],
)
def test_reader_gives_one_readable_line(tmp_path, content, needle):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ReportError) as exc:
        load_report(str(path), expected_type="runtime")
    message = str(exc.value)
    assert needle in message and "\n" not in message


def test_atomic_write_respects_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "r.json"
        atomic_write_text(str(path), "{}")
        assert (path.stat().st_mode & 0o777) == 0o644
    finally:
        os.umask(old)


@pytest.mark.parametrize("command", ["summarize", "visualize-runtime", "diff"])
def test_a_report_with_only_its_version_and_type_is_refused_by_every_reader(
    tmp_path, capsys, command
):
    bare = tmp_path / "runtime_report.json"
    bare.write_text('{"schema_version": "1.1", "report_type": "runtime"}')
    argv = {
        "summarize": ["summarize", "--report", str(bare)],
        "visualize-runtime": ["visualize-runtime", "--report", str(bare)],
        "diff": ["diff", str(bare), str(bare), "--out", str(tmp_path / "d")],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a complete runtime report: no rank" in err
    assert not (tmp_path / "runtime_report.html").exists() and not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [("peak", None, "no peak"), ("steps", None, "no steps"),
     ("metadata", [], "metadata must be an object"), ("status", 3, "status must be a string"),
     ("steps", {}, "steps must be a list")],
)  # fmt: skip
def test_a_real_report_missing_or_mistyping_a_required_section_is_refused(
    tmp_path, section, value, message
):
    report = json.loads(
        (
            Path(__file__).parent.parent / "examples/cpu_pp2_demo/rank00000/runtime_report.json"
        ).read_text()
    )
    assert load_report_from(tmp_path, report)["peak"]  # the real one is fine
    if value is None:
        del report[section]
    else:
        report[section] = value
    with pytest.raises(ReportError, match=message):
        load_report_from(tmp_path, report)


def load_report_from(tmp_path, doc):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    return load_report(str(path), "runtime")
