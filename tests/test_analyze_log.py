"""``memscope analyze-log``: grid places, the moment a line was printed, verdicts, OOM
remedies, the three outputs, bad input and the ``plan --calibrate`` hook."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from memscope.analysis.log_check import (
    Status,
    check_oom,
    check_rank,
    grid_position,
    lazy_optimizer_bytes,
    moment_estimate,
    optimizer_steps,
    verdict,
)
from memscope.analysis.static.config import ModelSpec, ParallelSpec, PrecisionSpec, TrainingSpec
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition
from memscope.analysis.static.spec_checks import validate_spec
from memscope.cli import main
from memscope.events.schema import SCHEMA_VERSION
from memscope.inputs.log_spec import LogOptions, run_spec
from memscope.inputs.training_log import read_runs

DATA = pathlib.Path(__file__).parent / "data" / "logs"
OOM_LOG = DATA / "gpt2_774m_fp16_oom_v100.log"
DENSE_LOG = DATA / "qwen2_0.5b_bf16_dp2.log"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _spec(**parallel: int) -> TrainingSpec:
    model = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=8, vocab_size=1024,
                      seq_length=256, num_experts=8 if parallel.get("ep", 1) > 1 else None,
                      moe_ffn_hidden_size=512 if parallel.get("ep", 1) > 1 else None)  # fmt: skip
    return validate_spec(TrainingSpec(
        model, ParallelSpec(**parallel), PrecisionSpec(params_dtype="bfloat16", grads_in_fp32=True),
        micro_batch_size=1, num_microbatches=4,
    ))  # fmt: skip


@pytest.mark.parametrize(
    ("sizes", "order"),
    [
        (dict(tp=2, cp=2, dp=2, pp=2), "tp-cp-ep-dp-pp"),
        (dict(tp=2, dp=4, pp=2, ep=4, etp=1), "tp-cp-ep-dp-pp"),
        (dict(tp=2, cp=1, dp=2, pp=2), "tp-cp-ep-pp-dp"),  # --use-tp-pp-dp-mapping
    ],
)
def test_grid_position_matches_megatron_core_rank_generator(sizes, order):
    """Each rank's tp/cp/dp/pp index is its index in megatron-core's own groups."""
    from megatron.core.parallel_state import RankGenerator

    spec = _spec(**sizes)
    p = spec.parallel
    dense = RankGenerator(tp=p.tp, ep=1, dp=p.dp, pp=p.pp, cp=p.cp, order=order)
    expert = RankGenerator(tp=p.expert_tp, ep=p.ep, dp=p.expert_dp, pp=p.pp, cp=1, order=order)
    want: dict[int, dict[str, int]] = {r: {} for r in range(p.world_size)}
    for gen, names in ((dense, ("tp", "cp", "dp", "pp")), (expert, ("ep",))):
        for name in names:
            for group in gen.get_ranks(name):
                for index, rank in enumerate(group):
                    want[rank][name] = index
    for rank in range(p.world_size):
        got = grid_position(spec, rank, order)
        assert {k: got[k] for k in want[rank]} == want[rank], rank


def test_moments_are_missing_before_the_first_real_step():
    spec = _spec(tp=1, dp=1, pp=1)
    est = estimate_rank(spec, RankPosition())
    lazy = lazy_optimizer_bytes(spec, est)
    # bf16 Adam: 12 bytes per parameter, 8 of them the two fp32 moments
    assert lazy == est.persistent.optimizer_bytes * 8 // 12
    none, first, steady = (moment_estimate(spec, est, s) for s in (0, 1, 2))
    assert steady.peak_bytes == est.peak_memory_bytes and steady.missing == {}
    assert none.missing == {"optimizer_moments": lazy}
    assert none.allocated_bytes == est.steady_bytes - lazy
    assert none.peak_bytes < first.peak_bytes <= steady.peak_bytes


def test_skipped_iterations_are_not_optimizer_steps():
    assert optimizer_steps(10, [(10, 10)]) == (0, "")
    assert optimizer_steps(20, [(10, 10), (20, 6)]) == (4, "")
    steps, note = optimizer_steps(10, [])
    assert steps == 10 and "assumed" in note


def test_verdict_names_the_terms_too_small_to_explain_the_gap():
    spec = _spec(tp=1, dp=1, pp=1)
    est = estimate_rank(spec, RankPosition())
    mb = est.peak_memory_bytes / 2**20
    row = check_rank(
        spec, 0, dict(allocated=mb / 2, max_allocated=mb, reserved=mb, max_reserved=mb), 10, 10
    )
    assert row["verdict"]["status"] == "within_band"
    far = check_rank(spec, 0, dict(allocated=mb, max_allocated=3 * mb, reserved=3 * mb,
                                   max_reserved=3 * mb), 10, 10)  # fmt: skip
    v = far["verdict"]
    assert v["status"] == "above" and v["error_ratio"] == pytest.approx(2.0, rel=1e-6)
    assert v["could_explain"] == [] and "activations" in v["cannot_explain"]
    # a gap one term could explain: the optimizer state alone is that large
    est_terms = far["estimate"]["terms"]
    small = verdict(est.peak_memory_bytes + est_terms["optimizer_state"], est.peak_memory_bytes,
                    est_terms)  # fmt: skip
    assert small.status is Status.ABOVE and "optimizer_state" in small.could_explain


def test_oom_remedies_fit_only_when_they_bring_the_need_under_what_pytorch_could_hold():
    spec = _spec(tp=1, dp=1, pp=1)
    peak = estimate_rank(spec, RankPosition()).peak_memory_bytes
    sizes = dict(requested=peak // 10, total=peak, free=peak // 20, allocated=peak - peak // 10,
                 reserved_unallocated=0, process_in_use=None)  # fmt: skip
    out = check_oom(spec, 0, sizes, steps=5)
    capacity = out["capacity_bytes"]
    assert capacity == sizes["allocated"] + sizes["free"]
    assert out["remedies"], "a model with activations has recompute remedies"
    for r in out["remedies"]:
        assert r["fits"] == (out["need_bytes"] - r["saving_bytes"] <= capacity)
    assert out["fragmentation"]["could_have_served_the_request"] is False


def _cli(capsys, *args):
    rc = main(["analyze-log", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_oom_log_is_explained_with_remedies_and_three_outputs(tmp_path, capsys):
    rc, out, err = _cli(capsys, OOM_LOG, "--outdir", tmp_path)
    assert rc == 0, err
    doc = json.loads((tmp_path / "log_report.json").read_text())
    assert doc["report_type"] == "log" and doc["schema_version"] == SCHEMA_VERSION
    run = doc["runs"][0]
    assert run["config"]["origin"] == "arguments block" and run["config"]["world_size"] == 1
    oom = run["ooms"][0]
    assert oom["rank"] == 0 and oom["sizes"]["requested"] == 786 * 2**20
    # torch 2.0: 29.97 GiB reserved in total, 28.82 GiB allocated: 1.15 GiB cached and free
    assert oom["fragmentation"]["reserved_unallocated_bytes"] == pytest.approx(
        1.15 * 2**30, rel=0.01
    )
    assert oom["optimizer_steps"] == 0 and oom["estimate"]["not_yet_allocated"]
    assert any(r["fits"] for r in oom["remedies"])
    assert "out of memory on rank 0" in out
    md = (tmp_path / "log_report.md").read_text()
    assert "### Out of memory" in md and "`--recompute-granularity selective`" in md
    assert "| 0 | `gpt2_774m_fp16_oom_v100.log:242` | 786.00 MiB |" in md
    html = (tmp_path / "log_report.html").read_text()
    assert html.count('id="memscope-data"') == 1 and "Plotly" in html


def test_dense_log_rank_matches_its_estimate_within_the_band(tmp_path, capsys):
    rc, _out, err = _cli(capsys, DENSE_LOG, "--outdir", tmp_path, "--vocab-size", 151936)
    assert rc == 0, err
    run = json.loads((tmp_path / "log_report.json").read_text())["runs"][0]
    row = run["ranks"][0]
    assert row["grid"] == {"tp": 0, "cp": 0, "ep": 0, "dp": 0, "pp": 0}
    assert row["measured"]["max_allocated"] == round(7959.9697265625 * 2**20)
    assert row["optimizer_steps"] == 10 and row["moment"] == "steady state"
    assert row["megatron_theoretical_mb"]["weight_and_optimizer_mb"] == 7211.88
    assert row["verdict"]["status"] == "within_band"
    assert run["stages"][0]["status"] == "within_band"


def test_a_log_without_memory_lines_says_what_to_turn_on(tmp_path, capsys):
    lines = [ln for ln in DENSE_LOG.read_text().splitlines() if "memory (MB)" not in ln]
    log = tmp_path / "no_memory.log"
    log.write_text("\n".join(lines) + "\n")
    rc, _, err = _cli(capsys, log, "--outdir", tmp_path / "o", "--vocab-size", 151936)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "log_interval 10" in err and "--log-memory-to-tensorboard" in err
    assert not (tmp_path / "o" / "log_report.json").exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"\x00\x01\x02binary" * 100, "binary"),
        (b"just some text\nnothing from Megatron\n", "no Megatron training run"),
        (b"------------------------ arguments ------------------------\n  a .... 1\n", "truncated"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, content, needle):
    log = tmp_path / "bad.log"
    log.write_bytes(content)
    rc, _, err = _cli(capsys, log, "--outdir", tmp_path / "o")
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_missing_file_and_directory_without_logs_are_one_line(tmp_path, capsys):
    rc, _, err = _cli(capsys, tmp_path / "nope.log", "--outdir", tmp_path / "o")
    assert rc == 2 and "no such file" in err
    rc, _, err = _cli(capsys, tmp_path, "--outdir", tmp_path / "o")
    assert rc == 2 and "host_" in err


def test_plan_calibrate_accepts_a_log(tmp_path, capsys):
    """The log's steady-state line corrects the plan's terms."""
    rc, _, err = _cli(capsys, DENSE_LOG, "--outdir", tmp_path / "log", "--vocab-size", 151936)
    assert rc == 0, err
    from memscope.inputs.log_document import calibration_comparisons

    doc = json.loads((tmp_path / "log" / "log_report.json").read_text())
    comps = calibration_comparisons(doc)
    assert len(comps) == 1 and comps[0]["status"] == "ok"
    row = doc["runs"][0]["ranks"][0]
    by = {c["component"]: c for c in comps[0]["components"]}
    steady = sum(c["static_bytes"] for k, c in by.items() if k != "activations")
    measured = sum(c["runtime_bytes"] for k, c in by.items() if k != "activations")
    # the persistent terms' sum is scaled to what stayed allocated (up to the buffer and
    # fp32 grad copies, which the steady group holds but no planner term names)
    assert measured / steady == pytest.approx(
        row["measured"]["allocated"] / (steady + row["estimate"]["terms"]["global_buffer"]
                                        + row["estimate"]["terms"]["fp32_grad_copies"]),
        rel=1e-3)  # fmt: skip


@pytest.mark.integration  # a real browser
def test_the_page_renders_in_chromium(tmp_path, capsys):
    if CHROMIUM is None:
        pytest.skip("no chromium binary")
    rc, _, err = _cli(capsys, OOM_LOG, "--outdir", tmp_path)
    assert rc == 0, err
    page = tmp_path / "log_report.html"
    res = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=10000",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    # the page's script raised nothing (Chromium logs an uncaught error as "Uncaught ...")
    assert [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln and "Uncaught" in ln] == []
    dom = res.stdout
    chart = dom.index('id="run0-stages-chart"')
    assert "main-svg" in dom[chart:]  # plotly drew the stage chart, in its section
    ooms = dom[dom.index('id="run0-section-ooms"') :]
    cells = r"<code>gpt2_774m_fp16_oom_v100\.log:\d+</code></td><td[^>]*>786\.00 MiB"
    assert re.search(cells, ooms)
    assert "--recompute-granularity selective" in dom


def test_spec_reuse_of_the_run_for_a_changed_layout_is_what_the_reader_gives():
    """The reader's spec is the static reader's (same dataclass, validated)."""
    spec = run_spec(read_runs([str(DENSE_LOG)])[0], LogOptions(vocab_size=151936)).spec
    assert spec == validate_spec(replace(spec))
    assert (spec.parallel.dp, spec.model.num_query_groups, spec.model.vocab_size) == (2, 2, 151936)


def test_plan_calibrate_with_a_log_writes_the_factors(tmp_path, capsys):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({
        "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                  "vocab_size": 1024, "seq_length": 256},
        "train": {"micro_batch_size": 1, "global_batch_size": 8},
        "parallel": {"tp": 1, "pp": 1, "dp": 2}, "dtype": "bf16"}))  # fmt: skip
    rc = main(["plan", "--config", str(config), "--gpu-memory", "80GiB", "--world-size", "2",
               "--calibrate", str(DENSE_LOG), "--vocab-size", "151936",
               "--outdir", str(tmp_path / "plan")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0, err
    calibrated = json.loads((tmp_path / "plan" / "plan.json").read_text())["calibration"]
    assert calibrated["ranks"] == 1
    assert set(calibrated["factors"]) == {"parameters", "gradients", "optimizer_state", "other",
                                          "activations"}  # fmt: skip


def test_committed_fixture_table_is_what_the_tool_prints_now():
    """benchmarks/analyze_log_fixtures.txt is re-made by tools/bench_analyze_log.py."""
    import sys

    root = pathlib.Path(__file__).parent.parent
    sys.path.insert(0, str(root / "tools"))
    import bench_analyze_log

    data = bench_analyze_log.rows()
    committed = (root / "benchmarks" / "analyze_log_fixtures.txt").read_text()
    assert bench_analyze_log.table(data) == committed
    fixtures = {r["fixture"] for r in data}
    assert fixtures == {p.name for p in DATA.glob("*.log")}, "every fixture has rows"


def test_after_one_iteration_allocated_holds_the_moments_the_backward_did_not(tmp_path, capsys):
    """The ROCm TP4 PP2 run printed memory after iteration 1 (log_interval 1): what stays
    allocated then holds Adam's moments (the step made them) and matches the steady terms on
    both stages; the max-allocated estimate is the forward/backward without them."""
    log = DATA / "gpt_56l_6144h_tp4_pp2_sp_rocm_after1.log"
    rc, printed, err = _cli(capsys, log, "--outdir", tmp_path)
    assert rc == 0, err
    run = json.loads((tmp_path / "log_report.json").read_text())["runs"][0]
    assert run["config"]["layout"]["tp"] == 4 and run["config"]["layout"]["pp"] == 2
    assert {r["grid"]["pp"] for r in run["ranks"]} == {0, 1}
    for r in run["ranks"]:
        assert r["optimizer_steps"] == 1 and r["moment"].startswith("first real")
        assert r["allocated_verdict"]["status"] == "within_band"
        assert r["estimate"]["max_allocated_bytes"] < r["estimate"]["steady_peak_bytes"]
        # above the band with the fused Adam the estimate assumes; within it with torch's
        # AdamW, which no log shows: named beside the verdict, in the JSON, page and summary
        assert r["verdict"]["status"] == "above"
        (alt,) = r["verdict"]["explained_if"]
        assert alt["setting"] == "torch's AdamW" and abs(alt["error_ratio"]) <= 0.005
        assert alt["max_allocated_bytes"] > r["estimate"]["max_allocated_bytes"]
    assert all(s["explained_if"] == ["torch's AdamW"] for s in run["stages"])
    assert "within the band with torch's AdamW" in (tmp_path / "log_report.md").read_text()
    assert printed.count("(above; within the band with torch's AdamW)") == 2


def test_a_verdict_within_the_band_names_no_unlogged_setting(tmp_path, capsys):
    rc, _, err = _cli(capsys, DATA / "qwen2_0.5b_bf16_dp2.log", "--outdir", tmp_path,
                      "--vocab-size", "151936")  # fmt: skip
    assert rc == 0, err
    (row,) = json.loads((tmp_path / "log_report.json").read_text())["runs"][0]["ranks"]
    assert row["verdict"]["status"] == "within_band" and "explained_if" not in row["verdict"]


def test_lines_after_one_and_two_iterations_are_different_moments(tmp_path):
    """v0.16 prints after iteration 1 (the moments appear at its step) and 2 (steady)."""
    from memscope.inputs.log_document import explain_run
    from memscope.inputs.training_log import read_file_runs

    block = ["------------------------ arguments ------------------------"]
    args = dict(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=256,
                padded_vocab_size=1024, micro_batch_size=1, global_batch_size=4,
                tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                data_parallel_size=1, world_size=1, bf16=True, log_interval=1)  # fmt: skip
    block += [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in sorted(args.items())]
    block.append("-------------------- end of arguments ---------------------")
    mem = ("[Rank 0] (after {} iterations) memory (MB) | allocated: 10.00 | max allocated: "
           "20.00 | reserved: 30.00 | max reserved: 30.00")  # fmt: skip
    it = " iteration {:8d}/      10 | lm loss: 1.0E+01 | number of skipped iterations:   0 |"
    log = tmp_path / "v016.log"
    log.write_text("\n".join([*block, it.format(1), mem.format(1), it.format(2), mem.format(2)]))
    rows = explain_run(read_file_runs(str(log))[0])["ranks"]
    assert [(r["iteration"], r["optimizer_steps"]) for r in rows] == [(1, 1), (2, 2)]
    first, second = (r["estimate"]["max_allocated_bytes"] for r in rows)
    assert first < second  # iteration 1's backward ran before Adam's moments existed
    assert rows[1]["moment"] == "steady state" and rows[0]["moment"].startswith("first real")


def test_a_log_with_only_the_launch_command_line_is_explained(tmp_path, capsys):
    """The command line's flags, with Megatron's defaults for the rest and torchrun's world."""
    command = (
        "+ torchrun --nproc_per_node 4 --nnodes 1 --master_port 6000 pretrain_gpt.py "
        "--num-layers 4 --hidden-size 256 --ffn-hidden-size 688 --num-attention-heads 8 "
        "--group-query-attention --num-query-groups 2 --seq-length 512 "
        "--max-position-embeddings 512 --micro-batch-size 2 --global-batch-size 16 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --swiglu "
        "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear "
        "--untie-embeddings-and-output-weights --bf16 --use-distributed-optimizer "
        "--vocab-size 32000 --make-vocab-size-divisible-by 128 --log-interval 10"
    )
    mem = ("[Rank {r}] (after 10 iterations) memory (MB) | allocated: 100.0 | max allocated: "
           "200.0 | reserved: 300.0 | max reserved: 300.0")  # fmt: skip
    log = tmp_path / "cmd.log"
    log.write_text("\n".join([command, *(f"{r}: " + mem.format(r=r) for r in (0, 1, 2, 3))]))
    rc, _, err = _cli(capsys, log, "--outdir", tmp_path / "o")
    assert rc == 0, err
    run = json.loads((tmp_path / "o" / "log_report.json").read_text())["runs"][0]
    cfg = run["config"]
    assert cfg["origin"] == "command line" and cfg["world_size"] == 4
    assert "torchrun" in cfg["world_origin"]
    lay = cfg["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["num_microbatches"]) == (2, 2, 1, 8)
    assert lay["vocab_size"] == 32000  # already a multiple of 128 x tp
    grids = {r["rank"]: (r["grid"]["tp"], r["grid"]["pp"]) for r in run["ranks"]}
    assert grids == {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}
    assert [s["pp_rank"] for s in run["stages"]] == [0, 1]


def test_a_flagscale_logs_folder_reads_as_the_plain_log(tmp_path, capsys):
    """The Qwen2 log as FlagScale's runner writes it: one host_{node}_{host}.output per node,
    every line with torchrun's --tee prefix, FlagScale's '>>> [FS] Theoretical' line."""
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = DENSE_LOG.read_text().splitlines()
    fs = [ln.replace("Theoretical", ">>> [FS] Theoretical") for ln in lines]
    (logs / "host_0_node-a.output").write_text("\n".join(f"[default0]:{ln}" for ln in fs) + "\n")
    (logs / "host_1_node-b.output").write_text("[default0]:> building GPT model ...\n")
    docs = []
    for i, src in enumerate((DENSE_LOG, logs)):
        rc, _, err = _cli(capsys, src, "--outdir", tmp_path / str(i), "--vocab-size", 151936)
        assert rc == 0, err
        docs.append(json.loads((tmp_path / str(i) / "log_report.json").read_text()))
    plain, folder = (d["runs"][0] for d in docs)
    assert [pathlib.Path(f).name for f in docs[1]["files"]] == [
        "host_0_node-a.output", "host_1_node-b.output"]  # fmt: skip
    assert folder["ranks"][0]["measured"] == plain["ranks"][0]["measured"]
    assert folder["ranks"][0]["estimate"] == plain["ranks"][0]["estimate"]
    assert folder["theoretical"] == plain["theoretical"] is not None


def test_a_refused_configuration_still_reports_what_was_measured(tmp_path, capsys):
    """A real vision setting (img_h 448 in the block) is refused by the estimator: the run
    says why, and its memory lines are reported as measured, without an estimate."""
    dots = "." * (48 - len("img_h"))
    text = DENSE_LOG.read_text().replace(f"  img_h {dots} 224", f"  img_h {dots} 448")
    assert "448" in text
    log = tmp_path / "vlm.log"
    log.write_text(text)
    rc, out, err = _cli(capsys, log, "--outdir", tmp_path / "o", "--vocab-size", 151936)
    assert rc == 0, err
    run = json.loads((tmp_path / "o" / "log_report.json").read_text())["runs"][0]
    assert "img_h" in run["error"] and "not explained" in out
    (row,) = run["ranks"]
    assert row["estimate"] is None and row["verdict"] is None
    assert row["measured"]["max_allocated"] == round(7959.9697265625 * 2**20)
    assert "not estimated" in (tmp_path / "o" / "log_report.md").read_text()


def _dump(**values: object) -> list[str]:
    """An arguments block as Megatron's ``_print_args`` prints it (a test input, built here:
    no published log with these settings was found, docs/analyze-log.md)."""
    lines = ["------------------------ arguments ------------------------"]
    for name, value in sorted(values.items(), key=lambda kv: kv[0].lower()):
        lines.append(f"  {name} {'.' * (48 - len(name))} {value}")
    return [*lines, "-------------------- end of arguments ---------------------"]


def test_a_vpp_and_cp_arguments_block_reaches_the_layout_grid_and_estimates(tmp_path):
    """The virtual pipeline and context-parallel path of analyze-log end to end, on a dump
    Megatron could print (8 layers, PP 2 with 2 layers per virtual stage, CP 2, DP 2): the
    layout says VPP 2 and CP 2, each data-parallel rank 0 that printed memory gets its cp and
    pp place as megatron-core numbers them and an estimate of its own stage."""
    from memscope.cli.analyze_log_cmd import analyze_logs

    args = dict(
        num_layers=8, hidden_size=256, num_attention_heads=8, seq_length=1024,
        max_position_embeddings=1024, padded_vocab_size=1024, micro_batch_size=1,
        global_batch_size=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=2,
        num_layers_per_virtual_pipeline_stage=2, virtual_pipeline_model_parallel_size=2,
        context_parallel_size=2, data_parallel_size=2, world_size=8, bf16=True,
        use_distributed_optimizer=False, log_interval=2,
    )  # fmt: skip
    memory = ("[Rank {r}] (after 2 iterations) memory (MB) | allocated: 100.0 | max allocated: "
              "200.0 | reserved: 300.0 | max reserved: 300.0")  # fmt: skip
    printing = [0, 1, 4, 5]  # tp-cp-ep-dp-pp: dp 0 is rank % 4 < 2
    lines = [*_dump(**args), *(memory.format(r=r) for r in printing)]
    log = tmp_path / "vpp_cp.log"
    log.write_text("\n".join(lines) + "\n")
    run = analyze_logs([str(log)])["runs"][0]
    assert run["error"] is None
    layout = run["config"]["layout"]
    assert (layout["pp"], layout["vpp"], layout["cp"], layout["dp"]) == (2, 2, 2, 2)
    places = {r["rank"]: (r["grid"]["cp"], r["grid"]["pp"], r["grid"]["dp"]) for r in run["ranks"]}
    assert places == {0: (0, 0, 0), 1: (1, 0, 0), 4: (0, 1, 0), 5: (1, 1, 0)}
    estimates = {r["rank"]: r["estimate"]["max_allocated_bytes"] for r in run["ranks"]}
    assert all(v > 0 for v in estimates.values())
    assert estimates[0] == estimates[1] and estimates[4] == estimates[5]  # cp ranks alike
    assert [s["pp_rank"] for s in run["stages"]] == [0, 1]


def test_the_gpu_and_transformer_engine_a_log_cannot_name_are_said_assumed(tmp_path, capsys):
    rc, _out, err = _cli(capsys, DENSE_LOG, "--outdir", tmp_path, "--vocab-size", 151936)
    assert rc == 0, err
    machine = json.loads((tmp_path / "log_report.json").read_text())["runs"][0]["config"]["machine"]
    assert machine["gpu"].startswith("H100 assumed") and "--gpu names the run's" in machine["gpu"]
    assert machine["transformer_engine"].startswith("2.17 assumed")
    assert "--transformer-engine-version names" in machine["transformer_engine"]
    md = (tmp_path / "log_report.md").read_text()
    assert "- GPU: H100 assumed" in md and "- Transformer Engine: 2.17 assumed" in md


def test_the_given_gpu_and_transformer_engine_size_the_logs_workspaces(tmp_path, capsys):
    """--gpu a100 --transformer-engine-version 2.2.0: the A100's smaller torch and TE cuBLAS
    workspaces and no cached placeholder gradients (TE < 2.2.1), by exactly the workspace
    terms of the two specs."""

    rows = {}
    for name, extra in (
        ("assumed", []),
        ("given", ["--gpu", "a100", "--transformer-engine-version", "2.2.0"]),
    ):
        rc, _out, err = _cli(capsys, DENSE_LOG, "--outdir", tmp_path / name,
                             "--vocab-size", 151936, *extra)  # fmt: skip
        assert rc == 0, err
        run = json.loads((tmp_path / name / "log_report.json").read_text())["runs"][0]
        rows[name] = run["ranks"][0]["estimate"]
    given = run["config"]["machine"]
    assert given["gpu"].startswith("a100 (it sizes") and given["gpu"].endswith(", from --gpu")
    assert given["transformer_engine"].startswith("2.2.0 (its workspaces")
    assert given["transformer_engine"].endswith(", from --transformer-engine-version")
    run0 = read_runs([str(DENSE_LOG)])[0]
    specs = {
        "assumed": run_spec(run0, LogOptions(vocab_size=151936)).spec,
        "given": run_spec(run0, LogOptions(vocab_size=151936, gpu="a100",
                                           transformer_engine_version="2.2.0")).spec,
    }  # fmt: skip
    pos = RankPosition(tp_rank=0, pp_rank=0)
    workspaces = {k: estimate_rank(s, pos).workspaces for k, s in specs.items()}
    assert "te_dummy_wgrads" in workspaces["assumed"]
    assert "te_dummy_wgrads" not in workspaces["given"]
    drop = sum(workspaces["assumed"].values()) - sum(workspaces["given"].values())
    assert drop > 0
    assert rows["assumed"]["terms"]["workspaces"] - rows["given"]["terms"]["workspaces"] == drop
    assert rows["assumed"]["max_allocated_bytes"] - rows["given"]["max_allocated_bytes"] == drop


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--gpu", "z100", "gpu 'z100' is unknown"),
        ("--transformer-engine-version", "latest", "'latest' is not a release number"),
        ("--world-size", "0", "--world-size must be >= 1, got 0"),
    ],
)
def test_a_bad_machine_option_is_one_line_and_exit_2(tmp_path, capsys, option, value, needle):
    rc, _out, err = _cli(capsys, DENSE_LOG, "--outdir", tmp_path / "o", option, value)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_plan_calibrate_reads_its_log_with_the_plans_machine_but_the_logs_world_size():
    import argparse

    from memscope.cli.analyze_log_cmd import log_options

    args = argparse.Namespace(vocab_size=151936, world_size=64, gpu="b200",
                              transformer_engine_version="none")  # fmt: skip
    assert log_options(args, with_world_size=False) == LogOptions(
        vocab_size=151936, gpu="b200", transformer_engine_version="none"
    )
    assert log_options(args).world_size == 64
