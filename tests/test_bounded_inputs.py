"""Hostile inputs and outputs, one regression test per case (docs/guarantees.md, "Bad input"
and "Outputs"): the CLI reads only regular files within bounds, writes only regular files
that are not its own inputs, and escapes what it prints. In-process through
``memscope.cli.main``; the example report stands in for a real run (no training here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

import pytest

from memscope.analysis.job import RankEntry, summarize_job
from memscope.cli import main
from memscope.events.schema import SCHEMA_VERSION
from memscope.events.trace_reader import TraceError, read_trace
from memscope.io.atomic import atomic_write_text
from memscope.io.report_reader import load_report
from memscope.io.safe_output import OutputRefused
from memscope.reporters.html import render_job_html, render_runtime_html
from memscope.reporters.html_payload import job_payload, runtime_payload
from memscope.reporters.markdown import render_runtime_markdown
from memscope.units import format_bytes, format_ratio, printable

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"
REPORT = EXAMPLE / "rank00000" / "runtime_report.json"
LINK = '<a href="javascript:alert(1)">click</a>'
CONTROL = "evil\x1b[2J\r\nname\u202e\x07"


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(REPORT.read_text())


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    res = capsys.readouterr()
    return rc, res.out, res.err


def _one_error_line(rc: int, out: str, err: str, needle: str = "") -> str:
    assert rc == 2 and out == "", (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    return lines[0]


def _write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _trace(tmp_path: Path, report: dict, name: str = "trace.jsonl") -> Path:
    """A trace.jsonl made of the example report's events."""
    header = {"schema_version": SCHEMA_VERSION, "header": {"rank": 0, "world_size": 2,
              "config": {"top_k": 20, "detail_steps": 2, "max_trace_events": 200_000}}}  # fmt: skip
    lines = [json.dumps(header)] + [json.dumps(e) for e in report["runtime_trace"]]
    return _write(tmp_path / name, "\n".join(lines) + "\n")


# ---------------------------------------------------------------- inputs: not regular files


@pytest.mark.parametrize("command", ["summarize", "visualize-runtime"])
def test_dev_zero_report_ends_at_once_with_exit_2(capsys, command):
    t0 = time.perf_counter()
    line = _one_error_line(*_cli(capsys, command, "--report", "/dev/zero"), "/dev/zero")
    assert "character device" in line and time.perf_counter() - t0 < 5


@pytest.mark.parametrize("command", ["summarize", "visualize-runtime"])
def test_fifo_report_is_refused_without_blocking(tmp_path, capsys, command):
    fifo = tmp_path / "runtime_report.json"
    os.mkfifo(fifo)
    _one_error_line(*_cli(capsys, command, "--report", str(fifo)), "is a FIFO")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_fifo_or_device_trace_is_refused(tmp_path, capsys):
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    out = str(tmp_path / "r.json")
    _one_error_line(*_cli(capsys, "analyze", "--trace", str(fifo), "--out", out), "FIFO")
    _one_error_line(*_cli(capsys, "analyze", "--trace", "/dev/zero", "--out", out), "device")
    with pytest.raises(TraceError, match="FIFO"):
        read_trace(str(fifo))


def test_report_over_the_size_cap_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMSCOPE_MAX_REPORT_BYTES", "1000")
    line = _one_error_line(*_cli(capsys, "summarize", "--report", str(REPORT)), "allowed")
    assert "1000" in line
    monkeypatch.setenv("MEMSCOPE_MAX_REPORT_BYTES", "not a number")  # ignored: the default
    assert main(["summarize", "--report", str(REPORT)]) == 0


def test_trace_line_over_the_cap_is_refused(tmp_path, report):
    path = _trace(tmp_path, report)
    with pytest.raises(TraceError, match="longer than 100 bytes"):
        read_trace(str(path), max_line_bytes=100)
    header = path.read_text().splitlines()[0]
    path.write_text(header + "\n" + "1" * 5000 + "\n")
    _, events = read_trace(str(path), max_line_bytes=len(header) + 1)
    with pytest.raises(TraceError, match="line 2 is longer"):
        list(events)


