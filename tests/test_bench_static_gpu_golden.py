"""tools/bench_static_gpu_golden.py on real Megatron-LM functional-test cases of the FlagScale
0.8.0 tree: golden JSON + model_config.yaml -> Megatron's own parser -> the last rank's
estimate, and refused cases kept (with their reason) on the separate list."""

from __future__ import annotations

import json
import os
import sys

import pytest
from flagscale_trees import ROOT, pristine_tree

sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_static_gpu_golden as bench

pytestmark = pytest.mark.integration

TP2_PP2 = ("gpt", "gpt3_mr_mcore_te_tp2_pp2_dgx_a100_1N8G")  # TP2 PP2 DP2 on 8 GPUs
MOE = ("moe", "gpt3_mr_mcore_te_tp2_pp1_te_8experts_etp1_ep4_dgx_a100_1N8G")  # TP2 EP4 DP4
FP8 = ("gpt", "gpt3_345m_weekly_dgx_h100_1N8G_mcore_tp4_cp2_native_fp8_tp_sp_cp_tp_overlap")


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    tree = pristine_tree()
    recipes = bench.recipe_world_sizes(tree)
    release, _ = bench.versions(tree)
    cases = []
    for family, name in (TP2_PP2, MOE, FP8):
        case = bench.prepare_case(tree, family, name, "h100", "dev", recipes, release)
        assert case is not None and "reason" not in case, (name, case)
        cases.append(case)
    jobs = [{k: c[k] for k in ("name", "argv", "env", "world_size")} for c in cases]
    parsed = bench.parse_with_megatron(tree, jobs, "h100")
    out = {
        c["name"]: bench.estimate_case(c, parsed[c["name"]], megatron_core=c["megatron_core"])
        for c in cases
    }
    # The TP2 PP2 case with 3 query groups for its 8 heads: a contradiction the estimator
    # refuses (ValueError); the case must land on the separate list with that reason.
    contradictory = {**parsed[TP2_PP2[1]], "group_query_attention": True, "num_query_groups": 3}
    out["refused"] = bench.estimate_case(cases[0], contradictory)
    return out


def _golden(name_family: tuple[str, str], file: str) -> dict:
    family, name = name_family
    tree = pristine_tree()
    with open(os.path.join(bench.cases_root(tree), family, name, file), encoding="utf-8") as f:
        return json.load(f)


def test_world_size_and_last_rank(results):
    row = results[TP2_PP2[1]]
    assert "reason" not in row, row.get("reason")
    assert row["world_size"] == 8 and row["world_size_source"] == "name 1N8G"
    assert row["parallel"]["tp"] == 2 and row["parallel"]["pp"] == 2
    assert row["parallel"]["dp"] == 2  # derived by Megatron's validate_args from world size
    assert (row["rank"], row["tp_rank"], row["pp_rank"]) == (7, 1, 1)
    assert row["dtype"] == "bfloat16"
    assert row["vocab"]["tokenizer"] == bench.GPT2_BPE_VOCAB
    # estimated for the release that wrote its golden values (2025-04, megatron-core 0.12:
    # tests/data/flagscale_golden_measured_at.json), not the tree's nor the installed one
    assert row["megatron_core"] == row["measured_at"]["megatron_core_version"] == "0.12.0rc0"
    assert bench.versions(pristine_tree())[0] == "0.15.0rc5"
    moe = results[MOE[1]]
    assert "reason" not in moe, moe.get("reason")
    assert (moe["rank"], moe["tp_rank"], moe["pp_rank"]) == (7, 1, 0)
    assert moe["parallel"]["ep"] == 4 and moe["parallel"]["dp"] == 4


def test_measured_numbers_come_from_the_golden_file(results):
    row = results[TP2_PP2[1]]
    # This case has no dev_dgx_h100 file: the fallback takes dev on a100 and says so.
    assert row["measured"]["golden_file"] == "golden_values_dev_dgx_a100.json"
    data = _golden(TP2_PP2, "golden_values_dev_dgx_a100.json")
    allocated = data["mem-allocated-bytes"]["values"]
    last = max(allocated, key=int)
    assert row["measured"]["steady_bytes"] == int(allocated[last])
    assert row["measured"]["steady_iteration"] == int(last)
    peaks = data["mem-max-allocated-bytes"]["values"].values()
    assert row["measured"]["peak_bytes"] == int(max(float(v) for v in peaks))
    est = row["estimate"]
    assert 0 < est["persistent_bytes"] < est["peak_bytes"]
    assert row["ratio"] == pytest.approx(est["peak_bytes"] / row["measured"]["peak_bytes"])
    assert row["most_differing_term"] in ("steady", "transient")


def test_refused_and_unmodelled_cases_keep_their_reason(results):
    refused = results["refused"]
    assert refused["reason"].startswith("refused by the estimator: ")
    assert "query" in refused["reason"], refused["reason"]
    assert "estimate" not in refused
    assert refused["measured"]["peak_bytes"] > 0  # still listed with what was measured


def test_fp8_case_is_modelled_within_five_percent(results):
    # FP8 (delayed scaling, fp8_param_gather) is modelled from Transformer Engine's code
    fp8 = results[FP8[1]]
    assert "reason" not in fp8, fp8.get("reason")
    assert abs(fp8["error"]) < 0.05, fp8["error"]


def test_argv_follows_the_functional_test_script():
    argv = bench.argv_from_model_args(
        {"--bf16": True, "--no-foo": False, "--seq-length": 1024, "--sizes": "[2 2]",
         "--cp-sizes": "2 2", "--lr": 0.5}
    )  # fmt: skip
    assert argv == ["--bf16", "--seq-length", "1024", "--sizes", "2", "2",
                    "--cp-sizes", "2", "2", "--lr", "0.5"]  # fmt: skip
    assert bench.world_size("x_2N8G_y", {}) == (16, "name 2N8G")
    assert bench.world_size("case", {"case": 8}) == (8, "recipe nodes x GPUs per node")
    assert bench.world_size("case", {})[0] is None
