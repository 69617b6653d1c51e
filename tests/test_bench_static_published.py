"""tools/bench_static_published.py: the committed output is what the tool prints today (it fails
when an estimator change moves a figure without re-running the benchmark), every case names its
source, and flags newer than the 0.15 parser that the estimator reads (Muon, fine-grained
offloading) reach it as Megatron-LM at the source commit sets them."""

from __future__ import annotations

import json
import os
import sys

import pytest
from flagscale_trees import ROOT, pristine_tree

sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_static_published as bench

pytestmark = pytest.mark.integration

TXT = os.path.join(ROOT, "benchmarks", "static_published.txt")
JSON = os.path.join(ROOT, "benchmarks", "static_published.json")


@pytest.fixture(scope="module")
def result() -> dict:
    return bench.run(pristine_tree())


def test_committed_benchmark_output_is_what_the_tool_prints_now(result):
    with open(TXT, encoding="utf-8") as f:
        committed = f.read().rstrip("\n")
    assert bench.render(result) == committed, (
        "benchmarks/static_published.txt is stale: run "
        "`python tools/bench_static_published.py --json benchmarks/static_published.json "
        "> benchmarks/static_published.txt`"
    )
    with open(JSON, encoding="utf-8") as f:
        assert json.load(f)["summary"] == json.loads(json.dumps(result["summary"]))
    with open(os.path.join(ROOT, "docs", "static-estimator.md"), encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    assert f"Last run: {bench.doc_figures(result['summary'])}." in docs
    aside = len(bench.FEATURE_NAMES & {r["name"] for r in result["inferred"]})
    features = bench.doc_figures(result["features"])
    assert f"tree alone: {features} ({aside} more have no public world size: below)." in docs
    inferred = bench.doc_figures(result["inferred_summary"])
    assert f"inferred from the steady allocation (below): {inferred}." in docs
    i, s = result["inferred_summary"], result["summary"]
    assert len(i["within_imbalance_range"]) == i["dropless_moe"] > 0  # "all lie inside"
    assert len(s["within_imbalance_range"]) < s["dropless_moe"]  # "most do, not all"
    assert "peaks all lie inside our imbalance ranges (on the CI shapes most do, not all)" in docs
    proxy = next(r for r in result["inferred"] if r["name"].startswith("deepseekv3_proxy"))
    smallest = min(proxy["world_size_fit"], key=int)
    assert proxy["world_size"] == int(smallest)
    fit = f"{100 * proxy['world_size_fit'][smallest]:+.1f}%"
    assert f"ours is {fit} of the measured steady allocation" in docs
    assert f"its expert parallelism admits ({smallest} GPUs)" in docs
    releases = sorted(
        {
            tuple(map(int, r["source"]["megatron_core_version"].split(".")[:2]))
            for r in result["rows"]
        }
    )
    (a, b), (c, d) = releases[0], releases[-1]
    assert f"the column `mcore`: {a}.{b} to {c}.{d})" in docs
    errors = {r["name"]: r["error"] for r in result["rows"]}
    for name in result["summary"]["over_5_percent"]:  # each named with its figure
        assert f"`{name}`, {100 * errors[name]:+.1f}%)" in docs, name


def test_every_case_names_its_source_and_nothing_is_dropped(result):
    cases = bench.load_cases()
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)) and {c["family"] for c in cases} <= set(bench.FAMILIES)
    assert set(names) >= bench.FEATURE_NAMES  # the features new since the FlagScale tree
    listed = [r["name"] for r in [*result["rows"], *result["inferred"], *result["separate"]]]
    assert sorted(listed) == sorted(names)
    assert result["summary"]["cases"] + result["inferred_summary"]["cases"] == len(cases)
    # the inferred line counts the cases it infers, every one estimated or listed with why
    assert result["inferred_summary"]["cases"] == len(result["inferred"]) + sum(
        1 for s in result["separate"] if "admit" in s["reason"]
    )
    inferred = {r["name"] for r in result["inferred"]}
    assert result["features"]["cases"] == len(bench.FEATURE_NAMES - inferred)
    for case in cases:
        src = case["source"]
        assert src["repo"] == bench.SOURCE_REPO and len(src["commit"]) == 40
        # listed under its name at the source commit; measured (and configured) at the commit
        # that last wrote its golden values, under the name it had then
        folder = f"{bench.CASES_DIR}/{case['family']}/{case['name']}"
        assert src["listed_at"] == f"{bench.SOURCE_COMMIT}:{folder}"
        assert src["measured"].rsplit("/", 1)[0] == src["config"].rsplit("/", 1)[0]
        assert src["config"].endswith("/model_config.yaml")
        assert src["megatron_core_version"].startswith("0.")
        # an excerpt, not the golden file: two numbers and where they came from
        assert set(case["measured"]) == {
            "golden_file", "steady_bytes", "steady_iteration", "peak_bytes", "peak_iteration",
            "iterations",
        }  # fmt: skip
    for row in [*result["rows"], *result["inferred"]]:
        m = row["measured"]
        assert row["error"] == pytest.approx(
            (row["estimate"]["peak_bytes"] - m["peak_bytes"]) / m["peak_bytes"]
        )


