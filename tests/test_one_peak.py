"""One attributed peak (step, phase, module, microbatch) on a real megatron-core run: the
report's JSON, its Markdown, the page's card and within-step chart, and the Perfetto export
all name the same one, and Perfetto's memory counter reaches its bytes."""

from __future__ import annotations

import json

import pytest
from conftest import load_json, run_in_process

from memscope.analysis.runtime_sections import attributed_peak
from memscope.cli import main
from memscope.events.trace_reader import read_trace
from memscope.reporters.html_payload import runtime_payload
from memscope.reporters.markdown import render_runtime_markdown
from memscope.units import format_bytes

pytestmark = pytest.mark.integration  # trains megatron-core in this process

WHERE = ("step", "phase", "module", "microbatch")


@pytest.fixture(scope="module")
def every_step_run(tmp_path_factory, small_cfg):
    """A 4-step traced run keeping every step's fine events in the report, so the step the
    peak is attributed to (steps 1-3 reach the same high-water mark within a few bytes, and
    which one is highest can differ from run to run) always has its events in the report."""
    outdir = str(tmp_path_factory.mktemp("one_peak"))
    argv = ["--memscope", "--memscope-outdir", outdir, "--memscope-detail-steps", "4"]
    result = run_in_process(small_cfg, 4, argv)
    return result, load_json(result.report_path), outdir


def test_every_output_names_the_one_attributed_peak(every_step_run, tmp_path):
    _, report, outdir = every_step_run
    peak = report["peak"]
    assert peak["attribution"] == "exact" and peak["module"]
    where = {k: peak[k] for k in WHERE}
    # JSON: the report on disk is what the trace replays to
    _, events = read_trace(f"{outdir}/rank00000/trace.jsonl")
    replayed = attributed_peak(events)
    assert {k: replayed[k] for k in (*WHERE, "memory_bytes")} == {
        **where, "memory_bytes": peak["memory_bytes"]}  # fmt: skip
    # Markdown
    text = render_runtime_markdown(report)
    assert (
        f"- allocated peak: **{format_bytes(peak['memory_bytes'])}** at step {peak['step']}, "
        f"phase `{peak['phase']}`, module `{peak['module']}`, microbatch {peak['microbatch']}"
    ) in text
    # the page: the card reads payload["peak"]; the within-step chart's marker names the same
    payload = runtime_payload(report)
    assert {k: payload["peak"][k] for k in WHERE} == where
    marker = payload["within_peak"]
    assert {k: marker[k] for k in ("phase", "module", "microbatch")} == {
        k: peak[k] for k in ("phase", "module", "microbatch")}  # fmt: skip
    assert marker["step"] == str(peak["step"]) and marker["bytes"] == peak["memory_bytes"]
    drawn = payload["within_step"][marker["step"]]
    at = drawn["order"].index(marker["order"])  # the peak's event is always drawn
    assert drawn["max_mem_allocated"][at] >= peak["memory_bytes"]
    # Perfetto: the peak instant carries the attribution; the counter reaches the true peak
    out = tmp_path / "trace.json"
    assert main(["export", "--trace", outdir, "--out", str(out)]) == 0
    exported = json.loads(out.read_text())["traceEvents"]
    (instant,) = [e for e in exported if e["ph"] == "i" and e["name"] == "peak"]
    assert {k: instant["args"][k] for k in WHERE} == where
    assert instant["args"]["bytes"] == peak["memory_bytes"]
    memory = [e for e in exported if e["ph"] == "C" and e["name"] == "memory"]
    assert max(e["args"]["allocated"] for e in memory) == peak["memory_bytes"]
    (at_peak,) = [e for e in memory if e["ts"] == instant["ts"]]
    assert at_peak["args"]["allocated"] == peak["memory_bytes"]
    # the readings after each event alone stay below it: the peak sample is what reaches it
    readings = [e["mem_allocated_after"] for e in load_json(
        f"{outdir}/rank00000/runtime_report.json")["runtime_trace"]]  # fmt: skip
    assert max(readings) < peak["memory_bytes"]
