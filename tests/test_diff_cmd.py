"""``memscope diff`` on real reports: a run with a planted leak against a clean one names the
leaked module and microbatch; two steps of the leaking run differ by the leak; job
directories are paired by rank; bad input is one line and exit code 2."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import load_json, run_in_process

from memscope.cli import main

pytestmark = pytest.mark.integration

STEPS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory, small_cfg):
    """(clean rank folder, leaking rank folder): the leak keeps one MLP output per step from
    step 1 on."""
    root = tmp_path_factory.mktemp("diff")
    argv = ["--memscope", "--memscope-outdir"]
    clean = run_in_process(small_cfg, STEPS, [*argv, str(root / "clean")])
    leak = run_in_process(small_cfg, STEPS, [*argv, str(root / "leak")], leak_from_step=1)
    return root / "clean" / "rank00000", root / "leak" / "rank00000", clean, leak


def _leaked(cfg) -> int:
    return cfg.seq_length * cfg.micro_batch_size * cfg.hidden_size * 4


def test_a_leaking_run_against_a_clean_one_names_what_it_keeps(runs, tmp_path, small_cfg, capsys):
    clean, leak, _, _ = runs
    assert main(["diff", str(clean), str(leak), "--out", str(tmp_path)]) == 0
    doc = load_json(str(tmp_path / "diff.json"))
    (pair,) = doc["ranks"]
    diff = pair["diff"]
    a, b = (
        load_json(str(clean / "runtime_report.json")),
        load_json(str(leak / "runtime_report.json")),
    )
    assert diff["peak"]["delta_bytes"] == b["peak"]["memory_bytes"] - a["peak"]["memory_bytes"] > 0
    rows = diff["composition"]["rows"]
    top = max(rows, key=lambda r: r["delta_bytes"])
    # the peak is in step 3's last backward: the MLP outputs of microbatch 0 born in steps 1,
    # 2 and 3 are still live (the clean run has freed step 3's by then)
    assert (top["category"], top["module"]) == ("activations", "decoder.layers.0.mlp.linear_fc2")
    # the leaked output's microbatch, or None where the row sums microbatches: which one wins
    # is a near tie a loaded CI run moved (one clean-clone run read None)
    assert top["microbatch"] in (0, None)
    assert top["delta_bytes"] == 3 * _leaked(small_cfg)
    assert sum(r["delta_bytes"] for r in rows) == diff["peak"]["delta_bytes"]
    md = (tmp_path / "diff.md").read_text()
    assert "`decoder.layers.0.mlp.linear_fc2`" in md
    page = (tmp_path / "diff.html").read_text()
    data = json.loads(page.split('id="memscope-data">', 1)[1].split("</script>", 1)[0])
    assert data == doc


def test_two_steps_of_one_run_differ_by_what_leaked_between_them(runs, tmp_path, small_cfg):
    _, leak, _, _ = runs
    assert main(["diff", str(leak), "--step-a", "1", "--step-b", "3", "--out", str(tmp_path)]) == 0
    (pair,) = load_json(str(tmp_path / "diff.json"))["ranks"]
    steps = pair["diff"]["steps"]
    assert steps["totals"]["allocated_end"]["delta"] == 2 * _leaked(small_cfg)
    assert steps["categories_end"]["activations"]["delta"] == 2 * _leaked(small_cfg)
    assert steps["categories_end"]["optimizer_state"]["delta"] == 0
    assert pair["diff"]["peak"]["moved"]["step"] == [1, 3]
    # each hooked step keeps its own peak's composition: step 3's holds two more leaked MLP
    # outputs than step 1's, and the rows add up to the difference of the two steps' peaks
    composition = pair["diff"]["composition"]
    assert composition["available"]
    top = max(composition["rows"], key=lambda r: r["delta_bytes"])
    assert (top["category"], top["module"], top["delta_bytes"]) == (
        "activations", "decoder.layers.0.mlp.linear_fc2", 2 * _leaked(small_cfg))  # fmt: skip
    # the leak is kept from microbatch 0; the two microbatches' peaks differ by a few bytes, so
    # a loaded machine can put step 3's peak in the other one: then the rows are summed over
    # microbatches and name none
    assert top["microbatch"] == (None if composition["over_microbatches"] else 0)
    peak = pair["diff"]["peak"]
    assert sum(r["delta_bytes"] for r in composition["rows"]) == peak["delta_bytes"]
    report = load_json(str(leak / "runtime_report.json"))
    kept = {c["step"]: c for c in report["step_compositions"]}
    assert sorted(kept) == list(range(STEPS))
    assert all(sum(i["bytes"] for i in c["items"]) == c["peak_bytes"] for c in kept.values())
    assert [kept[s]["peak_bytes"] for s in kept] == [r["peak_allocated"] for r in report["steps"]]


def test_job_directories_are_paired_by_rank(runs, tmp_path, capsys):
    clean, leak, _, _ = runs
    job_a, job_b = tmp_path / "a", tmp_path / "b"
    for rank in (0, 1):
        shutil.copytree(clean, job_a / f"rank{rank:05d}")
    for rank in (0, 2):
        shutil.copytree(leak, job_b / f"rank{rank:05d}")
    assert main(["diff", str(job_a), str(job_b), "--out", str(tmp_path / "out")]) == 0
    doc = load_json(str(tmp_path / "out" / "diff.json"))
    assert [p["diff"]["peak"]["delta_bytes"] > 0 for p in doc["ranks"]] == [True]
    assert doc["unpaired"] == [1, 2]
    assert "not compared" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{clean}"], "give --step-a and --step-b"),
        (["{clean}", "--step-a", "1", "--step-b", "99"], "step 99 is not in the report"),
        (["{clean}", "{tmp}/missing"], "no such report"),
        (["{clean}", "{tmp}/bad.json"], "bad.json"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_code_2(runs, tmp_path, capsys, args, message):
    clean = runs[0]
    (tmp_path / "bad.json").write_text('{"schema_version": "1.1", "report_ty')
    argv = [a.format(clean=clean, tmp=tmp_path) for a in args]
    assert main(["diff", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "diff.json").exists()


def test_a_peak_that_moved_to_another_microbatch_is_compared_over_microbatches(tmp_path, capsys):
    """Two real runs, 2 and 4 microbatches. Per microbatch, every item of the microbatch holding
    one run's peak would vanish and reappear under the other's. Summed over microbatches, one
    row per (category, module) is left, each naming the microbatches it had on each side.

    Which microbatch (and step) holds a run's peak is a near tie: the microbatches' backward
    peaks differ by a few hundred bytes, usually the last one's is highest, and a loaded
    machine can move it. So the test takes the moments the runs report and checks the command
    against them, and checks the summing itself on the two real peak compositions."""
    from memscope.analysis.diff import (
        _composition,
        _live_microbatches,
        diff_compositions,
        diff_compositions_over_microbatches,
    )
    from memscope.demo.tiny_gpt import TinyGPTConfig

    folders = []
    for microbatches in (2, 4):
        cfg = TinyGPTConfig(
            num_layers=2, hidden_size=64, num_attention_heads=4, num_microbatches=microbatches
        )
        out = tmp_path / f"mb{microbatches}"
        run_in_process(cfg, 3, ["--memscope", "--memscope-outdir", str(out)])
        folders.append(out / "rank00000")
    assert main(["diff", *map(str, folders), "--out", str(tmp_path / "out")]) == 0
    (pair,) = load_json(str(tmp_path / "out" / "diff.json"))["ranks"]
    diff, comp = pair["diff"], pair["diff"]["composition"]
    a, b = (load_json(str(f / "runtime_report.json")) for f in folders)
    comp_a, comp_b = _composition(a), _composition(b)
    peak_mb = [r["peak"].get("microbatch") for r in (a, b)]
    moved = diff["peak"]["moved"]
    assert moved.get("microbatch", [peak_mb[0]] * 2) == peak_mb
    live_differ = _live_microbatches(comp_a) != _live_microbatches(comp_b)
    assert comp["over_microbatches"] == ("microbatch" in moved or live_differ)
    out = capsys.readouterr().out
    assert "rank 0: peak " in out and " bytes" not in out
    assert (f"microbatch {peak_mb[0]} -> {peak_mb[1]}" in out) == ("microbatch" in moved)

    # summed over microbatches, on the two real compositions whatever the moments
    rows, _ = diff_compositions_over_microbatches(comp_a, comp_b)
    keys = [(r["category"], r["module"]) for r in rows]
    assert len(keys) == len(set(keys))  # one row per (category, module)
    assert sum(r["delta_bytes"] for r in rows) == sum(comp_b.values()) - sum(comp_a.values())
    per_microbatch = diff_compositions(comp_a, comp_b)
    assert len(rows) <= len(per_microbatch)
    if comp["over_microbatches"]:
        assert comp["rows"] == rows
        assert sum(r["delta_bytes"] for r in comp["rows"]) == diff["peak"]["delta_bytes"]
        md = (tmp_path / "out" / "diff.md").read_text()
        assert "summed over microbatches" in md
    if peak_mb[0] != peak_mb[1]:  # the peak's microbatch moved: per microbatch, items offset
        offsetting = [r for r in per_microbatch if r["status"] in ("new", "vanished")]
        assert len(rows) < len(per_microbatch) and len(offsetting) > len(rows)
        moved_rows = [r for r in rows if r["microbatches_a"] != r["microbatches_b"]]
        assert moved_rows


@pytest.mark.multiprocess
def test_jobs_of_different_layouts_are_refused_unless_allowed(tmp_path, capsys):
    """The committed example is a real PP=2 job; a real TP=2 demo job has the same ranks
    holding other shards: paired by rank they are refused, and labelled when allowed."""
    import os

    example = os.path.join(os.path.dirname(__file__), "..", "examples", "cpu_pp2_demo")
    tp_job = tmp_path / "tp"
    assert main(["demo", "--parallel", "tp", "--steps", "2", "--outdir", str(tp_job)]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["diff", example, str(tp_job), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "different parallel layouts" in err and "--allow-layout-mismatch" in err
    assert len(err.splitlines()) == 1 and not out.exists()
    assert main(["diff", example, str(tp_job), "--out", str(out), "--allow-layout-mismatch"]) == 0
    doc = load_json(str(out / "diff.json"))
    assert [p["diff"]["layout"]["same"] for p in doc["ranks"]] == [False, False]
    assert doc["ranks"][0]["diff"]["layout"]["a"].startswith("TP 1 PP 2")
    assert doc["ranks"][0]["diff"]["layout"]["b"].startswith("TP 2 PP 1")
    assert "Different parallel layouts" in (out / "diff.md").read_text()
    assert "different layouts: A TP 1 PP 2" in capsys.readouterr().out