def test_cases_left_out_say_why(result):
    # only runs whose model a private checkpoint shapes (--use-checkpoint-args)
    cases = {c["name"]: c for c in bench.load_cases()}
    assert result["separate"]
    for s in result["separate"]:
        assert s["reason"].startswith("architecture from a checkpoint"), s["reason"]
        missing = bench.architecture_from_checkpoint(cases[s["name"]]["model_args"])
        assert missing and s["reason"].endswith(", ".join(missing))  # nothing refused
    assert bench._vocab_unknown({"--tokenizer-type": "GPT2BPETokenizer"}) is None
    unknown = {"--tokenizer-type": "GPTSentencePieceTokenizer", "--tokenizer-model": "x.model"}
    assert "x.model" in bench._vocab_unknown(unknown)


def test_a_checkpoint_consistency_case_is_its_first_runs_world_size():
    # run_ci_test.sh runs MODEL_ARGS first; the harness reads the first events file
    config = {
        "MODEL_ENV_VARS": {
            "MODEL_ARGS": {"GPUS_PER_NODE": 1}, "MODEL_ARGS_2": {"GPUS_PER_NODE": 2},
        },
        "MODEL_ARGS": {}, "MODEL_ARGS_2": {}, "MODEL_ARGS_3": {},
    }  # fmt: skip
    world, source = bench.consistency_world_size(config, 16, "recipe.yaml")
    assert world == 2 and "3 configurations" in source and "x 2 node(s)" in source
    config["MODEL_ENV_VARS"]["MODEL_ARGS"]["GPUS_PER_NODE"] = 2
    assert bench.consistency_world_size(config, 8, "recipe.yaml")[0] == 2
    with pytest.raises(ValueError, match="without a DGX recipe"):
        bench.consistency_world_size(config, None, "no recipe")
    (case,) = [c for c in bench.load_cases() if "checkpoint-consistency" in c["world_size_source"]]
    assert case["world_size"] == 1 and "MODEL_ARGS, GPUS_PER_NODE 1" in case["world_size_source"]
    assert case["model_args"]["--tensor-model-parallel-size"] == 1  # MODEL_ARGS, not a later run


def test_a_one_step_run_from_a_checkpoint_without_its_optimizer_peaks_before_the_moments(result):
    (row,) = [r for r in result["rows"] if r["estimate"]["peak_stage"] == "first_step"]
    assert row["measured"]["iterations"] == [1, 1]
    case = next(c for c in bench.load_cases() if c["name"] == row["name"])
    assert case["model_args"]["--no-load-optim"] and case["model_args"]["--finetune"]
    steady_state = dict(case, measured={**case["measured"], "iterations": [1, 2]})
    (later,) = bench.run(pristine_tree(), [steady_state])["rows"]
    # a later step's forward/backward runs with the moments: higher by its activations
    assert later["estimate"]["peak_bytes"] > row["estimate"]["peak_bytes"] * 1.03
    assert row["estimate"]["peak_bytes"] >= row["estimate"]["steady_bytes"]
    assert abs(row["error"]) < abs(later["error"])


