"""The estimator's megatron-core version terms (memscope/analysis/static/megatron_versions.py)
on explicit versions, whichever megatron-core is installed: what changes at 0.17 and by how
much. The measured side of each term runs on the installed megatron-core in
tests/test_static_moe_activations.py and tests/test_static_moe_mla.py (CI runs them on 0.16.1
and on the newest 0.19.x)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.megatron_versions import (
    FINAL,
    MOE_BIAS_ETP1,
    at_least,
    grouped_gemm_experts,
    legacy_grouped_mlp,
    mtp_inner_layer,
    release,
)
from memscope.analysis.static.moe import moe_layer_saved
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.analysis.static.spec_checks import validate_spec
from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = pytest.mark.megatron_versions

S, B, H, E, K = 64, 2, 64, 8, 2


def _spec(version: str | None, **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        num_layers=2, hidden_size=H, num_attention_heads=4, num_experts=E, moe_router_topk=K,
        moe_ffn_hidden_size=40, moe_token_dispatcher_type="alltoall", padded_vocab_size=128,
        seq_length=S, micro_batch_size=B, global_batch_size=B, bf16=True, swiglu=True,
        disable_bias_linear=True, transformer_impl="local",
    )  # fmt: skip
    spec = spec_from_megatron_args({**args, **kw})
    model = dataclasses.replace(spec.model, megatron_core_version=version)
    return dataclasses.replace(spec, model=model)


def test_release_reads_local_and_pre_release_versions():
    assert release("0.19.2+9fbc6af") == (0, 19, FINAL)
    assert release("0.15.0rc5") == (0, 15, 5)
    assert release("1.0") == (1, 0, FINAL)
    # a release constant (0, 15) is met by its candidates; (0, 15, 6) from rc6 on
    assert release("0.15.0rc1") >= (0, 15) > release("0.14.1")  # type: ignore[operator]
    assert release("0.15.0rc5") < MOE_BIAS_ETP1 <= release("0.15.0rc6")  # type: ignore[operator]
    assert release("0.15.0") >= MOE_BIAS_ETP1  # type: ignore[operator]
    assert release(None) is None and release("unknown") is None


def test_the_spec_carries_the_installed_megatron_core():
    import importlib.metadata

    spec = spec_from_megatron_args(dict(num_layers=1, hidden_size=8, num_attention_heads=2,
                                        padded_vocab_size=16, seq_length=4))  # fmt: skip
    assert spec.model.megatron_core_version == importlib.metadata.version("megatron-core")


@pytest.mark.parametrize("router_dtype, r", [(None, 2), ("fp32", 4)])
def test_alltoall_permute_keeps_the_int64_argsort_from_0_17(router_dtype, r):
    kw = {"moe_router_dtype": router_dtype} if router_dtype else {}
    old = moe_layer_saved(_spec("0.16.1", **kw), S, B, 1, 2)
    new = moe_layer_saved(_spec("0.19.2", **kw), S, B, 1, 2)
    assert old == moe_layer_saved(_spec(None, **kw), S, B, 1, 2)  # unknown: 0.16
    # masked_select's transposed probabilities (r bytes) and mask (1 byte) per [E, T] cell
    # give way to the int64 argsort (8 bytes); nothing else moves
    assert new["moe_dispatcher"] - old["moe_dispatcher"] == (8 - r - 1) * S * B * E
    assert {k: v for k, v in new.items() if k != "moe_dispatcher"} == {
        k: v for k, v in old.items() if k != "moe_dispatcher"
    }
    # the allgather dispatcher's permute has no probabilities: unchanged
    ag = dict(kw, moe_token_dispatcher_type="allgather")
    assert moe_layer_saved(_spec("0.19.2", **ag), S, B, 1, 2) == moe_layer_saved(
        _spec("0.16.1", **ag), S, B, 1, 2
    )


def test_local_grouped_gemm_builds_sequential_experts_from_0_17():
    kw = dict(moe_grouped_gemm=True, bias_swiglu_fusion=False)  # the unfused SwiGLU
    old, new = _spec("0.16.1", **kw), _spec("0.17.0", **kw)
    assert legacy_grouped_mlp(old.model) and not legacy_grouped_mlp(new.model)
    assert grouped_gemm_experts(old.model) and not grouped_gemm_experts(new.model)
    names = [t.name for t in rank_params(new, RankPosition())]
    assert names == [t.name for t in rank_params(_spec("0.17.0"), RankPosition())]
    assert any(n.endswith("experts.weight1") for n in
               (t.name for t in rank_params(old, RankPosition())))  # fmt: skip
    # SequentialMLP keeps the unfused SwiGLU's six f-wide rows, GroupedMLP three and its counts
    saved_old = moe_layer_saved(old, S, B, 1, 2)["moe_experts"]
    saved_new = moe_layer_saved(new, S, B, 1, 2)["moe_experts"]
    rows = S * B * K
    assert saved_new - saved_old == 3 * rows * 40 * 2 - 8 * E

    # the bias check is GroupedMLP's (experts.py asserts no bias); SequentialMLP takes one
    def with_bias(spec: Any) -> Any:
        model = dataclasses.replace(spec.model, add_bias_linear=True)
        return dataclasses.replace(spec, model=model)

    with pytest.raises(ValueError, match="moe_grouped_gemm"):
        validate_spec(with_bias(old))
    validate_spec(with_bias(new))


def test_te_spec_ignores_the_legacy_grouped_gemm_flag_from_0_17():
    kw = dict(moe_grouped_gemm=True, moe_use_legacy_grouped_gemm=True,
              transformer_impl="transformer_engine")  # fmt: skip
    assert legacy_grouped_mlp(_spec("0.16.1", **kw).model)
    new = _spec("0.19.2", **kw).model
    assert not legacy_grouped_mlp(new) and grouped_gemm_experts(new)


def test_mtp_layer_is_named_mtp_model_layer_from_0_17():
    for version, inner in (("0.16.1", "transformer_layer"), ("0.19.2", "mtp_model_layer")):
        spec = _spec(version, mtp_num_layers=1)
        assert mtp_inner_layer(spec.model) == inner
        names = [t.name for t in rank_params(spec, RankPosition())]
        assert any(n.startswith(f"mtp.layers.0.{inner}.") for n in names)
    assert at_least(_spec("0.17.0").model, (0, 17)) and not at_least(_spec(None).model, (0, 0))


def test_megatron_fsdp_gradients_take_the_named_dtype_from_0_19():
    fsdp = dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="no_shard",
                use_distributed_optimizer=True, num_experts=None, world_size=2,
                global_batch_size=2 * B)  # fmt: skip

    def grads(version: str, **kw: Any) -> int:
        spec = _spec(version, **fsdp, **kw)
        return estimate_rank(spec, RankPosition()).persistent.grad_bytes

    count = sum(t.numel for t in rank_params(_spec("0.16.1", **fsdp), RankPosition()))
    # up to 0.18 bf16 training's grad_reduce_in_fp32 makes the buffer fp32; 0.19 reads only
    # megatron_fsdp_main_grads_dtype ("auto": the bf16 parameters')
    assert grads("0.16.1") == grads("0.18.0") == 4 * count
    assert grads("0.19.2") == 2 * count
    assert grads("0.19.2", megatron_fsdp_main_grads_dtype="fp32") == 4 * count
    assert grads("0.19.2", megatron_fsdp_main_grads_dtype="auto") == 2 * count
    with pytest.raises(ValueError, match="megatron_fsdp_main_grads_dtype"):
        _spec("0.19.2", **fsdp, megatron_fsdp_main_grads_dtype="fp8")


def test_mtp_stage_embedding_copy_goes_to_adam_from_0_18():
    from memscope.analysis.static.muon import muon_managed

    pp2 = dict(num_experts=None, mtp_num_layers=1, pipeline_model_parallel_size=2,
               world_size=2, num_layers=2)  # fmt: skip

    def embedding(version: str) -> Any:
        last = rank_params(_spec(version, **pp2), RankPosition(0, 1))  # MTP's stage
        return next(t for t in last if t.name == "embedding.word_embeddings.weight")

    # language_module.py setup_embeddings_and_output_layer tags mtp_process's copy from 0.18
    assert not embedding("0.17.1").embedding_or_output and muon_managed(embedding("0.17.1"))
    assert embedding("0.18.0").embedding_or_output and not muon_managed(embedding("0.18.0"))


def test_mla_query_norm_without_query_latent_from_0_19_refused_locally_named_with_te():
    mla = dict(num_experts=None, multi_latent_attention=True, q_lora_rank=None, kv_lora_rank=16,
               qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=12)  # fmt: skip

    def spec(version: str, impl: str = "local") -> Any:
        base = _spec(version, **mla, transformer_impl=impl)  # (qk_layernorm off: any release)
        return dataclasses.replace(base, model=dataclasses.replace(base.model, qk_layernorm=True))

    validate_spec(spec("0.18.0"))  # the query is not normalised: nothing refused
    validate_spec(spec("0.19.2", "transformer_engine"))  # TE's fused norm+linear builds it
    with pytest.raises(ValueError, match="cannot build the query norm"):
        validate_spec(spec("0.19.2"))


@pytest.mark.parametrize("norm, stats", [("RMSNorm", 1), ("LayerNorm", 2)])
def test_mla_fused_query_norm_weights_and_saved_output_counted_with_te_from_0_19(norm, stats):
    """megatron-core 0.19 transformer/mla_qk_norm_config.py ``QKNormConfigResolver``: with
    ``qk_layernorm`` and no ``q_lora_rank`` TE's ``linear_q_proj`` is
    ``TELayerNormColumnParallelLinear``: ``layer_norm_weight`` [h] (``_bias`` for LayerNorm)
    more, and per layer the normalised [s, b, h] plus fp32 statistics per row kept."""
    from memscope.analysis.static.mla import mla_saved, mla_up_proj_discarded

    mla = dict(num_experts=None, multi_latent_attention=True, q_lora_rank=None, kv_lora_rank=16,
               qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=12, normalization=norm,
               transformer_impl="transformer_engine")  # fmt: skip

    def spec(version: str) -> Any:
        base = _spec(version, **mla)
        return dataclasses.replace(base, model=dataclasses.replace(base.model, qk_layernorm=True))

    old, new = spec("0.18.0"), spec("0.19.2")
    extra = {t.name: t.numel for t in rank_params(new, RankPosition())}
    for t in rank_params(old, RankPosition()):
        assert extra.pop(t.name) == t.numel
    parts = ["weight", "bias"][:stats]
    assert extra == {f"decoder.layers.{i}.self_attention.linear_q_proj.layer_norm_{p}": H
                     for i in range(2) for p in parts}  # fmt: skip
    e = 2  # bf16
    saved_old, saved_new = mla_saved(old, S, B, 2, 1, e), mla_saved(new, S, B, 2, 1, e)
    assert saved_new.pop("mla_q_norm") == S * B * H * e + stats * S * B * 4
    assert saved_new == saved_old
    # linear_q_proj runs inside mla_up_proj's checkpoint: its norm output is dropped too
    dropped = mla_up_proj_discarded(new, S, B, 2, 1, e) - mla_up_proj_discarded(old, S, B, 2, 1, e)
    assert dropped == S * B * H * e + stats * S * B * 4


def test_layer_wise_muon_bucket_layout_is_modelled_from_0_18_only_its_padding_named():
    from memscope.analysis.static.coverage import approximated_features, modelled_features

    def spec(version: str, **kw: Any) -> Any:
        return _spec(version, num_experts=None, optimizer="dist_muon", world_size=2,
                     global_batch_size=2 * B, **kw)  # fmt: skip

    def approx(version: str, **kw: Any) -> str:
        return " ".join(approximated_features(spec(version, **kw)))

    def modelled(version: str, **kw: Any) -> str:
        return " ".join(modelled_features(spec(version, **kw)))

    assert "Muon step temporaries" in approx("0.17.1") and "bucket" not in approx("0.17.1")
    assert "bucket layout pads" in approx("0.18.0")
    assert "bin-packed per DDP bucket" in modelled("0.19.2")
    legacy = dict(no_use_layer_wise_param_layout=True)
    assert "bucket" not in approx("0.19.2", **legacy) + modelled("0.19.2", **legacy)


def test_before_0_15_the_mtp_layers_sit_on_the_last_chunk_outside_the_layout():
    from memscope.analysis.static.config import chunk_roles

    args = dict(num_layers=4, hidden_size=H, num_attention_heads=4, padded_vocab_size=128,
                seq_length=S, micro_batch_size=1, global_batch_size=4, bf16=True,
                transformer_impl="local", mtp_num_layers=1, pipeline_model_parallel_size=2,
                pipeline_model_parallel_layout="Et*3|tL")  # fmt: skip
    # 0.14 (Megatron-LM before d7bf5aaaa8): a layout holds no 'm'; the MTP layer is built on
    # the last stage whatever it says
    old = spec_from_megatron_args(args, megatron_core="0.14.0")
    assert chunk_roles(old.model, old.parallel, 1, 0).mtp
    assert not chunk_roles(old.model, old.parallel, 0, 0).mtp
    mtp = [t for t in rank_params(old, RankPosition(0, 1)) if t.name.startswith("mtp.")]
    assert mtp and not any(t.name.startswith("mtp.") for t in rank_params(old, RankPosition(0, 0)))
    with pytest.raises(ValueError, match=r"0 MTP layers \(m\), mtp_num_layers is 1"):
        spec_from_megatron_args(args, megatron_core="0.16.1")  # from 0.15 it must count them
    placed = dict(args, pipeline_model_parallel_layout="Et*3|tmL")
    assert old.parallel.layout == ("Ettt", "tmL")  # as megatron-core 0.14 built it
    with pytest.raises(ValueError, match=r"before 0\.15 places no MTP layer"):
        spec_from_megatron_args(placed, megatron_core="0.14.0")
    new = spec_from_megatron_args(placed, megatron_core="0.16.1")
    assert chunk_roles(new.model, new.parallel, 1, 0).mtp


@pytest.mark.parametrize(
    "version, dispatcher, etp, allowed",
    [
        ("0.12.0", "allgather", 2, True),  # before 2659630721: biases at any expert TP
        ("0.12.0", "alltoall", 1, False),  # its alltoall dispatcher asserts bias is None
        ("0.13.0", "allgather", 1, False),  # "Bias is not supported for MoE"
        ("0.14.0", "allgather", 1, False),
        ("0.15.0rc5", "allgather", 1, False),  # FlagScale 0.8.0's: before a329dd6da5 (rc6)
        ("0.15.0rc6", "allgather", 1, True),  # a329dd6da5: ETP 1 only
        ("0.16.1", "allgather", 1, True),
        ("0.16.1", "allgather", 2, False),
    ],
)
def test_moe_expert_biases_follow_each_release(version, dispatcher, etp, allowed):
    args = dict(num_layers=2, hidden_size=H, num_attention_heads=4, num_experts=E,
                moe_router_topk=K, moe_token_dispatcher_type=dispatcher, padded_vocab_size=128,
                seq_length=S, micro_batch_size=B, global_batch_size=B * 4, bf16=True,
                transformer_impl="local", tensor_model_parallel_size=2, sequence_parallel=True,
                expert_tensor_parallel_size=etp, world_size=4)  # fmt: skip
    if allowed:
        spec = spec_from_megatron_args(args, megatron_core=version)
        assert spec.model.add_bias_linear
    else:
        with pytest.raises(ValueError, match="add_bias_linear with MoE"):
            spec_from_megatron_args(args, megatron_core=version)


@pytest.mark.parametrize("swiglu, fused, rows_before, rows_after", [
    (False, False, 2, 3),  # gelu: fc1 output, activation (+ the weighted copy from 0.13)
    (True, True, 3, 3),  # bias_swiglu: 2f input, product; weighted_bias_swiglu alike
    (True, False, 4, 5),  # unfused glu: 2f, silu, product (+ the weighted copy)
])  # fmt: skip
def test_before_0_13_the_dispatcher_weights_the_experts_output(
    swiglu, fused, rows_before, rows_after
):
    # (0.12 refuses the fused bias-GeLU without biases: transformer_config.py, so not here)
    kw: dict[str, Any] = dict(swiglu=swiglu, moe_token_dispatcher_type="allgather")
    if swiglu:
        kw["bias_swiglu_fusion"] = fused
    else:
        kw["bias_gelu_fusion"] = False
    old = moe_layer_saved(_spec("0.12.0", **kw), S, B, 1, 2)
    new = moe_layer_saved(_spec("0.14.0", **kw), S, B, 1, 2)
    n, f = S * B * K, 40  # balanced routed rows, moe_ffn_hidden_size
    # from 0.13 the experts keep an f-wide probability-weighted copy (unless it is fused into
    # the activation); before, the dispatcher kept their [n, h] output to weight it
    moved = new["moe_experts"] - old["moe_experts"]
    assert moved == (rows_after - rows_before) * n * f * 2 - n * H * 2
    assert {k: v for k, v in new.items() if k != "moe_experts"} == {
        k: v for k, v in old.items() if k != "moe_experts"
    }


def test_before_0_13_experts_with_biases_keep_their_per_row_fc2_bias():
    kw = dict(moe_token_dispatcher_type="allgather", disable_bias_linear=False)
    with_bias = moe_layer_saved(_spec("0.12.0", **kw), S, B, 1, 2)
    without = moe_layer_saved(_spec("0.12.0", moe_token_dispatcher_type="allgather"), S, B, 1, 2)
    # SequentialMLP concatenates each local expert's expanded fc2 bias; the dispatcher's
    # bias * permuted_probs keeps that [n, h] tensor; one local expert: its [h] bias, broadcast
    assert with_bias["moe_experts"] - without["moe_experts"] == S * B * K * H * 2
    one_local = dict(kw, expert_model_parallel_size=E, world_size=E, global_batch_size=B * E)
    no_bias = dict(one_local, disable_bias_linear=True)
    saved = [moe_layer_saved(_spec("0.12.0", **kw), S, B, 1, 2) for kw in (one_local, no_bias)]
    assert saved[0]["moe_experts"] == saved[1]["moe_experts"]


def test_before_0_13_alltoall_keeps_the_returned_rows_it_weights():
    # moe_utils.unpermute(probs=...) weights this rank's T k rows after the reverse
    # all-to-all: T k h, not the experts' n rows (which the imbalance and expert TP scale)
    kw = dict(moe_token_dispatcher_type="alltoall", expert_tensor_parallel_size=2,
              tensor_model_parallel_size=2, sequence_parallel=True, world_size=2,
              global_batch_size=B * 2, moe_token_imbalance=1.5)  # fmt: skip
    old = moe_layer_saved(_spec("0.12.0", **kw), S, B, 2, 2)
    new = moe_layer_saved(_spec("0.14.0", **kw), S, B, 2, 2)
    # the fused SwiGLU keeps 3 f-wide rows either way: only the weighting's input differs
    assert new["moe_experts"] - old["moe_experts"] == -(S // 2 * B * K) * H * 2
    ag = moe_layer_saved(_spec("0.12.0", **dict(kw, moe_token_dispatcher_type="allgather")),
                         S, B, 2, 2)  # fmt: skip
    ag_new = moe_layer_saved(
        _spec("0.14.0", **dict(kw, moe_token_dispatcher_type="allgather")), S, B, 2, 2
    )
    n = math.ceil(S // 2 * B * K * 2 * 1.5)  # the experts' rows: T k etp, busiest rank
    assert ag_new["moe_experts"] - ag["moe_experts"] == -n * H * 2
