"""Multi-token prediction and ``qk_layernorm`` in the static estimator, against what real
megatron-core GPTModels (0.16.1, and 0.19.x in CI's second run) keep for backward on CPU
(local spec, bf16, GQA, RoPE), measured with the exact storage ledger.

One microbatch runs forward with labels (the main and MTP losses are computed inside the
model) after a warm-up step, so megatron's persistent global buffer and the RoPE cache are
not part of the difference. Only the model is built on CPU: ``torch.cuda.current_device`` is
the CPU while the rotary embedding asks for it, and ``Tensor.cuda`` is the identity while the
model is built (neither holds or shapes an activation).
"""

from __future__ import annotations

import dataclasses
import gc
import types
from typing import Any
from unittest import mock

import pytest

from memscope.analysis.static.activations import (
    dims,
    layer_saved,
    mtp_saved,
    qk_layernorm_saved,
)
from memscope.demo.launcher import free_port, spawn
from memscope.inputs.megatron_args import spec_from_megatron_args

# also on the newest megatron-core (CI's second run): MTP's layer was rebuilt in 0.17
pytestmark = [pytest.mark.integration, pytest.mark.multiprocess, pytest.mark.megatron_versions]

S, B, H, A, G, FFN, V = 128, 8, 64, 4, 2, 256, 2048  # seq, micro batch, hidden, heads, groups

CASES: dict[str, dict[str, Any]] = {
    "base": dict(layers=2, norm="LayerNorm"),
    "three_layers": dict(layers=3, norm="LayerNorm"),
    "mtp1": dict(layers=2, norm="LayerNorm", mtp=1),
    "mtp2": dict(layers=2, norm="LayerNorm", mtp=2),
    "qk": dict(layers=2, norm="LayerNorm", qk=True),
    "rms_base": dict(layers=2, norm="RMSNorm"),
    "rms_qk": dict(layers=2, norm="RMSNorm", qk=True),
}


def _held_after_forward(case: dict[str, Any]) -> int:
    """Bytes a real GPTModel keeps after one forward with labels (its loss included)."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.capture.backends.storage import StorageLedgerBackend
    from memscope.demo.tiny_gpt import FUSIONS_OFF

    cfg = TransformerConfig(
        num_layers=case["layers"],
        hidden_size=H,
        num_attention_heads=A,
        num_query_groups=G,
        ffn_hidden_size=FFN,
        qk_layernorm=case.get("qk", False),
        normalization=case["norm"],
        mtp_num_layers=case.get("mtp"),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=False,  # Megatron's argument default
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=True,
        **FUSIONS_OFF,
    )
    layer_spec = get_gpt_layer_local_spec(qk_layernorm=cfg.qk_layernorm, normalization=case["norm"])
    mtp_spec = (
        get_gpt_mtp_block_spec(cfg, layer_spec, use_transformer_engine=False)
        if cfg.mtp_num_layers
        else None
    )
    with mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self):
        model = GPTModel(
            config=cfg,
            transformer_layer_spec=layer_spec,
            vocab_size=V,
            max_sequence_length=S,
            share_embeddings_and_output_weights=True,
            position_embedding_type="rope",
            mtp_block_spec=mtp_spec,
        )
    torch.manual_seed(0)
    tokens, labels = torch.randint(0, V, (B, S)), torch.randint(0, V, (B, S))
    positions = torch.arange(S).unsqueeze(0).expand(B, S).contiguous()
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1).view(1, 1, S, S)
    loss_mask = torch.ones(B, S)
    with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):
        model(tokens, positions, mask, labels=labels, loss_mask=loss_mask).sum().backward()
        model.zero_grad(set_to_none=True)
        readings = []
        for _ in range(2):  # the smaller of two: a stray object freed late only ever adds
            gc.collect()  # earlier cases' cyclic garbage must not be freed mid-measurement
            ledger = StorageLedgerBackend("cpu")
            ledger.start()
            try:
                base = ledger.sample().allocated
                loss = model(tokens, positions, mask, labels=labels, loss_mask=loss_mask)
                readings.append(ledger.sample().allocated - base)
            finally:
                ledger.stop()
            del loss
    return min(readings)


def _measure(rank: int, world: int, port: int) -> dict[str, int]:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    from memscope.demo.tiny_gpt import TinyGPTConfig, destroy_process, init_process

    init_process(rank, world, port, TinyGPTConfig())
    try:
        out = {}
        for name, case in CASES.items():
            out[name] = _held_after_forward(case)
            MTPLossLoggingHelper.tracker.clear()  # sized by mtp_num_layers at first use
        return out
    finally:
        destroy_process()


@pytest.fixture(scope="module")
def held() -> dict[str, int]:
    (result,) = spawn(1, _measure, free_port())
    return result


def _spec(**overrides: Any) -> Any:
    args = dict(
        num_layers=2,
        hidden_size=H,
        num_attention_heads=A,
        group_query_attention=True,
        num_query_groups=G,
        ffn_hidden_size=FFN,
        padded_vocab_size=V,
        seq_length=S,
        micro_batch_size=B,
        global_batch_size=B,
        bf16=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        transformer_impl="local",
        position_embedding_type="rope",
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        bias_activation_fusion=False,
        gradient_accumulation_fusion=False,
    )
    args.update(overrides)
    return dataclasses.replace(spec_from_megatron_args(types.SimpleNamespace(**args)), device="cpu")


def test_one_decoder_layer_keeps_what_the_estimate_itemises(held):
    s = _spec()
    assert held["three_layers"] - held["base"] == sum(layer_saved(s, dims(s)).values())


@pytest.mark.parametrize("depth", [1, 2])
def test_mtp_keeps_its_layers_inputs_and_per_depth_loss(held, depth):
    s = _spec(mtp_num_layers=depth)
    x = dims(s)
    layer = sum(layer_saved(s, x).values())
    modelled = sum(mtp_saved(s, x, layer).values())
    assert held[f"mtp{depth}"] - held["base"] == modelled


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_qk_layernorm_keeps_the_norm_inputs_and_statistics(held, norm):
    s = _spec(qk_layernorm=True, normalization=norm)
    prefix = "" if norm == "LayerNorm" else "rms_"
    per_layer = qk_layernorm_saved(s, dims(s))
    assert per_layer == layer_saved(s, dims(s))["qk_layernorm"]
    assert held[f"{prefix}qk"] - held[f"{prefix}base"] == 2 * per_layer