# ---------------------------------------------------------------- inputs: JSON out of bounds


@pytest.mark.parametrize(
    ("value", "needle"),
    [("NaN", "non-finite"), ("Infinity", "non-finite"), ("-Infinity", "non-finite"),
     ("1e400", "not finite"), ("1" + "0" * 30, "beyond"), ("9" * 5000, "5000 digits"),
     ("-9223372036854775809", "beyond")],
)  # fmt: skip
def test_non_finite_and_huge_numbers_are_refused(tmp_path, capsys, value, needle):
    text = REPORT.read_text().replace('"memory_bytes":', f'"memory_bytes":{value},"x":', 1)
    path = _write(tmp_path / "runtime_report.json", text)
    for command in ("summarize", "visualize-runtime"):
        line = _one_error_line(*_cli(capsys, command, "--report", str(path)), needle)
        assert "inf" not in line.lower().replace("infinity", "") and "nan%" not in line
    assert not list(tmp_path.glob("*.html"))


@pytest.mark.parametrize(
    ("change", "needle"),
    [({"world_size": -1}, "world_size must be"), ({"rank": 5, "world_size": 2}, "not below"),
     ({"peak": {"memory_bytes": -5}}, "peak.memory_bytes"), ({"rank": True}, "rank must be"),
     ({"schema_version": ["1"] * 100_000}, "MAJOR.MINOR")],
)  # fmt: skip
def test_insane_rank_world_size_and_peak_are_refused(tmp_path, capsys, report, change, needle):
    path = _write(tmp_path / "r.json", dict(report, **change))
    _one_error_line(*_cli(capsys, "summarize", "--report", str(path)), needle)


def test_nesting_bomb_is_refused_not_a_recursion_error(tmp_path, capsys):
    for depth in (100_000, 65):
        path = _write(tmp_path / f"bomb{depth}.json", "[" * depth + "]" * depth)
        _one_error_line(*_cli(capsys, "summarize", "--report", str(path)), "nested more than 64")
    doc = {"schema_version": "1.0", "report_type": "runtime", "metadata": {"a": [[[[[[[]]]]]]]},
           "rank": 0, "world_size": 1, "status": "complete", "peak": {}, "steps": []}  # fmt: skip
    ok = _write(tmp_path / "ok.json", doc)
    assert load_report(str(ok))["metadata"]["a"] == [[[[[[[]]]]]]]


def test_units_never_print_non_finite_or_absurd_numbers():
    for bad in (float("nan"), float("inf"), -float("inf"), 2**63, -(2**70), 1e300, "12", True):
        assert format_bytes(bad) == "invalid", bad  # type: ignore[arg-type]
        assert format_ratio(bad) == "invalid", bad  # type: ignore[arg-type]
    assert format_bytes(2**63 - 1).endswith("PiB") and format_bytes(None) == "n/a"
    assert format_ratio(None) == "n/a" and format_ratio(0.5) == "+50.0%"


# ---------------------------------------------------------------- inputs: a job directory