def test_harness_variables_are_substituted_as_envsubst_does():
    argv = bench.golden.argv_from_model_args(
        {"--seed": "${REPEAT}", "--load": "${CHECKPOINT_LOAD_PATH}/model"}
    )
    assert argv == ["--seed", "1", "--load", "${CHECKPOINT_LOAD_PATH}/model"]
    ns = type("NS", (), {"load": "/ckpt", "finetune": False, "no_load_optim": False})()
    assert bench.golden.optimizer_state_loaded(ns)
    ns.no_load_optim = True
    assert not bench.golden.optimizer_state_loaded(ns)
    ns.no_load_optim, ns.finetune = False, True
    assert not bench.golden.optimizer_state_loaded(ns)
    ns.finetune, ns.load = False, None
    assert not bench.golden.optimizer_state_loaded(ns)


def test_a_world_size_not_public_is_the_admitted_one_nearest_the_steady_allocation(result):
    cases = {c["name"]: c for c in bench.load_cases()}
    inferred = result["inferred"]
    names = {r["name"] for r in inferred}
    # the release cases (no public recipe) and the one case no recipe ran
    assert {n for n in names if n.endswith(("_release", "_release_sm", "_gb200"))} == {
        n for n, c in cases.items()
        if c["world_size"] is None and c["world_size_source"].startswith("not public")
    }  # fmt: skip
    for r in inferred:
        case = cases[r["name"]]
        fits = {int(w): f for w, f in r["world_size_fit"].items()}
        admitted = bench.world_candidates(case["model_args"])
        assert set(fits) <= set(admitted) and r["world_size"] in fits
        assert abs(fits[r["world_size"]]) == min(abs(f) for f in fits.values())
        m = case["measured"]["steady_bytes"]
        assert fits[r["world_size"]] == pytest.approx((r["estimate"]["steady_bytes"] - m) / m)
        assert r["world_size"] % bench.NODE_GPUS == 0
        # the steady allocation falls as data parallelism grows: the choice is unambiguous
        ordered = [fits[w] for w in sorted(fits)]
        assert ordered == sorted(ordered, reverse=True), r["name"]
        assert r["world_size_source"].startswith("inferred:")
    # the vocabulary of each release case comes from a published tokenizer
    vocab = {r["vocab"]["tokenizer"] for r in inferred if r["name"].endswith("_release")}
    assert vocab == {256_000, 32_000}


def test_admitted_world_sizes_follow_the_batch_and_the_model_parallel_grid():
    args = {"--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 4,
            "--global-batch-size": 48, "--micro-batch-size": 2}  # fmt: skip
    # 24 micro-batches per step: dp in {1, 2, 3, 4, 6, 8, 12, 24}; tp x pp = 8 per replica
    assert bench.world_candidates(args) == [8, 16, 24, 32, 48, 64, 96, 192]
    args["--tensor-model-parallel-size"] = 1  # 4 GPUs per replica: only even dp fill nodes
    assert bench.world_candidates(args) == [8, 16, 24, 32, 48, 96]
    args["--global-batch-size"] = 3  # one micro-batch per step and 4 GPUs: no whole node
    assert bench.world_candidates(args) == []
    args["--tensor-model-parallel-size"] = "${TP}"  # left to the launch script
    assert bench.world_candidates(args) == []


def test_a_batch_ramp_admits_the_data_parallel_sizes_every_batch_it_steps_with_divides():
    ramp = {"--global-batch-size": 1152, "--micro-batch-size": 4, "--tensor-model-parallel-size": 8,
            "--rampup-batch-size": "[384 384 97656250]"}  # fmt: skip
    # two increments of 384 over 97,656,250 samples: one per 48,828,125
    assert bench.run_batch_sizes({**ramp, "--train-samples": 19531250}) == [384]
    assert bench.run_batch_sizes({**ramp, "--train-samples": 50_000_000}) == [384, 768]
    assert bench.run_batch_sizes(ramp) == [384, 768, 1152]  # no sample count: the whole ramp
    short = bench.world_candidates({**ramp, "--train-samples": 19531250})
    assert 128 in short and 144 not in short  # dp 16 divides 384 / 4 = 96, dp 18 does not
    assert 8 * 96 in short and max(short) == 8 * 96
    assert bench.run_batch_sizes({"--micro-batch-size": 1}) is None  # any data parallel fits
    for name in ("gpt3_15b_8t_release", "gpt3_15b_8t_release_sm"):
        (case,) = [c for c in bench.load_cases() if c["name"] == name]
        assert bench.run_batch_sizes(case["model_args"]) == [384]


