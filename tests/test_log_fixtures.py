"""What ``analyze-log`` derives from the published MoE log (tests/data/logs/): the layout from
its flags, each rank's grid place, the moment and the verdict, each checked against figures
worked out by hand from the log's own lines."""

from __future__ import annotations

import pathlib
import re

from memscope.cli.analyze_log_cmd import analyze_logs
from memscope.inputs.log_spec import LogOptions

DATA = pathlib.Path(__file__).parent / "data" / "logs"
MOE_LOG = DATA / "moe_64e_top1_ep8_dp8_cmdgroups.log"
MIB = 2**20


def _moe_rank_parameters() -> int:
    """Parameters on one rank of the logged run, from its flags: 24 layers, hidden 512, 4 heads
    of 128 with 1 query group, no biases, RMSNorm, swiglu ffn 1792, 64 experts over EP 8,
    untied embedding and output of Llama 3.1's 128256 tokens."""
    hidden, heads, groups, kv, ffn = 512, 4, 1, 512 // 4, 1792
    experts_here = 64 // 8
    attention = hidden * (heads * kv + 2 * groups * kv) + heads * kv * hidden
    expert = hidden * 2 * ffn + ffn * hidden  # swiglu fc1 is two projections
    layer = 2 * hidden + attention + 64 * hidden + experts_here * expert  # norms, router
    # the log's gradient buckets agree: one bucket holds two layers' local experts
    assert 2 * experts_here * expert == 44040192
    return 24 * layer + hidden + 2 * 128256 * hidden


def test_moe_log_layout_comes_from_its_echoed_flag_groups():
    run = analyze_logs([str(MOE_LOG)], LogOptions(vocab_size=128256))["runs"][0]
    config = run["config"]
    assert config["origin"] == "command line" and config["world_size"] == 8
    layout = config["layout"]
    # --expert-model-parallel-size 8 on 8 GPUs, TP 1 PP 1: DP 8; 64 = 4 x 8 x 2 micro-batches
    assert (layout["tp"], layout["pp"], layout["dp"], layout["ep"]) == (1, 1, 8, 8)
    assert layout["num_experts"] == 64 and layout["num_microbatches"] == 64 // (4 * 8)


def test_moe_log_rank_zero_place_moment_and_verdict():
    run = analyze_logs([str(MOE_LOG)], LogOptions(vocab_size=128256))["runs"][0]
    (row,) = run["ranks"]
    assert row["rank"] == 0 and row["grid"] == {"tp": 0, "cp": 0, "ep": 0, "dp": 0, "pp": 0}
    assert row["measured"]["max_allocated"] == round(20612.236328125 * MIB)
    # printed after iteration 20, whose line counts 0 skipped iterations: 20 real steps
    assert row["iteration"] == 20 and row["optimizer_steps"] == 20
    assert row["moment"] == "steady state"
    assert row["estimate"]["terms"]["weights"] == 2 * _moe_rank_parameters()  # bf16
    assert row["megatron_theoretical_mb"]["weight_and_optimizer_mb"] == 31292.23
    verdict = row["verdict"]
    assert verdict["status"] == "within_band" and abs(verdict["error_ratio"]) <= verdict["band"]
    assert run["stages"][0]["status"] == "within_band"


FIVE_RUNS_LOG = DATA / "gpt2_345m_fp16_five_runs_pp4_tp2pp2.log"


def test_five_published_runs_in_one_file_are_five_runs_with_their_own_layouts():
    """liguodongiot/llm-action pastes five GPT-2 345M runs one after the other (1 GPU, DP 4,
    TP 2 x PP 2, TP 4, PP 4): each arguments block starts a run, each run has the layout its
    own block says, and the single-GPU run, which printed no memory line, says so."""
    runs = analyze_logs([str(FIVE_RUNS_LOG)])["runs"]
    assert len(runs) == 5
    assert runs[0]["ranks"] == [] and "memory (MB)" in runs[0]["error"]
    layouts = [(r["config"]["layout"]["tp"], r["config"]["layout"]["pp"],
                r["config"]["layout"]["dp"]) for r in runs[1:]]  # fmt: skip
    assert layouts == [(1, 1, 4), (2, 2, 1), (4, 1, 1), (1, 4, 1)]
    # every rank the log printed, once, in its run
    assert [sorted(r["rank"] for r in run["ranks"]) for run in runs[1:]] == [
        [0], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]  # fmt: skip


