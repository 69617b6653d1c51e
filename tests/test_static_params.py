"""Exact per-rank parameter inventory against real megatron-core GPTModels built on CPU.

The tiny-harness configurations (tied/untied, GQA, SwiGLU, TP=2, PP=2, VPP) are checked in
``test_static_estimator.py``; here: the features the harness does not switch on (RMSNorm,
q/k layernorm, no linear biases, rotary embeddings, kv_channels), uneven pipeline stages and
the padded vocabulary seen through the Megatron args path.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from memscope.analysis.static.config import stage_layer_counts
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.demo.launcher import free_port
from memscope.demo.tiny_gpt import FUSIONS_OFF, TinyGPTConfig, destroy_process, init_process
from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = pytest.mark.integration


def _args(**kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        padded_vocab_size=96,
        seq_length=16,
        micro_batch_size=1,
    )
    return argparse.Namespace(**{**base, **kw})


def _real_named_params(args: argparse.Namespace) -> dict[str, int]:
    """Build one GPTModel with megatron-core's local spec from ``args`` (world size 1)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    init_process(0, 1, free_port(), TinyGPTConfig())
    try:
        extra: dict[str, Any] = {}
        if getattr(args, "swiglu", False):
            extra.update(gated_linear_unit=True, activation_func=F.silu)
        config = TransformerConfig(
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads,
            num_query_groups=getattr(args, "num_query_groups", None),
            kv_channels=getattr(args, "kv_channels", None),
            ffn_hidden_size=getattr(args, "ffn_hidden_size", None),
            add_bias_linear=not getattr(args, "disable_bias_linear", False),
            add_qkv_bias=getattr(args, "add_qkv_bias", False),
            qk_layernorm=getattr(args, "qk_layernorm", False),
            normalization=getattr(args, "normalization", "LayerNorm"),
            params_dtype=torch.float32,
            use_cpu_initialization=True,
            **FUSIONS_OFF,
            **extra,
        )
        spec = get_gpt_layer_local_spec(
            qk_layernorm=config.qk_layernorm, normalization=config.normalization
        )
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=args.padded_vocab_size,
            max_sequence_length=args.seq_length,
            share_embeddings_and_output_weights=not getattr(
                args, "untie_embeddings_and_output_weights", False
            ),
            position_embedding_type=getattr(args, "position_embedding_type", "learned_absolute"),
        )
        return {name: p.numel() for name, p in model.named_parameters()}
    finally:
        destroy_process()


@pytest.mark.parametrize(
    "overrides",
    [
        dict(
            normalization="RMSNorm",
            disable_bias_linear=True,
            position_embedding_type="rope",
            swiglu=True,
            num_query_groups=1,
            untie_embeddings_and_output_weights=True,
        ),
        dict(qk_layernorm=True, add_qkv_bias=True, disable_bias_linear=True, kv_channels=24),
        dict(normalization="RMSNorm", qk_layernorm=True, ffn_hidden_size=40, num_query_groups=2),
    ],
    ids=["llama-like", "qk-norm-qkv-bias-kv-channels", "rms-qk-norm-gqa-odd-ffn"],
)
def test_inventory_matches_real_model_for_features_the_harness_does_not_use(overrides):
    args = _args(**overrides)
    estimated = {
        t.name: t.numel for t in rank_params(spec_from_megatron_args(args), RankPosition())
    }
    assert estimated == _real_named_params(args)


def test_vocab_is_padded_like_megatron_args_unless_padded_size_given():
    args = _args(padded_vocab_size=None, vocab_size=1000, tensor_model_parallel_size=2)
    assert spec_from_megatron_args(args).model.vocab_size == 1024  # 128 * tp
    args.make_vocab_size_divisible_by = 1
    assert spec_from_megatron_args(args).model.vocab_size == 1000
    # the tiny harness passes its vocab to GPTModel unpadded: padded_vocab_size wins
    assert spec_from_megatron_args(_args(padded_vocab_size=97)).model.vocab_size == 97


def test_null_tokenizer_adds_its_end_of_document_token_before_padding():
    """Megatron-LM's _NullTokenizer.vocab_size is --vocab-size + 1; the GPU end-to-end run
    (examples/flagscale_gpu_e2e) logged "padded vocab (size: 4097) ... (new size: 4224)"."""
    null = dict(padded_vocab_size=None, tokenizer_type="NullTokenizer")
    assert spec_from_megatron_args(_args(vocab_size=4096, **null)).model.vocab_size == 4224
    assert spec_from_megatron_args(_args(vocab_size=4095, **null)).model.vocab_size == 4096
    other = dict(padded_vocab_size=None, tokenizer_type="HuggingFaceTokenizer")
    assert spec_from_megatron_args(_args(vocab_size=4096, **other)).model.vocab_size == 4096


def test_uneven_pipeline_stages_place_layers_like_megatron():
    args = _args(
        num_layers=27,
        pipeline_model_parallel_size=3,
        decoder_first_pipeline_num_layers=13,
    )
    spec = spec_from_megatron_args(args)
    assert stage_layer_counts(spec.model, spec.parallel) == [13, 7, 7]
    names = [t.name for t in rank_params(spec, RankPosition(pp_rank=1))]
    layers = sorted({int(n.split(".")[2]) for n in names if n.startswith("decoder.layers.")})
    assert layers == list(range(13, 20))
    assert not any(n.startswith(("embedding", "output_layer")) for n in names)
    last = [t.name for t in rank_params(spec, RankPosition(pp_rank=2))]
    assert "output_layer.weight" in last and "decoder.final_layernorm.weight" in last
    with pytest.raises(ValueError, match="first_stage_layers/last_stage_layers"):
        spec_from_megatron_args(_args(num_layers=27, pipeline_model_parallel_size=3,
                                      decoder_first_pipeline_num_layers=12))  # fmt: skip