def test_a_case_whose_flags_admit_no_world_size_is_listed_with_that_reason():
    (case,) = [c for c in bench.load_cases() if c["name"].endswith("muon_param_layout")]
    flags = {**case["model_args"], "--global-batch-size": 4, "--micro-batch-size": 4}
    result = bench.run(pristine_tree(), [{**case, "model_args": flags}])
    assert not result["rows"] and not result["inferred"]
    (left,) = result["separate"]
    assert "admit none in whole 8-GPU nodes" in left["reason"], left["reason"]


def test_dropless_moe_rows_carry_the_imbalance_range(result):
    moe = [r for r in result["rows"] if r["parallel"]["ep"] > 1 or r["family"] == "moe"]
    assert moe and all(r["imbalance_bound"] for r in moe)
    for r in moe:
        bound = r["imbalance_bound"]
        assert bound["bound"] >= 1.0
        assert bound["peak_bytes"] >= r["estimate"]["peak_bytes"]
        # (a CUDA-graph capture, which holds no MoE tensors, is not moved by the routing)
        moves = bound["bound"] > 1.0 and r["estimate"]["peak_stage"] != "cuda_graph_capture"
        assert (bound["peak_bytes"] > r["estimate"]["peak_bytes"]) == moves
    dense = [r for r in result["rows"] if r["family"] == "gpt"]
    assert dense and not any(r["imbalance_bound"] for r in dense)


def test_newer_flags_are_set_as_megatron_main_sets_them(result):
    argv = ["--optimizer", "muon", "--use-distributed-optimizer", "--bf16"]
    assert bench.parser_argv(argv) == ["--optimizer", "adam", *argv[2:]]
    parsed = {"optimizer": "adam", "use_distributed_optimizer": True}
    # muon with the distributed optimizer is the layer-wise variant, with main's bucket
    # layout unless the (store_false) flag asks for the legacy ping-pong split
    layout = bench.with_newer_flags(argv, parsed)
    assert layout["optimizer"] == "dist_muon" and layout["use_layer_wise_param_layout"] is True
    legacy = bench.with_newer_flags([*argv, "--no-use-layer-wise-param-layout"], parsed)
    assert legacy["optimizer"] == "dist_muon" and legacy["use_distributed_optimizer"] is False
    assert legacy["use_layer_wise_param_layout"] is False
    assert legacy["muon_tp_mode"] == "duplicated"  # main's default, not megatron-core's
    plain = bench.with_newer_flags(["--optimizer", "muon", "--muon-tp-mode", "blockwise"], {})
    assert plain["optimizer"] == "muon" and plain["muon_tp_mode"] == "blockwise"
    # Megatron-FSDP's gradient dtype (the dense ZeRO-3 case sets fp32 over the bf16 default)
    fsdp = bench.with_newer_flags(["--megatron-fsdp-main-grads-dtype", "fp32"], {})
    assert fsdp["megatron_fsdp_main_grads_dtype"] == "fp32"
    assert bench.with_newer_flags([], {})["megatron_fsdp_main_grads_dtype"] == "auto"
    dense = next(r for r in result["rows"] if r["name"].endswith("zp_z3_resume_fsdp_dtensor"))
    assert dense["estimate"]["grad_bytes"] == 2 * dense["estimate"]["weight_bytes"]  # fp32
    offload = bench.with_newer_flags(
        ["--fine-grained-activation-offloading", "--offload-modules", "core_attn", "moe_act"], {}
    )
    assert offload["fine_grained_activation_offloading"] is True
    assert offload["offload_modules"] == ["core_attn", "moe_act"]
    assert offload["min_offloaded_tensor_size"] == 1024 * 1024
    assert bench.with_newer_flags(["--bf16"], {"optimizer": "adam"})["optimizer"] == "adam"
    # as the measuring commit's arguments.py had them: its defaults, no bucket layout yet
    then = {"defaults": {"muon_tp_mode": "blockwise"}, "layer_wise_param_layout": False}
    older = bench.with_newer_flags(argv, parsed, then)
    assert older["muon_tp_mode"] == "blockwise" and older["use_layer_wise_param_layout"] is False
    assert bench.with_newer_flags(argv, parsed, then | {"layer_wise_param_layout": True})[
        "use_layer_wise_param_layout"
    ]
    graphs = bench.with_newer_flags(
        ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn", "mlp"], {}
    )
    assert graphs["cuda_graph_impl"] == "transformer_engine"
    assert graphs["cuda_graph_modules"] == ["attn", "mlp"]
    rows = {r["name"]: r for r in result["rows"]}
    # Transformer Engine's graphs are modelled: the attention graphs' capture is the peak
    graphed = rows["gpt3_mcore_te_tp2_pp2_ep4_etp1_resume_torch_dist_attn_cudagraph"]
    assert graphed["warned"] == [] and graphed["estimate"]["peak_stage"] == "cuda_graph_capture"
    assert abs(graphed["error"]) < 0.05
    # in the benchmark: the Muon and offloading cases are estimated, nothing awaits a feature
    names = {r["name"] for r in result["rows"]}
    assert {
        "gpt3_moe_mcore_te_ep8_resume_torch_dist_muon",
        "gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon",
        "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading",
        "deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap",
        "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap",
    } <= names
    assert not any(s["reason"].startswith("awaiting") for s in result["separate"])


