"""MoE and MLA terms that cannot run on CPU (Transformer Engine's fused permute, the shared
experts' side stream under sequence parallelism, TE's MLA latents) or that are assumptions
(token imbalance): each one's direction and size on a small config, and the report's range of
the imbalance assumption. The CPU-measurable terms are checked against real megatron-core
modules in tests/test_static_moe_activations.py and tests/test_static_mla_activations.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from memscope.analysis.static.activations import dims, layer_saved, recompute_discarded
from memscope.analysis.static.coverage import config_coverage
from memscope.analysis.static.estimator import estimate_all_ranks, estimate_rank
from memscope.analysis.static.mla import mla_saved, mla_up_proj_discarded
from memscope.analysis.static.moe import (
    dispatcher_held,
    imbalance_bound,
    moe_layer_saved,
    routed_rows,
    routing_drift,
)
from memscope.analysis.static.report import build_static_report
from memscope.inputs.megatron_args import spec_from_megatron_args

S, B, H, E, K, TP = 64, 2, 64, 8, 2, 2
T = S // TP * B  # tokens per rank under sequence parallelism


def _spec(**kw: Any) -> Any:
    args: dict[str, Any] = dict(
        num_layers=2, hidden_size=H, num_attention_heads=4, num_experts=E, moe_router_topk=K,
        moe_ffn_hidden_size=32, moe_token_dispatcher_type="alltoall",
        tensor_model_parallel_size=TP, sequence_parallel=True, expert_model_parallel_size=2,
        world_size=4, padded_vocab_size=128, seq_length=S, micro_batch_size=B,
        global_batch_size=2 * B, bf16=True, swiglu=True, transformer_impl="transformer_engine",
        disable_bias_linear=True,
    )  # fmt: skip
    return spec_from_megatron_args({**args, **kw})


def _moe(spec: Any) -> dict[str, int]:
    return moe_layer_saved(spec, S, B, TP, 2)


def test_fused_permute_keeps_an_int32_row_map_instead_of_indices_and_transposed_copies():
    plain, fused = _spec(), _spec(moe_permute_fusion=True)
    r = 2  # bf16 router
    saved = _moe(plain)["moe_dispatcher"] - _moe(fused)["moe_dispatcher"]
    # unfused: int64 indices of T k rows + transposed probs and mask; fused: int32 [E, T]
    assert saved == 8 * T * K + (r + 1) * T * E - 4 * E * T
    assert _moe(plain)["moe_experts"] == _moe(fused)["moe_experts"]


EP, ETP = 2, TP  # expert tensor parallelism defaults to tensor parallelism
GATHERED, LOCAL = T * ETP * EP, E // EP  # the allgather dispatcher's tokens and local experts


def test_fused_allgather_still_keeps_its_own_masked_select_copies():
    plain = _spec(moe_token_dispatcher_type="allgather")
    fused = _spec(moe_token_dispatcher_type="allgather", moe_permute_fusion=True)
    n, r = routed_rows(plain, T), 2
    # token_dispatcher.py dispatch_postprocess line 304 runs fused or not: only the int64 sort
    # indices of n rows become TE's int32 [E_l, T G] row map
    saved = _moe(plain)["moe_dispatcher"] - _moe(fused)["moe_dispatcher"]
    assert saved == 8 * n - 4 * LOCAL * GATHERED
    assert _moe(fused)["moe_dispatcher"] >= (r + 1) * GATHERED * LOCAL


@pytest.mark.parametrize("dispatcher", ["alltoall", "alltoall-fused", "allgather"])
def test_moe_recompute_keeps_what_each_dispatcher_holds_as_attributes(dispatcher):
    kw: dict[str, Any] = dict(moe_token_dispatcher_type=dispatcher.split("-")[0])
    if dispatcher.endswith("fused"):
        kw.update(moe_permute_fusion=True)
    spec = _spec(recompute_granularity="selective", recompute_modules=["moe"], **kw)
    whole, kept = _moe(spec), dispatcher_held(spec, S, B, TP, 2)
    n, r = routed_rows(spec, T), 2
    expected = {
        # int64 sort indices of T k rows, probs and routing_map [T, E], int64 counts [etp E]
        "alltoall": 8 * T * K + (r + 1) * T * E + 8 * E * ETP,
        # TE's row map, probs, routing_map, counts: the whole dispatcher term stays
        "alltoall-fused": whole["moe_dispatcher"],
        # local_map [T G, E_l], int64 sort indices of n rows, local_probs (r n)
        "allgather": GATHERED * LOCAL + 8 * n + r * n,
    }
    assert kept == expected[dispatcher]
    x = dims(spec)
    assert recompute_discarded(spec, x, layer_saved(spec, x))["moe"] == sum(whole.values()) - kept


def test_shared_expert_overlap_keeps_the_gathered_input_under_sequence_parallelism():
    shared = dict(moe_shared_expert_intermediate_size=48)
    plain, overlap = _spec(**shared), _spec(**shared, moe_shared_expert_overlap=True)
    extra = _moe(overlap)["moe_shared_experts"] - _moe(plain)["moe_shared_experts"]
    assert extra == (S - S // TP) * B * H * 2
    no_sp = _spec(**shared, moe_shared_expert_overlap=True, sequence_parallel=False)
    assert moe_layer_saved(no_sp, S, B, 1, 2) == moe_layer_saved(
        _spec(**shared, sequence_parallel=False), S, B, 1, 2
    )


def test_token_imbalance_scales_the_experts_not_the_router_or_the_local_permute():
    balanced = _spec()
    skewed = _spec(moe_token_imbalance=1.5)
    assert imbalance_bound(balanced) == 2.0  # ep 2, top-2 of 4 local experts
    assert routed_rows(skewed, T) == 1.5 * routed_rows(balanced, T)
    a, b = _moe(balanced), _moe(skewed)
    assert (a["moe_router"], a["moe_dispatcher"]) == (b["moe_router"], b["moe_dispatcher"])
    assert b["moe_experts"] == pytest.approx(1.5 * a["moe_experts"], rel=1e-3)
    with pytest.raises(ValueError, match="moe_token_imbalance"):
        _spec(moe_token_imbalance=0.5)


def test_report_shows_the_peak_at_balanced_routing_and_at_the_bound():
    spec = _spec(moe_token_imbalance=1.25)
    estimates = estimate_all_ranks(spec)
    merged = {"num_experts": E}
    report = build_static_report(spec, estimates, estimates[-1], None,
                                 config_coverage(merged, spec).to_dict())  # fmt: skip
    block = report["summary"]["moe_token_imbalance"]
    assert block["assumed"] == 1.25 and block["bound"] == 2.0
    here = estimates[-1].peak_memory_bytes
    assert block["peak_bytes_balanced"] < here < block["peak_bytes_at_bound"]
    assert any("imbalance bound 2" in line for line in report["coverage"]["approximated"])
    # capacity-limited routing has no dropless range
    capped = _spec(moe_expert_capacity_factor=1.0)
    rank = estimate_all_ranks(capped)
    assert "moe_token_imbalance" not in build_static_report(capped, rank, rank[-1])["summary"]


def test_te_mla_latents_are_local_tokens_and_up_proj_recompute_keeps_its_inputs():
    mla = dict(num_experts=None, expert_model_parallel_size=1, multi_latent_attention=True,
               q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4,
               v_head_dim=12, qk_layernorm=True, normalization="RMSNorm")  # fmt: skip
    spec = _spec(**mla)
    a, rows = 4 // TP, S // TP * B
    items = mla_saved(spec, S, B, a, TP, 2)
    # TE fuses each latent norm into its up projection: input, output, one fp32 statistic
    assert items["mla_q_latent"] == 2 * rows * 24 * 2 + rows * 4
    assert items["mla_kv_latent"] == 2 * rows * 16 * 2 + rows * 4
    assert items["attention_qkv"] == S * B * a * (2 * 12 + 12) * 2
    assert "rope_cos_sin" not in items  # fused MLA RoPE (the default)
    dropped = mla_up_proj_discarded(spec, S, B, a, TP, 2)
    kept = rows * 24 * 2 + rows * (16 + 4) * 2 + S * B * 4 * 2  # q, kv_combined, k_pos_emb
    assert dropped == items["attention_qkv"] + items["mla_q_latent"] + items["mla_kv_latent"] - kept
    recompute = _spec(**mla, recompute_granularity="selective",
                      recompute_modules=["mla_up_proj", "layernorm"])  # fmt: skip
    x = dims(recompute)
    out = recompute_discarded(recompute, x, layer_saved(recompute, x))
    assert out["mla_up_proj"] == dropped
    # MLA's input norm is a separate TENorm (its down projections are plain TELinear)
    full = layer_saved(recompute, x)
    assert out["layernorm"] == (full["norm_outputs"] + full["norm_statistics"]) // 2


def test_the_moe_peak_grows_with_the_assumed_imbalance():
    low = estimate_rank(_spec(), estimate_all_ranks(_spec())[-1].position)
    high_spec = _spec(moe_token_imbalance=2.0)
    high = estimate_rank(high_spec, low.position)
    assert high.activations.total_bytes > low.activations.total_bytes
    assert high.persistent.total_bytes == low.persistent.total_bytes
    assert dataclasses.replace(high_spec.model, moe_token_imbalance=1.0) == _spec().model


@pytest.mark.parametrize("impl", ["transformer_engine", "local"])
def test_mlp_recompute_drops_the_fused_pre_mlp_norm_only_under_transformer_engine(impl):
    spec = _spec(num_experts=None, expert_model_parallel_size=1, transformer_impl=impl,
                 recompute_granularity="selective", recompute_modules=["mlp"])  # fmt: skip
    x = dims(spec)
    full = layer_saved(spec, x)
    dropped = recompute_discarded(spec, x, full)["mlp"]
    norm = (full["norm_outputs"] + full["norm_statistics"]) // 2
    assert dropped == full["mlp"] + (norm if impl == "transformer_engine" else 0)


# ---------------------------------------------------------------------------------------------
# Routing drift: independent per-token routing, checked against megatron-core's TopKRouter


def _router_counts(rank: int, world: int, port: int, cfg: dict[str, Any]) -> list[int]:
    """Per trial, the top-k picks of ``tokens`` i.i.d. Gaussian hidden states that the real
    ``TopKRouter`` (at init) sends to experts ``0 .. local-1``."""
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from harness.moe_cpu import build_moe_layer, install_moe_cpu_stand_ins
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from memscope.demo.tiny_gpt import destroy_process, quiet_megatron_cpu_warnings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    quiet_megatron_cpu_warnings()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(minutes=5),
    )  # fmt: skip
    try:
        install_moe_cpu_stand_ins()
        parallel_state.initialize_model_parallel()
        torch.manual_seed(1234)
        model_parallel_cuda_manual_seed(1234)
        layer = build_moe_layer(cfg)
        counts = []
        with torch.no_grad():
            for _ in range(cfg["trials"]):
                x = torch.randn(cfg["tokens"], 1, cfg["h"])
                _, routing_map = layer.router(x)
                counts.append(int(routing_map[:, : cfg["local"]].sum()))
        return counts
    finally:
        destroy_process()


@pytest.mark.integration
@pytest.mark.multiprocess
def test_routing_drift_is_the_real_routers_per_token_spread_and_small():
    import statistics

    from memscope.demo.launcher import free_port, spawn

    experts, k, local, tokens = 8, 2, 2, 512
    cfg = dict(h=64, f_e=64, E=experts, k=k, ep=1, dispatcher="alltoall", dtype="float32",
               trials=300, tokens=tokens, local=local)  # fmt: skip
    [counts] = spawn(1, _router_counts, free_port(), cfg)
    # the real router picks k distinct experts per token; i.i.d. tokens make the count a sum
    # of i.i.d. per-token picks: its spread is the hypergeometric one (the shares of a fixed
    # random init are near, not exactly, uniform: within 30%)
    q = local / experts
    per_token = k * q * (1 - q) * (experts - k) / (experts - 1)
    ratio = statistics.variance(counts) / (tokens * per_token)
    assert 0.7 < ratio < 1.3, ratio
    # what it means for a benchmark-sized case: EP 4 of 8 experts, top-2, 4096 tokens a rank,
    # 12 MoE layers, 50 logged steps: under 1% more rows at the busiest step (a bound), and
    # more tokens, layers or experts per rank shrink it; few steps raise it
    spec = _spec(tensor_model_parallel_size=1, sequence_parallel=False,
                 expert_model_parallel_size=4, world_size=4, global_batch_size=8)  # fmt: skip
    drift = routing_drift(spec, tokens=4096, layers=12, iterations=50)
    assert 1.0 < drift < 1.01
    assert routing_drift(spec, tokens=4096, layers=12, iterations=1000) > drift
    assert routing_drift(spec, tokens=8192, layers=12, iterations=50) < drift
    assert routing_drift(spec, tokens=4096, layers=12, iterations=1) == 1.0