def test_absurd_rank_folder_and_world_size_claim_stay_compact(tmp_path, capsys, report):
    job = tmp_path / "job"
    _write(job / "rank00000" / "runtime_report.json", dict(report, rank=0, world_size=10**12))
    _write(job / "rank99999999999" / "runtime_report.json", "{")
    (job / "rank99999999999999999999").mkdir()  # beyond 15 digits: not a rank folder
    t0 = time.perf_counter()
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job))
    assert rc == 0, err
    assert time.perf_counter() - t0 < 30
    html = (job / "job_report.html").read_text()
    data = json.loads(html.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    rows = data["ranks"]
    assert len(rows) == 4 and data["world_size"] == 10**12
    assert [r["rank"] for r in rows] == [0, 1, 99999999999, 100000000000]
    assert rows[1]["last_rank"] == 99999999998 and rows[1]["count"] == 99999999998
    assert "truncated JSON" in rows[2]["problem"]
    assert rows[3]["last_rank"] == 10**12 - 1
    assert data["missing"] == 10**12 - 1


def test_job_summary_rows_are_bounded_by_the_entries_not_the_claims(report):
    entries = [RankEntry(r, dict(report, rank=r, world_size=2**62)) for r in (0, 5, 9)]
    entries.append(RankEntry(5, None, "duplicate: ignored"))
    summary = summarize_job(entries)
    ranks = [(r["rank"], r.get("last_rank"), r["status"]) for r in summary["ranks"]]
    assert ranks == [
        (0, None, "complete"), (1, 4, "missing"), (5, None, "complete"),
        (6, 8, "missing"), (9, None, "complete"), (10, 2**62 - 1, "missing"),
    ]  # fmt: skip
    assert summary["missing"] == 4 + 3 + (2**62 - 10)
    render_job_html(job_payload(summary, {}))  # the page takes ranges too


def test_a_fifo_rank_report_is_listed_with_its_reason(tmp_path, capsys, report):
    job = tmp_path / "job"
    _write(job / "rank00000" / "runtime_report.json", dict(report, world_size=2))
    (job / "rank00001").mkdir()
    os.mkfifo(job / "rank00001" / "runtime_report.json")
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(job))
    assert rc == 0, err
    html = (job / "job_report.html").read_text()
    data = json.loads(html.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    assert data["ranks"][1]["status"] == "missing" and "FIFO" in data["ranks"][1]["problem"]


# ---------------------------------------------------------------- outputs


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink-to-fifo", "dangling-symlink"])
def test_out_that_is_not_a_regular_file_is_refused_and_left_alone(tmp_path, capsys, kind):
    target = tmp_path / "out.html"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dir":
        target.mkdir()
    else:
        real = tmp_path / "real"
        if kind == "symlink-to-fifo":
            os.mkfifo(real)
        target.symlink_to(real)
    before = os.lstat(target)
    line = _one_error_line(
        *_cli(capsys, "visualize-runtime", "--report", str(REPORT), "--out", str(target))
    )
    assert "refusing" in line
    after = os.lstat(target)
    assert (before.st_mode, before.st_ino) == (after.st_mode, after.st_ino)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")) == []


def test_device_out_is_refused_for_every_writer(tmp_path, capsys, report):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    job = tmp_path / "job"
    _write(job / "rank00000" / "runtime_report.json", report)
    trace = _trace(tmp_path, report)
    cases = [
        ["visualize-runtime", "--report", str(REPORT), "--out", "/dev/null"],
        ["visualize-runtime", "--report", str(job), "--out", str(fifo)],
        ["analyze", "--trace", str(trace), "--out", str(fifo)],
        ["analyze", "--trace", str(trace), "--out", "/dev/full"],
    ]
    for argv in cases:
        _one_error_line(*_cli(capsys, *argv), "not a regular file")
    with pytest.raises(OutputRefused):
        atomic_write_text(str(fifo), "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_analyze_static_outdir_with_a_fifo_report_is_refused(tmp_path, capsys):
    config = EXAMPLE.parent.parent / "configs" / "static" / "llama3_8b_tp4_pp2.json"
    os.mkfifo(tmp_path / "static_report.md")
    argv = ["analyze-static", "--config", str(config), "--outdir", str(tmp_path)]
    _one_error_line(*_cli(capsys, *argv), "static_report.md: is a FIFO")
    assert not (tmp_path / "static_report.json").exists()


def test_out_equal_to_the_input_is_refused(tmp_path, capsys, report):
    src = tmp_path / "runtime_report.json"
    shutil.copy(REPORT, src)
    original = src.read_bytes()
    os.link(src, tmp_path / "hardlink.json")
    (tmp_path / "sub").mkdir()
    for out in (str(src), str(tmp_path / "sub" / ".." / "runtime_report.json"),
                str(tmp_path / "hardlink.json")):  # fmt: skip
        line = _one_error_line(
            *_cli(capsys, "visualize-runtime", "--report", str(src), "--out", out), "the input"
        )
        assert "refusing to overwrite" in line
    page_named_input = tmp_path / "report.html"  # its default page would be itself
    shutil.copy(REPORT, page_named_input)
    _one_error_line(*_cli(capsys, "visualize-runtime", "--report", str(page_named_input)), "input")
    job = tmp_path / "job"
    _write(job / "rank00000" / "runtime_report.json", report)
    job_report = str(job / "rank00000" / "runtime_report.json")
    _one_error_line(*_cli(capsys, "visualize-runtime", "--report", str(job), "--out", job_report))
    trace = _trace(tmp_path, report)
    trace_text = trace.read_text()
    _one_error_line(*_cli(capsys, "analyze", "--trace", str(trace), "--out", str(trace)), "input")
    assert src.read_bytes() == original and trace.read_text() == trace_text
    assert page_named_input.read_bytes() == original


def test_symlink_to_a_regular_file_is_written_through(tmp_path, capsys):
    real = tmp_path / "real.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(REPORT), "--out", str(link))
    assert rc == 0, err
    assert link.is_symlink() and real.stat().st_size > 100_000


# ---------------------------------------------------------------- names: escaped, never markup


def _hostile(report: dict) -> dict:
    evil = json.loads(json.dumps(report))
    evil["peak"]["module"] = CONTROL + LINK
    evil["top_events"][0]["module"] = "`x`" + LINK
    evil["module_summary"][0]["module"] = CONTROL
    evil["status"], evil["status_reason"] = "crashed", LINK + "\ud800" + CONTROL
    for e in evil["runtime_trace"]:
        if e["event_type"] != "step_phase":
            e["module"], e["phase"] = LINK, "<b>" + CONTROL
    return evil


def test_control_chars_and_links_in_names_are_escaped_in_terminal_and_markdown(
    tmp_path, capsys, report
):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_hostile(report)))  # ensure_ascii: the lone surrogate is \ud800
    rc, out, err = _cli(capsys, "summarize", "--report", str(path))
    assert rc == 0, err
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f\u202e\ud800]", out)
    assert "\\x1b" in out and "\\ud800" in out
    status = next(line for line in out.splitlines() if line.startswith("- status:"))
    assert "\\<a href" in status and not re.search(r"(?<!\\)<", status)  # text: no raw <
    outside_code = re.sub(r"(`+).*?\1", "", out)  # a code span shows its content literally
    assert not re.search(r"(?<!\\)<", outside_code)
    markdown = render_runtime_markdown(_hostile(report))
    assert "`` `x`<a href" in markdown  # a code span holds the backticks literally
    assert printable("a\nb\x1b\u2028") == "a\\x0ab\\x1b\\u2028"