def test_cases_are_estimated_for_the_megatron_core_release_that_ran_them(result):
    # package_info.py at the commit that measured each case, recorded by --extract; not the
    # release installed here, nor the source commit's
    rows = {r["name"]: r for r in result["rows"]}
    releases = {r["source"]["megatron_core_version"] for r in rows.values()}
    # with the pre-release a main-line commit's package_info.py names
    assert {"0.12.0rc0", "0.14.0rc6", "0.18.0"} <= releases
    old = rows["gpt3_mcore_te_tp2_pp1_te_8experts2parallel_top2router"]  # measured 2025-04
    assert old["source"]["megatron_core_version"] == "0.12.0rc0"
    assert " 0.12 " in next(line for line in bench.render(result).splitlines()
                             if line.startswith("moe/" + old["name"] + " "))  # fmt: skip
    name = "gpt3_mcore_te_tp2_zp_z3_resume_torch_dist_te_8experts2parallel_top2router"
    row = rows[name]
    assert row["source"]["megatron_core_version"] == "0.16.0rc0"
    # Megatron-FSDP's main grads follow grad_reduce_in_fp32 up to 0.18 (fp32 here) and the
    # parameters' dtype from 0.19 on: estimated as 0.19 the gradients are smaller
    case = next(c for c in bench.load_cases() if c["name"] == name)
    as_019 = {**case, "source": {**case["source"], "megatron_core_version": "0.19.2"}}
    again = bench.run(pristine_tree(), [as_019])
    assert again["rows"][0]["estimate"]["grad_bytes"] < row["estimate"]["grad_bytes"]


def test_a_case_is_read_as_it_was_when_measured(result):
    rows = {r["name"]: r for r in result["rows"]}
    # measured on megatron-core 0.14 with a layout holding no 'm' (its MTP layer on the last
    # stage) and without the A2A overlap the case has had since: estimated as it ran then
    row = rows["gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental"]
    assert row["source"]["megatron_core_version"] == "0.14.0rc6"
    case = next(c for c in bench.load_cases() if c["name"] == row["name"])
    assert case["model_args"]["--pipeline-model-parallel-layout"].count("m") == 0
    assert "--overlap-moe-expert-parallel-comm" not in case["model_args"]
    # measured in 2025-04 with expert biases at expert TP 2, which 0.12 allowed
    biased = rows["gpt3_mcore_te_tp2_pp1_te_8experts2parallel_dist_optimizer"]
    assert biased["source"]["megatron_core_version"] == "0.12.0rc0"
    args = next(c for c in bench.load_cases() if c["name"] == biased["name"])["model_args"]
    assert "--disable-bias-linear" not in args and biased["parallel"]["tp"] == 2  # etp = tp
    assert abs(biased["error"]) < 0.05


