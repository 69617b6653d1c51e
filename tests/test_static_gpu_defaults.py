"""Megatron's GPU defaults in the static estimator: one test per key, direction and amount.

Each test changes one Megatron argument on a small config and checks the estimate moves by
the amount the named megatron-core / torch / Transformer Engine code allocates. The
cross-entropy upcast is measured on CPU with megatron-core's real vocab-parallel cross entropy
in bf16 and the exact storage ledger.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import pytest

from memscope.analysis.static.activations import (
    buffer_bytes,
    chunk_activations,
    chunk_inputs,
    cp_attention_backward,
    cross_entropy_saved,
    dims,
    layer_saved,
    loss_moments,
)
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.moe import moe_global_buffer, moe_layer_saved, routed_rows
from memscope.analysis.static.params import RankPosition
from memscope.analysis.static.spec_checks import validate_spec
from memscope.analysis.static.workspaces import (
    MIB,
    te_userbuffer_workspace_bytes,
    te_workspace_bytes,
    torch_cublas_workspace_bytes,
    torch_default_workspace_bytes,
    workspace_terms,
)
from memscope.demo.launcher import free_port, spawn
from memscope.inputs.megatron_args import spec_from_megatron_args

# s=256 b=2 h=64 a=8 (g=2) f=256 V=1024, bf16, no dropout, 4 microbatches
BASE: dict[str, Any] = dict(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=8,
    padded_vocab_size=1024,
    seq_length=256,
    micro_batch_size=2,
    global_batch_size=8,
    bf16=True,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    # off here so that each other test sees one term; its own test turns it on
    create_attention_mask_in_dataloader=False,
)
S, B, H, V = 256, 2, 64, 1024


def spec(**overrides: Any):
    return spec_from_megatron_args({**BASE, **overrides})


def last_rank(s: Any):
    return estimate_rank(s, RankPosition(tp_rank=0, pp_rank=s.parallel.pp - 1))


def test_transformer_engine_is_the_default_and_picks_flash_attention():
    default = spec()
    assert default.model.transformer_impl == "transformer_engine" and default.flash_attention
    unfused = spec(attention_backend="unfused")
    assert not unfused.flash_attention
    local = spec(transformer_impl="local")
    assert not local.flash_attention
    assert "attention_scores" in layer_saved(local, dims(local))


def test_flash_attention_keeps_key_and_value_at_query_group_heads():
    gqa = spec(group_query_attention=True, num_query_groups=2)
    d = 64 // 8
    items = layer_saved(gqa, dims(gqa))
    assert items["attention_qkv"] == S * B * (8 + 2 * 2) * d * 2  # q at 8 heads, k/v at 2
    unfused = spec(group_query_attention=True, num_query_groups=2, attention_backend="unfused")
    assert layer_saved(unfused, dims(unfused))["attention_qkv"] == 3 * S * B * 8 * d * 2


def test_fused_bias_swiglu_keeps_three_ffn_tensors_unfused_five():
    fused, unfused = spec(swiglu=True), spec(swiglu=True, bias_swiglu_fusion=False)
    f = fused.model.ffn
    assert layer_saved(fused, dims(fused))["mlp"] == 3 * S * B * f * 2
    assert layer_saved(unfused, dims(unfused))["mlp"] == 5 * S * B * f * 2
    assert spec(swiglu=True, no_bias_swiglu_fusion=True).model.bias_activation_fusion is False


def test_bf16_logits_stay_beside_their_fp32_copy_in_the_cross_entropy():
    bf16, fp32 = spec(), spec(bf16=False)
    for s, upcast in ((bf16, S * B * V * 2), (fp32, 0)):
        x = dims(s)
        moments = loss_moments(s, x, cross_entropy_saved(s, x))
        assert moments["cross_entropy"] == upcast
        assert cross_entropy_saved(s, x) == S * B * V * 4  # the fp32 softmax, kept


def test_cross_entropy_fusion_native_adds_a_compiled_fp32_buffer_te_keeps_bf16():
    native = spec(cross_entropy_loss_fusion=True)
    te = spec(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    assert native.cross_entropy == "native" and te.cross_entropy == "te"
    x = dims(native)
    assert loss_moments(native, x, cross_entropy_saved(native, x))["cross_entropy"] == (
        S * B * V * (2 + 4)
    )
    assert cross_entropy_saved(te, dims(te)) == S * B * V * 2
    assert loss_moments(te, dims(te), S * B * V * 2)["cross_entropy"] == 0


def test_the_dataloaders_attention_mask_is_alive_at_the_loss_or_kept_by_unfused_attention():
    """GPTDataset's ``[b, 1, s/cp, s]`` bool mask (Megatron-LM's default
    ``create_attention_mask_in_dataloader``): flash attention keeps no mask, so it is only
    alive while the microbatch's forward step computes the loss; the unfused softmax's
    masked fill keeps it (instead of megatron's own ``[1, 1, s, s]`` causal mask)."""
    on = dict(create_attention_mask_in_dataloader=True)
    for cp, flash in ((1, "transformer_engine"), (2, "transformer_engine")):
        with_mask = spec(**on, context_parallel_size=cp, transformer_impl=flash)
        without = spec(context_parallel_size=cp, transformer_impl=flash)
        assert with_mask.flash_attention and with_mask.dataloader_attention_mask
        x = dims(with_mask)
        saved = cross_entropy_saved(with_mask, x)
        more = (loss_moments(with_mask, x, saved)["cross_entropy"]
                - loss_moments(without, dims(without), saved)["cross_entropy"])  # fmt: skip
        assert more == B * (S // cp) * S
    local = spec(**on, transformer_impl="local", masked_softmax_fusion=False)
    plain = spec(transformer_impl="local", masked_softmax_fusion=False)
    assert chunk_inputs(local, dims(local), first=True)["causal_mask"] == B * S * S
    assert chunk_inputs(plain, dims(plain), first=True)["causal_mask"] == S * S
    x = dims(local)
    saved = cross_entropy_saved(local, x)
    assert loss_moments(local, x, saved) == loss_moments(plain, x, saved)  # counted as saved
    assert spec().dataloader_attention_mask is False  # BASE turns it off
    assert spec_from_megatron_args({k: v for k, v in BASE.items()
                                    if k != "create_attention_mask_in_dataloader"}
                                   ).dataloader_attention_mask  # fmt: skip


def test_gradient_accumulation_fusion_drops_the_output_layer_weight_gradient_temporary():
    fused, unfused = spec(), spec(gradient_accumulation_fusion=False)
    x = dims(fused)
    a = loss_moments(fused, x, cross_entropy_saved(fused, x))["output_layer_backward"]
    b = loss_moments(unfused, x, cross_entropy_saved(unfused, x))["output_layer_backward"]
    assert b - a == V * H * 2


def test_deferred_embedding_wgrad_keeps_grad_outputs_up_to_the_limit():
    pp = dict(pipeline_model_parallel_size=2, num_layers=4, world_size=2)
    plain = spec(**pp)
    deferred = spec(**pp, defer_embedding_wgrad_compute=True)
    limited = spec(**pp, defer_embedding_wgrad_compute=True, wgrad_deferral_limit=2)
    per_microbatch = S * B * H * 2 + S * B * V * 2  # input and output gradient
    base = chunk_activations(plain, 2, first=False, last=True)[1]
    assert chunk_activations(deferred, 2, False, True)[1] - base == 3 * per_microbatch  # M - 1
    assert chunk_activations(limited, 2, False, True)[1] - base == 2 * per_microbatch
    with pytest.raises(ValueError, match="gradient_accumulation_fusion"):
        spec(**pp, defer_embedding_wgrad_compute=True, gradient_accumulation_fusion=False)
    with pytest.raises(ValueError, match="pp > 1"):
        spec(defer_embedding_wgrad_compute=True)


def test_distributed_optimizer_shards_over_dp_times_cp_and_per_instance():
    dist = dict(use_distributed_optimizer=True, world_size=4, global_batch_size=16)
    dp4 = last_rank(spec(**dist)).persistent.optimizer_bytes
    cp2 = last_rank(spec(**dist, context_parallel_size=2)).persistent.optimizer_bytes
    two = last_rank(spec(**dist, num_distributed_optimizer_instances=2)).persistent.optimizer_bytes
    assert cp2 == pytest.approx(dp4, rel=1e-3)  # dp 2 x cp 2 shards as dp 4
    assert two == pytest.approx(2 * dp4, rel=1e-3)  # each instance shards over dp / 2
    with pytest.raises(ValueError, match="num_distributed_optimizer_instances"):
        spec(**dist, num_distributed_optimizer_instances=3)


def test_fp16_gradients_get_fp32_copies_that_outlive_the_step():
    fp16 = last_rank(spec(bf16=False, fp16=True))
    count = fp16.persistent.param_count
    assert fp16.post_step_bytes == 4 * count
    assert fp16.steady_bytes - fp16.persistent.total_bytes - fp16.workspace_bytes == 4 * count
    assert last_rank(spec()).post_step_bytes == 0  # bf16: the fp32 buffer itself, no copy


def test_fixed_workspaces_by_gpu_config_and_transformer_impl():
    older = 8 * MIB + 128 * 1024  # ":4096:2:16:8"
    assert torch_cublas_workspace_bytes((9, 0), None) == 32 * MIB
    assert torch_cublas_workspace_bytes((8, 0), None) == older
    assert torch_cublas_workspace_bytes((8, 0), ":4096:8") == 32 * MIB
    assert torch_cublas_workspace_bytes((9, 0), ":4096:2:16:8") == older
    assert te_workspace_bytes((9, 0)) == 32 * MIB and te_workspace_bytes((8, 0)) == 4 * MIB
    h100 = workspace_terms(spec())
    assert h100 == {"torch_cublas_workspaces": 64 * MIB, "te_cublas_workspace": 32 * MIB}
    a100_local = workspace_terms(dataclasses.replace(spec(transformer_impl="local"), gpu="a100"))
    assert a100_local == {"torch_cublas_workspaces": 2 * (8 * MIB + 128 * 1024)}
    assert workspace_terms(dataclasses.replace(spec(), device="cpu")) == {}
    # (without Transformer Engine's cached placeholder gradients: test_static_dummy_wgrads)
    est = last_rank(spec(gradient_accumulation_fusion=False))
    assert est.components()["other"] == 96 * MIB
    assert est.peak_memory_bytes - est.transient_bytes - est.persistent.total_bytes == 96 * MIB
    # TEGroupedMLP (grouped GEMM with TE) adds four multi-stream TE workspaces; the legacy
    # GroupedMLP and SequentialMLP do not
    moe = dict(num_experts=4, moe_grouped_gemm=True)
    grouped = workspace_terms(spec(**moe))
    assert grouped["te_grouped_gemm_workspaces"] == 4 * 32 * MIB
    a100 = workspace_terms(dataclasses.replace(spec(**moe), gpu="a100"))
    assert a100["te_grouped_gemm_workspaces"] == 4 * 4 * MIB
    assert "te_grouped_gemm_workspaces" not in workspace_terms(
        spec(**moe, moe_use_legacy_grouped_gemm=True)
    )
    assert "te_grouped_gemm_workspaces" not in workspace_terms(spec(num_experts=4))
    with pytest.raises(ValueError, match="gpu 'v100x' is unknown"):
        validate_spec(dataclasses.replace(spec(), gpu="v100x"))


def test_tp_comm_overlap_adds_transformer_engines_userbuffer_gemm_workspace():
    # TE >= 2.11 (cpp_extensions/gemm.py get_cublas_workspace with ub): a 3x workspace of its
    # own beside the 32 MiB one; up to 2.10 (base.py initialize_ub) the one workspace grown 3x
    assert te_userbuffer_workspace_bytes((9, 0)) == 3 * 32 * MIB
    assert te_userbuffer_workspace_bytes((9, 0), te_version="2.7.0") == 2 * 32 * MIB
    assert te_userbuffer_workspace_bytes((8, 0)) == 3 * 4 * MIB
    tp2 = dict(tensor_model_parallel_size=2, sequence_parallel=True)
    plain = last_rank(spec(**tp2))
    overlapped = last_rank(spec(**tp2, tp_comm_overlap=True))
    assert overlapped.workspaces["te_userbuffer_gemm_workspace"] == 96 * MIB
    assert overlapped.steady_bytes - plain.steady_bytes == 96 * MIB
    assert overlapped.peak_memory_bytes - plain.peak_memory_bytes == 96 * MIB
    # no TE linears (local spec) or no TP group: no userbuffers, no workspace for them
    local = spec(**tp2, tp_comm_overlap=True, transformer_impl="local")
    assert "te_userbuffer_gemm_workspace" not in workspace_terms(local)
    assert "te_userbuffer_gemm_workspace" not in workspace_terms(spec(tp_comm_overlap=True))


def test_local_spec_moe_router_gemm_holds_transformer_engines_workspace():
    # moe_utils.RouterGatingLinearFunction runs the gating GEMM through megatron's
    # te_general_gemm whenever TE imports and the router dtype is not fp64 (read from the
    # installed megatron-core: TE itself does not run on CPU)
    import inspect

    from megatron.core.transformer.moe import moe_utils

    forward = inspect.getsource(moe_utils.RouterGatingLinearFunction.forward)
    assert "te_general_gemm is not None and router_dtype != torch.float64" in forward
    moe = dict(num_experts=4, transformer_impl="local")
    local = workspace_terms(spec(**moe))
    assert local == {"torch_cublas_workspaces": 64 * MIB, "te_cublas_workspace": 32 * MIB}
    assert "te_cublas_workspace" not in workspace_terms(spec(**moe, moe_router_dtype="fp64"))
    assert "te_cublas_workspace" not in workspace_terms(spec(transformer_impl="local"))
    # the TE spec counts the one workspace once
    assert workspace_terms(spec(num_experts=4))["te_cublas_workspace"] == 32 * MIB


def test_fused_softmax_and_fp32_softmax_on_the_unfused_path():
    unfused = dict(transformer_impl="local")
    fused = spec(**unfused)  # 16-bit, s=256, masked_softmax_fusion on: the fused kernel
    detail = chunk_activations(fused, 2, first=False, last=False)[3]
    assert "causal_mask" not in detail
    torch_softmax = spec(**unfused, masked_softmax_fusion=False, attention_softmax_in_fp32=True)
    scores = B * 8 * S * S
    items = layer_saved(torch_softmax, dims(torch_softmax))
    assert items["attention_scores"] == scores * 2 + scores * 4  # fp32 output + its bf16 cast
    # with attention dropout the context bmm keeps the dropout output, not the bf16 cast
    dropped = spec(**unfused, masked_softmax_fusion=False, attention_softmax_in_fp32=True,
                   attention_dropout=0.1)  # fmt: skip
    items = layer_saved(dropped, dims(dropped))
    assert items["attention_scores"] == scores * 4
    assert items["attention_dropout"] == scores * 2 + scores  # output, bool mask (CUDA)
    assert "causal_mask" in chunk_activations(torch_softmax, 2, False, False)[3]


def test_use_flash_attn_with_the_local_spec_is_warned_and_modelled_unfused():
    with pytest.warns(UserWarning, match="no flash path"):
        local = spec(transformer_impl="local", use_flash_attn=True)
    assert not local.flash_attention


def test_a_negated_flag_that_contradicts_its_positive_is_refused():
    with pytest.raises(ValueError, match="no_gradient_accumulation_fusion contradicts"):
        spec(no_gradient_accumulation_fusion=True, gradient_accumulation_fusion=True)


# ---------------------------------------------------------------------------------------
# Measured: megatron-core's vocab-parallel cross entropy in bf16 on CPU


def _cross_entropy_peak(rank: int, world: int, port: int, dtype_name: str) -> int:
    """Peak bytes, above the output layer's input and weight, while an output-layer matmul
    and megatron-core's real vocab-parallel cross entropy run forward and backward on
    ``[s, b, V]`` logits of ``dtype_name`` (exact storage ledger; the logits are dropped after
    the loss, as GPTModel's forward drops them)."""
    import torch
    from megatron.core import tensor_parallel

    from memscope.capture.backends.storage import StorageLedgerBackend
    from memscope.demo.tiny_gpt import TinyGPTConfig, destroy_process, init_process

    init_process(rank, world, port, TinyGPTConfig())
    try:
        dtype = getattr(torch, dtype_name)
        hidden = torch.randn(S, B, H, dtype=dtype, requires_grad=True)
        weight = torch.randn(V, H, dtype=dtype, requires_grad=True)
        target = torch.randint(0, V, (S, B))
        gc.collect()  # earlier cases' cyclic garbage must not be freed mid-measurement
        ledger = StorageLedgerBackend("cpu")
        ledger.start()
        try:
            base = ledger.sample().allocated
            logits = torch.matmul(hidden, weight.t())
            loss = tensor_parallel.vocab_parallel_cross_entropy(logits, target)
            del logits
            loss.sum().backward()
            peak = ledger.sample().peak_allocated
        finally:
            ledger.stop()
        return peak - base
    finally:
        destroy_process()


@pytest.mark.multiprocess
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
def test_cross_entropy_upcast_is_what_megatron_core_allocates_on_cpu(bf16):
    (measured,) = spawn(1, _cross_entropy_peak, free_port(), "bfloat16" if bf16 else "float32")
    s = spec(bf16=bf16, gradient_accumulation_fusion=False)
    x = dims(s)
    saved = cross_entropy_saved(s, x)
    modelled = saved + max(loss_moments(s, x, saved).values())
    # the per-token tensors (target mask, masked target, max, sums, loss and its gradient) are
    # [s, b]-sized: at most a few dozen bytes per token beside V x (4 + 2) bytes per token
    assert 0 <= measured - modelled <= 64 * S * B, (measured, modelled)


# ---------------------------------------------------------------------------------------
# Measured: megatron-core's local DotProductAttention (unfused softmax) in bf16 on CPU

AS, AB, AA, AD = 128, 2, 4, 16  # s, b, heads, head dim


def _attention_held(rank: int, world: int, port: int, fp32_softmax: bool, dropout: float) -> int:
    """Bytes megatron-core's local ``DotProductAttention`` keeps after its bf16 forward (the
    output excluded), with the exact storage ledger."""
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.capture.backends.storage import StorageLedgerBackend
    from memscope.demo.tiny_gpt import TinyGPTConfig, destroy_process, init_process

    init_process(rank, world, port, TinyGPTConfig())
    try:
        cfg = TransformerConfig(
            num_layers=1,
            hidden_size=AA * AD,
            num_attention_heads=AA,
            attention_dropout=dropout,
            attention_softmax_in_fp32=fp32_softmax,
            masked_softmax_fusion=False,
            bf16=True,
            params_dtype=torch.bfloat16,
        )
        attn = DotProductAttention(cfg, 1, AttnMaskType.causal, attention_type="self")
        q, k, v = (torch.randn(AS, AB, AA, AD, dtype=torch.bfloat16) for _ in range(3))
        for t in (q, k, v):
            t.requires_grad_()
        gc.collect()  # earlier cases' cyclic garbage must not be freed mid-measurement
        ledger = StorageLedgerBackend("cpu")
        ledger.start()
        try:
            base = ledger.sample().allocated
            out = attn(q, k, v, None, attn_mask_type=AttnMaskType.causal)
            return ledger.sample().allocated - base - out.untyped_storage().nbytes()
        finally:
            ledger.stop()
    finally:
        destroy_process()


@pytest.mark.multiprocess
@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("fp32_softmax", [True, False], ids=["fp32_softmax", "bf16_softmax"])
def test_unfused_softmax_saved_tensors_are_what_megatron_core_keeps_on_cpu(fp32_softmax, dropout):
    (held,) = spawn(1, _attention_held, free_port(), fp32_softmax, dropout)
    s = spec(
        transformer_impl="local",
        masked_softmax_fusion=False,
        attention_softmax_in_fp32=fp32_softmax,
        attention_dropout=dropout,
        seq_length=AS,
        micro_batch_size=AB,
        hidden_size=AA * AD,
        num_attention_heads=AA,
    )
    s = dataclasses.replace(s, device="cpu")  # CPU dropout masks have the activation dtype
    items = layer_saved(s, dims(s))
    scores = items["attention_scores"] + items.get("attention_dropout", 0)
    # also held: the [b a, s, s] bf16 scores buffer of megatron's global memory buffer (the
    # estimate's buffer term) and the [s, s] bool causal mask the softmax builds
    buffer, causal_mask = AB * AA * AS * AS * 2, AS * AS
    assert held == scores + buffer + causal_mask


def test_context_parallel_backward_buffers_by_cp_comm_type():
    gqa = dict(group_query_attention=True, num_query_groups=2)
    x = dims(spec(**gqa))
    heads, kv = x.heads, x.kv_heads
    assert cp_attention_backward(spec(**gqa), x) == heads + 2 * kv  # dq, dk, dv
    for kind, expected in (
        ("p2p", 2 * heads + 10 * kv),  # dq + circulating K/V and dK/dV pairs + one step's grads
        ("a2a+p2p", 2 * heads + 10 * kv),
        ("a2a", 2 * (heads + 2 * kv)),
        ("all_gather", heads + 4 * 2 * kv),  # full-length K, V, dK, dV
    ):
        s = spec(**gqa, context_parallel_size=2, cp_comm_type=kind)
        assert s.parallel.cp_comm_type == kind
        assert cp_attention_backward(s, dims(s)) == expected * dims(s).s // x.s
    with pytest.warns(UserWarning, match="cp_comm_type differs per layer"):
        mixed = spec(**gqa, context_parallel_size=2, cp_comm_type=["a2a", "p2p"])
    assert mixed.parallel.cp_comm_type == "p2p"
    with pytest.raises(ValueError, match="cp_comm_type: 'ring' is not one of"):
        spec(context_parallel_size=2, cp_comm_type="ring")


def test_unfused_rope_keeps_cos_and_sin_per_layer_fused_rope_none():
    rope = dict(position_embedding_type="rope")
    x = dims(spec(**rope))
    assert layer_saved(spec(**rope, apply_rope_fusion=False), x)["rope_cos_sin"] == 4 * S * x.d * 2
    assert "rope_cos_sin" not in layer_saved(spec(**rope), x)  # Megatron's default: fused
    assert spec(**rope, no_rope_fusion=True).model.rope_fusion is False


def test_mtp_keeps_the_last_depth_logits_alive_at_the_main_cross_entropy():
    plain, mtp = spec(), spec(mtp_num_layers=1)
    x = dims(plain)
    saved = cross_entropy_saved(plain, x)
    assert (
        loss_moments(mtp, x, saved)["cross_entropy"]
        == loss_moments(plain, x, saved)["cross_entropy"] + x.logits
    )
    detail = chunk_activations(mtp, 2, first=False, last=True)[3]
    assert detail["mtp_cross_entropy"] == cross_entropy_saved(mtp, x) + S * B * 17 + 4
    assert "mtp_layers" not in chunk_activations(mtp, 2, first=False, last=False)[3]


# ---------------------------------------------------------------------------------------
# Mixture of experts (memscope/analysis/static/moe.py; measured in test_static_moe_activations)

MOE: dict[str, Any] = dict(
    num_experts=8, moe_ffn_hidden_size=128, moe_router_topk=2, disable_bias_linear=True
)


def test_routed_rows_under_sequence_and_expert_tensor_parallelism():
    tokens = S * B
    assert routed_rows(spec(**MOE), tokens) == tokens * 2
    # tp 2 with SP: each rank routes its s/tp tokens; etp 2 all-gathers them over expert TP
    sp = spec(**MOE, tensor_model_parallel_size=2, sequence_parallel=True, world_size=2)
    x = dims(sp)
    assert x.s // x.sp * x.b == tokens // 2
    assert routed_rows(sp, tokens // 2) == tokens // 2 * 2 * 2
    etp1 = spec(**MOE, tensor_model_parallel_size=2, sequence_parallel=True,
                expert_tensor_parallel_size=1, world_size=2)  # fmt: skip
    assert routed_rows(etp1, tokens // 2) == tokens // 2 * 2


def test_capacity_factor_drops_and_padding_fills_to_capacity():
    tokens = S * B
    capacity = -(-tokens * 2 * 3 // (8 * 4))  # ceil(T k / E * 0.75)
    dropping = spec(**MOE, moe_expert_capacity_factor=0.75)
    assert routed_rows(dropping, tokens) == capacity * 8 < tokens * 2
    padded = spec(**MOE, moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True)
    assert routed_rows(padded, tokens) == -(-tokens * 2 * 3 // 16) * 8 > tokens * 2
    assert routed_rows(spec(**MOE, moe_expert_capacity_factor=-1), tokens) == tokens * 2


def test_moe_dispatcher_router_and_expert_terms_by_key():
    def items(**kw: Any) -> dict[str, int]:
        s = spec(**MOE, **kw)
        return moe_layer_saved(s, S, B, 1, 2)

    tokens, e = S * B, 2
    base = items()
    assert base["moe_router"] == 12 * tokens * 2  # int64 top-k indices, fp32 top-k softmax
    aux = items(moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01)
    assert aux["moe_router"] - base["moe_router"] == 4 * tokens * 8 + 8 * 8 + 4
    assert items(moe_aux_loss_coeff=0.0) == base  # aux_loss with a zero coefficient: off
    fp32 = items(moe_router_dtype="fp32")
    rows = tokens * 2
    assert fp32["moe_experts"] - base["moe_experts"] == (4 - e) * rows  # probs in fp32
    a2a = items(moe_token_dispatcher_type="alltoall")
    assert a2a["moe_dispatcher"] == 8 * tokens * 2 + 2 * (e + 1) * tokens * 8 + 8 * 8
    # fused weighted SwiGLU keeps fc1's 2f output and the product: 3 f-wide rows; unfused 6
    gated = dict(swiglu=True)
    unfused = items(**gated, bias_swiglu_fusion=False)["moe_experts"]
    assert unfused - items(**gated)["moe_experts"] == 3 * rows * 128 * e
    with pytest.raises(ValueError, match="moe_token_dispatcher_type: 'ring' is not one of"):
        spec(**MOE, moe_token_dispatcher_type="ring")


def test_allgather_dispatcher_over_ep_fills_the_global_buffer():
    ep2 = spec(**MOE, expert_model_parallel_size=2, world_size=2)
    assert moe_global_buffer(ep2, S, B, 1, 2) == S * B * 2 * H * 2
    assert buffer_bytes(ep2) >= S * B * 2 * H * 2
    assert moe_global_buffer(spec(**MOE), S, B, 1, 2) == 0  # G = 1: no gather
    a2a = spec(
        **MOE, expert_model_parallel_size=2, world_size=2, moe_token_dispatcher_type="alltoall"
    )
    assert moe_global_buffer(a2a, S, B, 1, 2) == 0


def test_num_virtual_stages_per_pipeline_rank_sets_the_interleaving():
    args = dict(pipeline_model_parallel_size=2, world_size=2, num_layers=4, global_batch_size=4)
    assert spec(**args, num_virtual_stages_per_pipeline_rank=2).parallel.vpp == 2
    with pytest.raises(ValueError, match="are exclusive"):
        spec(
            **args, num_virtual_stages_per_pipeline_rank=2, num_layers_per_virtual_pipeline_stage=1
        )


@pytest.mark.parametrize(
    ("capability", "torch_2_13", "torch_2_7", "te"),
    [
        ((8, 0), 8 * MIB + 128 * 1024, 8 * MIB + 128 * 1024, 4 * MIB),  # A100
        ((9, 0), 32 * MIB, 32 * MIB, 32 * MIB),  # H100
        ((10, 0), 32 * MIB, 8 * MIB + 128 * 1024, 32 * MIB),  # B200
        ((12, 0), 32 * MIB, 8 * MIB + 128 * 1024, 32 * MIB),  # RTX PRO 6000
        ((11, 0), 8 * MIB + 128 * 1024, 8 * MIB + 128 * 1024, 32 * MIB),  # neither list
    ],
)
def test_workspaces_per_compute_capability(capability, torch_2_13, torch_2_7, te):
    # torch's CublasHandlePool.cpp default: majors 9/10/12 since 2.11, exactly 9.0 before;
    # TE's get_cublas_workspace_size_bytes: major >= 9
    assert torch_default_workspace_bytes(capability, (2, 13)) == torch_2_13
    assert torch_default_workspace_bytes(capability, (2, 7)) == torch_2_7
    assert torch_cublas_workspace_bytes(capability, None) == torch_2_13  # the assumed torch
    assert te_workspace_bytes(capability) == te


def test_blackwell_gpu_names_get_their_capability_workspaces():
    b200 = workspace_terms(dataclasses.replace(spec(), gpu="b200"))
    assert b200 == {"torch_cublas_workspaces": 64 * MIB, "te_cublas_workspace": 32 * MIB}
    rtx = workspace_terms(dataclasses.replace(spec(transformer_impl="local"), gpu="rtx_pro_6000"))
    assert rtx == {"torch_cublas_workspaces": 64 * MIB}
    with pytest.raises(ValueError, match="unknown"):
        workspace_terms(dataclasses.replace(spec(), gpu="tpu"))


def test_golden_cases_with_and_without_the_dataloader_mask_differ_by_it():
    """Megatron-LM's functional tests run TP 2 x PP 2 twice with and twice without
    ``--no-create-attention-mask-in-dataloader`` (s 1024, b 4: a 4 MiB mask). Their measured
    transients (peak less steady allocation, benchmarks/static_gpu_golden.json) differ by
    3 MiB and 5 MiB, 4 MiB on average; the estimates by exactly the mask."""
    import json
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "static_gpu_golden.json"
    rows = {r["name"]: r for r in json.loads(path.read_text())["rows"]}
    mask = 4 * 1024 * 1024
    measured, estimated = [], []
    for prefix in ("gpt3_mr_mcore_te_tp2_pp2_", "gpt3_mr_mcore_te_tp2_pp2_resume_torch_dist_"):
        on = rows[prefix + "dgx_a100_1N8G"]
        off = rows[prefix + "no_create_attention_mask_in_dataloader_dgx_a100_1N8G"]
        for out, key in ((measured, "measured"), (estimated, "estimate")):
            out.append(
                (on[key]["peak_bytes"] - on[key]["steady_bytes"])
                - (off[key]["peak_bytes"] - off[key]["steady_bytes"])
            )
    assert estimated == [mask, mask]
    assert sum(measured) / len(measured) == mask
    assert all(abs(m - mask) <= 1024 * 1024 for m in measured)
