"""Property-based fuzzing of every torch-free reader and CLI entry point (docs/guarantees.md,
"Bad input"): arbitrary bytes, arbitrary JSON documents and mutated copies of a real report
or trace give exit code 0 or 2, never a traceback or a hang, and on exit 2 exactly one line
on stderr. Derandomized and database-free so CI sees the same examples every run; bounded so
the whole file takes well under a minute on a busy 2-core machine."""

from __future__ import annotations

import copy
import json
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memscope.cli import main
from memscope.events.schema import SCHEMA_VERSION
from memscope.events.trace_reader import TraceError, read_trace
from memscope.io.report_reader import ReportError, load_report

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"
REAL = json.loads((EXAMPLE / "rank00000" / "runtime_report.json").read_text())
REAL["runtime_trace"] = REAL["runtime_trace"][:300]  # smaller pages, same shapes

FUZZ = settings(
    max_examples=25,
    deadline=timedelta(seconds=30),  # a hang fails the test instead of stalling CI
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Strings that have broken things before: control characters, lone surrogates, markup.
NASTY = st.sampled_from(
    ["", "\x00", "\x1b[2J", "\r\n", "\ud800", "\u202e", "<a href='x'>y</a>", "<br>", "&amp;",
     "`", "|", "NaN", "1e400", "rank99999999999", "../../etc/passwd"]
)  # fmt: skip
TEXT = st.one_of(NASTY, st.text(max_size=12))
NUMBERS = st.one_of(
    st.integers(),  # beyond +-2**63 too
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**63, -(2**63) - 1, 10**12, 10**400]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
REPORT_KEYS = sorted(REAL)


def _dump(doc: Any) -> str:
    """JSON text the way a careless writer would make it: NaN/Infinity tokens and huge
    integers kept (the readers must refuse them)."""
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return json.dumps(doc, allow_nan=True)
    finally:
        sys.set_int_max_str_digits(old)


def _check(capsys: pytest.CaptureFixture[str], argv: list[str]) -> int:
    """Run the CLI in-process: exit code 0 or 2, and on 2 one line on stderr, nothing on stdout."""
    rc = main(argv)
    res = capsys.readouterr()
    assert "Traceback" not in res.err
    assert rc in (0, 2), (rc, res.err[-2000:])
    if rc == 2:
        assert res.out == "" and len(res.err.strip().splitlines()) == 1, res.err
    return rc


@st.composite
def mutated_reports(draw: st.DrawFn) -> dict[str, Any]:
    """The real report with a few values deep inside replaced or deleted."""
    doc = copy.deepcopy(REAL)
    for _ in range(draw(st.integers(1, 3))):
        parent: Any = doc
        key: Any = draw(st.sampled_from(REPORT_KEYS))
        while draw(st.booleans()):
            child = parent[key] if isinstance(parent, dict) and key in parent else None
            if isinstance(child, dict) and child:
                parent, key = child, draw(st.sampled_from(sorted(child)))
            elif isinstance(child, list) and child:
                parent, key = child, draw(st.integers(0, len(child) - 1))
            else:
                break
        if isinstance(parent, dict) and draw(st.integers(0, 4)) == 0:
            parent.pop(key, None)
        else:
            parent[key] = draw(JSONISH)
    return doc


def _runtime_doc(extra: dict[str, Any]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "report_type": "runtime", **extra}


ARBITRARY_DOCS = st.one_of(
    JSONISH,
    st.dictionaries(st.sampled_from(REPORT_KEYS), JSONISH, max_size=6).map(_runtime_doc),
)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_to_the_report_reader_and_commands(tmp_path, capsys, raw):
    path = tmp_path / "runtime_report.json"
    path.write_bytes(raw)
    try:
        load_report(str(path), "runtime")
    except ReportError as exc:
        assert "\n" not in str(exc)
    for command in ("summarize", "visualize-runtime"):
        _check(capsys, [command, "--report", str(path)])


@FUZZ
@given(doc=ARBITRARY_DOCS)
def test_arbitrary_json_documents(tmp_path, capsys, doc):
    path = tmp_path / "runtime_report.json"
    path.write_text(_dump(doc))
    for command in ("summarize", "visualize-runtime"):
        _check(capsys, [command, "--report", str(path)])


@FUZZ
@given(doc=mutated_reports())
def test_mutated_real_reports(tmp_path, capsys, doc):
    path = tmp_path / "runtime_report.json"
    path.write_text(_dump(doc))
    _check(capsys, ["summarize", "--report", str(path)])
    _check(capsys, ["visualize-runtime", "--report", str(path), "--out", str(tmp_path / "p.html")])


@FUZZ
@given(
    doc=st.one_of(mutated_reports(), ARBITRARY_DOCS),
    folder=st.sampled_from(["rank00001", "rank7", "rank99999999999", "rank", "rankx"]),
    world=st.sampled_from([None, 2, 10**12, -3, "2"]),
)
def test_job_directories(tmp_path, capsys, doc, folder, world):
    job = tmp_path / "job"
    shutil.rmtree(job, ignore_errors=True)
    good = dict(REAL, rank=0, world_size=2 if world is None else world)
    for name, data in (("rank00000", good), (folder, doc)):
        (job / name).mkdir(parents=True, exist_ok=True)
        (job / name / "runtime_report.json").write_text(_dump(data))
    _check(capsys, ["visualize-runtime", "--report", str(job)])


def _trace_lines() -> list[str]:
    header = {"schema_version": SCHEMA_VERSION, "header": {"rank": 0, "world_size": 2,
              "config": {"top_k": 20, "detail_steps": 2, "max_trace_events": 1000}}}  # fmt: skip
    return [json.dumps(header)] + [json.dumps(e) for e in REAL["runtime_trace"][:60]]


TRACE = _trace_lines()


@FUZZ
@given(
    index=st.integers(0, len(TRACE) - 1),
    replacement=st.one_of(
        st.binary(max_size=80).map(lambda b: b.decode("latin-1")),
        JSONISH.map(_dump),
        st.builds(
            lambda key, value: json.dumps(dict(json.loads(TRACE[1]), **{key: value})),
            st.sampled_from(sorted(json.loads(TRACE[1]))),
            JSONISH,
        ),
    ),
    torn=st.booleans(),
)
def test_mutated_traces(tmp_path, capsys, index, replacement, torn):
    lines = list(TRACE)
    lines[index] = replacement
    text = "\n".join(lines) + ("" if torn else "\n")
    path = tmp_path / "trace.jsonl"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        _, events = read_trace(str(path))
        for _ in events:
            pass
    except TraceError as exc:
        assert "\n" not in str(exc)
    _check(capsys, ["analyze", "--trace", str(path), "--out", str(tmp_path / "replayed.json")])


@FUZZ
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_as_a_trace(tmp_path, capsys, raw):
    path = tmp_path / "trace.jsonl"
    path.write_bytes(raw)
    _check(capsys, ["analyze", "--trace", str(path), "--out", str(tmp_path / "replayed.json")])


# -- training logs (memscope analyze-log: inputs/training_log.py, the reader of issue 19) ----
PUBLISHED_LOG = (
    Path(__file__).resolve().parent / "data" / "logs" / "gpt2_345m_tp4_fp16_two_runs.log"
)
LOG_LINES = PUBLISHED_LOG.read_text(encoding="utf-8").splitlines()


@FUZZ
@given(raw=st.binary(max_size=400))
def test_arbitrary_bytes_as_a_training_log(tmp_path, capsys, raw):
    path = tmp_path / "train.log"
    path.write_bytes(raw)
    _check(capsys, ["analyze-log", str(path), "--outdir", str(tmp_path / "out")])


@st.composite
def mutated_logs(draw: st.DrawFn) -> str:
    """A real published log (two runs, arguments blocks, memory and iteration lines) with a
    few lines deleted, repeated, cut short or replaced by nasty text."""
    lines = list(LOG_LINES)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["delete", "repeat", "cut", "replace"]))
        if action == "delete":
            del lines[i]
        elif action == "repeat":
            lines.insert(i, lines[i])
        elif action == "cut":
            lines[i] = lines[i][: draw(st.integers(0, max(0, len(lines[i]) - 1)))]
        else:
            lines[i] = draw(st.one_of(NASTY, st.text(max_size=40)))
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=mutated_logs())
def test_mutated_published_logs(tmp_path, capsys, text):
    path = tmp_path / "train.log"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _check(capsys, ["analyze-log", str(path), "--outdir", str(tmp_path / "out")])