def test_the_docs_figure_for_two_runs_of_one_mixtral_config_is_their_measurements():
    cases = {c["name"]: c for c in bench.load_cases()}
    first, second = (cases[f"mixtral_8x7b_alltoall_tp2pp4ep4_release{s}"] for s in ("", "_sm"))
    differing = {k for k in {**first["model_args"], **second["model_args"]}
                 if first["model_args"].get(k) != second["model_args"].get(k)}  # fmt: skip
    # only how long each ran and where it checkpoints
    assert differing == {"--exit-interval", "--load", "--save", "--save-interval",
                         "--train-samples"}  # fmt: skip
    assert first["env_vars"] == second["env_vars"]
    assert first["source"]["commit"] == second["source"]["commit"]
    a, b = first["measured"], second["measured"]
    assert a["steady_bytes"] == b["steady_bytes"]
    # the golden files name their containers: the second's a TE 2.5 one (the docs say so)
    files = [c["source"]["measured"].rsplit("/", 1)[1] for c in (first, second)]
    assert "te2.5" in files[1] and "te2.5" not in files[0], files
    gap = b["peak_bytes"] - a["peak_bytes"]
    with open(os.path.join(ROOT, "docs", "static-estimator.md"), encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    assert (
        f"(set at iterations {a['peak_iteration']} and {b['peak_iteration']}) differ by "
        f"{gap / 2**30:.2f} GiB, {100 * gap / a['peak_bytes']:.1f}% of the first" in docs
    )


def test_rl_runs_are_estimated_at_the_world_size_their_harness_launches(result):
    rows = [r for r in result["rows"] if r["source"]["config"] and "grpo" in r["name"]]
    assert rows, "the Qwen3-8B RL runs are estimated"
    for r in rows:
        assert r["world_size"] == 8  # recipe gpus: 1, _run_training.sh launches 8 a node
        assert r["parallel"]["tp"] * r["parallel"]["dp"] == 8
        assert r["vocab"]["padded"] == 152_064  # Qwen3's tokenizer padded to 128 x TP 4
    dgx = "spec:\n  nodes: 2\n  gpus: 1\n"
    gb200 = dgx + "  script: |\n    export GPUS_PER_NODE={gpus}\n"
    assert bench.golden.launched_gpus_per_node(1, dgx) == 8
    assert bench.golden.launched_gpus_per_node(4, gb200) == 4
    recipe = dgx + "products:\n  - test_case: [a_case]\n"
    assert bench.golden.read_recipes([("h100/rl.yaml", recipe)])["a_case"][0] == 16


def test_the_docs_figures_for_the_rl_runs_are_the_benchmarks(result):
    rows = {r["name"]: r for r in result["rows"]}
    plain = rows["gpt_grpo_tp4_pp1_dp2_8b_throughput"]
    graphed = rows["gpt_grpo_tp4_pp1_dp2_8b_cudagraphs_throughput"]
    steady = plain["estimate"]["steady_bytes"] - plain["measured"]["steady_bytes"]
    with open(os.path.join(ROOT, "docs", "static-estimator.md"), encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    assert (
        f"are {100 * plain['error']:+.1f}% at the peak, their steady allocation "
        f"{steady / 2**30:+.2f} GiB from the measured" in docs
    )
    assert f"live in the graphs' pool) {100 * graphed['error']:+.1f}%." in docs
    assert graphed["warned"] == ["rl_training_cuda_graphs"] and plain["warned"] == []
    # they offload the optimizer for the rollout (rl_rollout.py): the step is their peak
    assert "offload their optimizer, so their rollout stays below the training step" in docs
    assert {r["estimate"]["peak_stage"] for r in (plain, graphed)} == {"forward_backward"}
    assert rows["gpt_grpo_tp4_pp1_dp2_8b_throughput_github"]["error"] == pytest.approx(
        plain["error"], abs=0.001
    )


def test_a_model_shaped_by_its_checkpoint_names_the_flags_it_leaves_out():
    full = {f: 1 for f in bench.CHECKPOINT_ARCHITECTURE}
    assert bench.architecture_from_checkpoint(full) == []  # no --use-checkpoint-args
    assert bench.architecture_from_checkpoint({**full, "--use-checkpoint-args": True}) == []
    moe = {**full, "--use-checkpoint-args": True, "--num-experts": 8}
    assert bench.architecture_from_checkpoint(moe) == list(bench.CHECKPOINT_MOE_ARCHITECTURE)
    del full["--swiglu"]
    assert bench.architecture_from_checkpoint({**full, "--use-checkpoint-args": True}) == [
        "--swiglu"
    ]