def test_pipeline_ranks_of_the_published_runs_sit_on_their_stages():
    runs = analyze_logs([str(FIVE_RUNS_LOG)])["runs"]
    tp2pp2 = {r["rank"]: (r["grid"]["tp"], r["grid"]["pp"]) for r in runs[2]["ranks"]}
    assert tp2pp2 == {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}  # tp fastest
    pp4 = {r["rank"]: r["grid"]["pp"] for r in runs[4]["ranks"]}
    assert pp4 == {0: 0, 1: 1, 2: 2, 3: 3}
    assert [s["pp_rank"] for s in runs[4]["stages"]] == [0, 1, 2, 3]
    by_stage = {r["grid"]["pp"]: r for r in runs[4]["ranks"]}
    # measured, as printed: the first stage holds the most micro-batches in flight
    assert by_stage[0]["measured"]["max_allocated"] == round(7643.34033203125 * MIB)
    measured = [by_stage[p]["measured"]["max_allocated"] for p in range(4)]
    assert measured[0] == max(measured)
    estimated = [by_stage[p]["estimate"]["max_allocated_bytes"] for p in range(4)]
    assert estimated[0] == max(estimated)  # the estimate agrees on the heaviest stage


def test_skipped_iterations_of_each_published_run_set_its_real_steps():
    """fp16 runs: the loss scaler skipped 16 (DP 4) and 15 (the others) of the first 100
    iterations, printed on the iteration-100 line just before the memory lines."""
    runs = analyze_logs([str(FIVE_RUNS_LOG)])["runs"]
    steps = [{r["optimizer_steps"] for r in run["ranks"]} for run in runs[1:]]
    assert steps == [{84}, {85}, {85}, {85}]
    assert {r["iteration"] for run in runs[1:] for r in run["ranks"]} == {100}


def test_every_fixture_names_its_published_source_and_license():
    """A fixture is an excerpt of a published log: its first line names the GitHub file at a
    commit, and the folder's README lists it with the source's license."""
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`"): line for line in readme.splitlines()
            if line.startswith("| `")}  # fmt: skip
    fixtures = sorted(DATA.glob("*.log"))
    assert fixtures and {f.name for f in fixtures} == set(rows)
    for fixture in fixtures:
        first = fixture.read_text(encoding="utf-8").splitlines()[0]
        m = re.match(r"# SOURCE: https://github\.com/([\w.-]+/[\w.-]+)/blob/([0-9a-f]{40})/", first)
        assert m, f"{fixture.name}: no '# SOURCE: https://github.com/owner/repo/blob/<commit>/'"
        row = rows[fixture.name]
        assert m.group(1) in row and m.group(2)[:7] in row, f"{fixture.name}: README row"
        assert row.rstrip().rstrip("|").split("|")[-1].strip(), f"{fixture.name}: no license"


def test_megatrons_printed_shard_count_agrees_with_the_configuration_read():
    """Megatron's own 'Number of parameters in most loaded shard' (report_theoretical_memory)
    against the same count worked out from the configuration MemScope read: within 0.5% on
    both published logs that print it, so no note."""
    from memscope.inputs.log_document import megatron_shard_params
    from memscope.inputs.log_spec import run_spec
    from memscope.inputs.training_log import read_runs

    for name, vocab, printed in (("gpt2_345m_tp4_fp16_two_runs.log", None, 0.0885),
                                 ("qwen2_0.5b_bf16_dp2.log", 151936, 0.6302)):  # fmt: skip
        run = read_runs([str(DATA / name)])[0]
        assert run.shard_params_b == printed
        ours = megatron_shard_params(run_spec(run, LogOptions(vocab_size=vocab)).spec) / 1e9
        assert abs(ours - printed) <= 0.005 * printed
        notes = analyze_logs([str(DATA / name)], LogOptions(vocab_size=vocab))["runs"][0]["notes"]
        assert not [n for n in notes if "most loaded shard" in n]


HOST_PREFIX_LOG = DATA / "dense_1.7b_bf16_dp252_distopt_hostprefix.log"


def test_a_252_gpu_log_with_host_prefixes_and_only_a_command_line_is_explained():
    """open-sci-ref's 1.7B run on 63 x 4 GPUs (OpenEuroLLM/notebooks): a bare
    ``pretrain_gpt.py --flags`` line, ``[host:N]:`` prefixes, the world size from --world-size
    (the command has no torchrun); the distributed optimizer shards over DP 252."""
    options = LogOptions(vocab_size=50277, world_size=252)
    run = analyze_logs([str(HOST_PREFIX_LOG)], options)["runs"][0]
    config = run["config"]
    assert config["origin"] == "command line" and config["world_origin"] == "--world-size"
    layout = config["layout"]
    assert (layout["tp"], layout["pp"], layout["dp"]) == (1, 1, 252)
    assert layout["distributed_optimizer"] and layout["vocab_size"] == 50304
    (row,) = run["ranks"]
    assert row["rank"] == 0 and row["iteration"] == 50 and row["optimizer_steps"] == 50
    assert row["measured"]["max_allocated"] == round(50277.15625 * MIB)
    # the last rank (251) printed the iteration lines under "[lrdn3321:3]:": that 3 is no
    # global rank, and the run says so
    assert [n for n in run["notes"] if "not global ranks" in n]
