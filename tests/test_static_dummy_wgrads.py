"""Transformer Engine's cached placeholder weight gradients (``dummy_wgrads.py``), counted by
hand: one ``[out, in]`` tensor per distinct weight shape of the linears that take the
placeholder path, in the parameters' dtype; which linears, by Transformer Engine release,
megatron-core release and layer implementation."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from memscope.analysis.static.dummy_wgrads import dummy_wgrad_bytes
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.analysis.static.spec_checks import validate_spec
from memscope.analysis.static.workspaces import te_release_at_least
from memscope.inputs.config_files import load_config
from memscope.inputs.megatron_args import spec_from_megatron_args

MIB = 2**20
# h=64, 8 heads (head dim 8), 2 query groups, f=256, V=1024, bf16; fused wgrad accumulation
BASE: dict[str, Any] = dict(
    num_layers=2, hidden_size=64, num_attention_heads=8, num_query_groups=2,
    group_query_attention=True, ffn_hidden_size=256, padded_vocab_size=1024, seq_length=128,
    micro_batch_size=1, global_batch_size=8, bf16=True, gradient_accumulation_fusion=True,
)  # fmt: skip
QKV = (8 + 2 * 2) * 8 * 64  # [96, 64]
PROJ = 64 * 64
FC1 = FC2 = 256 * 64  # [256, 64] and [64, 256]: two shapes
OUTPUT = 1024 * 64


def _spec(te: str | None = "2.14.0", megatron_core: str | None = None, **overrides: Any) -> Any:
    spec = spec_from_megatron_args({**BASE, **overrides}, megatron_core=megatron_core)
    return dataclasses.replace(spec, device="cuda", transformer_engine_version=te)


def _bytes(spec: Any, pp_rank: int = 0) -> int:
    position = RankPosition(pp_rank=pp_rank)
    return dummy_wgrad_bytes(spec, rank_params(spec, position), pp_rank)


def test_one_placeholder_per_distinct_weight_shape_in_the_parameters_dtype():
    spec = _spec(untie_embeddings_and_output_weights=True)
    # two layers of one shape each; fc1 and fc2 are two shapes; the output layer's
    assert _bytes(spec) == 2 * (QKV + PROJ + FC1 + FC2 + OUTPUT)
    fp32 = _spec(untie_embeddings_and_output_weights=True, bf16=False)
    assert _bytes(fp32) == 4 * (QKV + PROJ + FC1 + FC2 + OUTPUT)
    # equal shapes share one tensor: f = h makes fc1, fc2 and the projection one [64, 64]
    square = _spec(untie_embeddings_and_output_weights=True, ffn_hidden_size=64)
    assert _bytes(square) == 2 * (QKV + PROJ + OUTPUT)


def test_a_tied_output_layer_runs_on_the_word_embeddings_shape_and_a_first_stage_has_none():
    assert _bytes(_spec()) == 2 * (QKV + PROJ + FC1 + FC2 + OUTPUT)  # tied, one stage
    pp2 = _spec(pipeline_model_parallel_size=2, untie_embeddings_and_output_weights=True)
    assert _bytes(pp2, 0) == 2 * (QKV + PROJ + FC1 + FC2)  # the embedding takes no placeholder
    assert _bytes(pp2, 1) == 2 * (QKV + PROJ + FC1 + FC2 + OUTPUT)


def test_none_without_fused_accumulation_on_cpu_without_te_or_before_its_cache():
    assert _bytes(_spec(gradient_accumulation_fusion=False)) == 0
    assert _bytes(dataclasses.replace(_spec(), device="cpu")) == 0
    assert _bytes(_spec(te="none")) == 0  # not installed: Megatron's fresh torch.empty
    assert _bytes(_spec(te="2.2.0")) == 0
    assert _bytes(_spec(te="2.2.0.dev0")) == 0  # TE main before the cache
    assert _bytes(_spec(te="2.2.1")) > 0  # the cache cherry-picked into 2.2.1
    assert _bytes(_spec(te="2.3.0")) > 0
    assert _bytes(_spec(te=None)) > 0  # the assumed 2.17


def test_megatrons_own_linears_take_it_from_megatron_core_0_14_rc4():
    before = _spec(megatron_core="0.14.0rc3", untie_embeddings_and_output_weights=True)
    assert _bytes(before) == 2 * (QKV + PROJ + FC1 + FC2)  # TE's layers only
    local = _spec(megatron_core="0.16.1", transformer_impl="local")
    assert _bytes(local) == 2 * (QKV + PROJ + FC1 + FC2 + OUTPUT)
    old_local = _spec(megatron_core="0.13.0", transformer_impl="local")
    assert _bytes(old_local) == 0


def test_experts_hold_one_shape_each_and_the_legacy_grouped_mlp_none():
    moe = dict(num_experts=4, moe_ffn_hidden_size=32, expert_model_parallel_size=1,
               untie_embeddings_and_output_weights=True, disable_bias_linear=True)  # fmt: skip
    experts = 32 * 64 + 64 * 32  # one expert's fc1 [32, 64] and fc2 [64, 32]
    dense = QKV + PROJ + OUTPUT
    grouped = _spec(megatron_core="0.16.1", moe_grouped_gemm=True, **moe)  # TEGroupedMLP
    assert _bytes(grouped) == 2 * (dense + experts)
    # GroupedLinear takes the cached placeholder from TE 2.10 (before: a fresh one)
    grouped_2_9 = _spec(te="2.9.0", megatron_core="0.16.1", moe_grouped_gemm=True, **moe)
    assert _bytes(grouped_2_9) == 2 * dense
    sequential_2_9 = _spec(te="2.9.0", megatron_core="0.16.1", **moe)  # TE Linear per expert
    assert _bytes(sequential_2_9) == 2 * (dense + experts)
    sequential = _spec(megatron_core="0.16.1", **moe)  # one TE MLP per expert
    assert _bytes(sequential) == 2 * (dense + experts)
    legacy = _spec(megatron_core="0.16.1", moe_grouped_gemm=True, transformer_impl="local", **moe)
    assert _bytes(legacy) == 2 * dense  # GroupedMLP's own grouped GEMM (before 0.17)


def test_the_estimate_holds_them_from_the_first_backward_on_as_a_fixed_buffer():
    spec = _spec()
    with_them, without = (
        estimate_rank(s, RankPosition()) for s in (spec, _spec(te="2.2.0"))
    )  # fmt: skip
    held = with_them.workspaces["te_dummy_wgrads"]
    assert held == 2 * (QKV + PROJ + FC1 + FC2 + OUTPUT)
    assert "te_dummy_wgrads" not in without.workspaces
    assert with_them.steady_bytes - without.steady_bytes == held
    assert with_them.components()["other"] - without.components()["other"] == held


def test_the_docs_figures_for_the_example_config_are_the_estimators():
    """docs/static-estimator.md: 104 MiB on a Llama-3 8B TP 4 stage, plus the output layer's
    251.0 MiB on the last."""
    spec, _ = load_config("configs/static/llama3_8b_tp4_pp2.json", None, None)
    spec = validate_spec(dataclasses.replace(spec, device="cuda"))
    first, last = (_bytes(spec, stage) for stage in (0, 1))
    with open("docs/static-estimator.md", encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    assert f"stage that is {first / MIB:.0f} MiB, plus the output layer's " in docs
    assert f"{(last - first) / MIB:.1f} MiB on the last" in docs


@pytest.mark.parametrize(
    ("version", "first", "expected"),
    [("2.14.0", (2, 3), True), ("2.3.0", (2, 3), True), ("2.3.0.dev0", (2, 3), False),
     ("2.6.0a0", (2, 6), False), ("2.6.0a0", (2, 3), True), ("2.13.0+9f1a2b", (2, 11), True),
     ("2.10.1", (2, 11), False), (None, (2, 17), True), ("2.2.1", (2, 2, 1), True),
     ("2.2.0", (2, 2, 1), False), ("2.3.0.dev0", (2, 2, 1), True), ("none", (1, 0), False),
     ("2.11.0+c188b533", (2, 11), True)],
)  # fmt: skip
def test_transformer_engine_releases_compare_with_pre_releases_before_their_release(
    version, first, expected
):
    assert te_release_at_least(version, first) is expected


def test_a_transformer_engine_release_that_is_no_version_is_refused():
    with pytest.raises(ValueError, match="not a release number"):
        validate_spec(_spec(te="latest"))


def test_the_spec_and_the_log_options_refuse_the_same_machine_values():
    from memscope.inputs.log_spec import LogOptions

    for gpu, te in (("z100", None), (None, "latest")):
        with pytest.raises(ValueError) as from_spec:
            validate_spec(dataclasses.replace(_spec(), gpu=gpu, transformer_engine_version=te))
        with pytest.raises(ValueError) as from_log:
            LogOptions(gpu=gpu, transformer_engine_version=te)
        assert str(from_spec.value) == str(from_log.value)


def test_a_run_without_transformer_engine_is_said_to_have_none():
    from memscope.analysis.static.coverage import assumptions

    said = assumptions(_spec(te="none"))
    assert "Transformer Engine none: not installed (no TE workspaces or placeholder " in " ".join(
        said
    )


def test_the_benchmark_cases_carry_the_transformer_engine_their_commit_builds():
    with open("tests/data/published_cases.json", encoding="utf-8") as f:
        cases = {c["name"]: c["source"] for c in json.load(f)["cases"]}
    # uv.lock at 4e85d74ae9 resolves pyproject.toml's rev 71bbefbf15: TE 2.14.0
    rl = cases["gpt_grpo_tp4_pp1_dp2_8b_throughput"]
    assert rl["transformer_engine_version"] == "2.14.0+71bbefbf"
    assert rl["transformer_engine_source"] == "uv.lock"
    # a branch pin (rev = "release_v2.11") is read from uv.lock's resolved version
    assert cases["gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed"]["transformer_engine_version"] == (
        "2.11.0+c188b533"
    )
    versions = [source["transformer_engine_version"] for source in cases.values()]
    assert all(te_release_at_least(v, (1, 0)) for v in versions)  # every one reads


def test_in_run_the_estimate_follows_the_installed_transformer_engine(monkeypatch):
    from importlib import metadata

    from memscope.inputs import runtime_estimate

    installed: dict[str, str] = {}

    def version(name: str) -> str:
        if name in installed:
            return installed[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    assert runtime_estimate.installed_transformer_engine() == "none"
    installed["transformer_engine"] = "2.14.0"
    assert runtime_estimate.installed_transformer_engine() == "2.14.0"
    parallel = type("Parallel", (), {"dp_size": 1})()
    spec = runtime_estimate._rank_spec(dict(BASE), parallel, "cuda")
    assert spec.transformer_engine_version == "2.14.0"


def test_without_transformer_engine_a_local_moe_router_keeps_no_te_workspace():
    from memscope.analysis.static.workspaces import workspace_terms

    moe = dict(num_experts=4, moe_ffn_hidden_size=32, transformer_impl="local")
    assert "te_cublas_workspace" in workspace_terms(_spec(te=None, **moe))  # TE assumed
    assert "te_cublas_workspace" not in workspace_terms(_spec(te="none", **moe))