def test_hostile_names_reach_html_only_as_escaped_text(tmp_path, capsys, report):
    evil = _hostile(report)
    html = render_runtime_html(runtime_payload(evil))
    assert LINK not in html and "\ud800" not in html and "\x1b" not in html
    assert "&lt;a href=&#34;javascript:alert(1)&#34;&gt;click&lt;/a&gt;\\ud800" in html  # banner
    path = tmp_path / "r.json"
    path.write_text(json.dumps(evil))
    rc, _, err = _cli(capsys, "visualize-runtime", "--report", str(path))
    assert rc == 0, err
    page = (tmp_path / "r.html").read_text()
    data = json.loads(page.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    assert data["peak"]["module"] == CONTROL + LINK  # the data itself is kept as it is


TEMPLATES = Path(__file__).resolve().parent.parent / "memscope" / "reporters" / "templates"


def test_every_data_string_handed_to_plotly_goes_through_plotly_text():
    for template in TEMPLATES.glob("*.j2"):
        code = template.read_text()
        assert "innerHTML" not in code and "outerHTML" not in code, template.name
        for m in re.finditer(r"\b(name|text|x|y|tickvals|ticktext|annotations):\s*([^,}]+)", code):
            key, value = m.group(1), m.group(2).strip()
            if key == "y":
                assert value.startswith(("mib(", "plotlyValues(")), (template.name, m.group(0))
            elif key == "x":
                assert value.startswith("plotlyValues("), (template.name, m.group(0))
            elif key in ("name", "text") and value not in ("xTitle",) and value[0] not in '{"':
                assert value.startswith(
                    ("plotlyText(", "hover(", "plotlyMatrix(", "idx.map(j => plotlyText(")
                ), (
                    template.name,
                    m.group(0),
                )
