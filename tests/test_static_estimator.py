"""Static estimator: config validation, exact parameter inventory and persistent terms,
checked against real megatron-core GPTModels and the optimizer state torch.optim holds."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import run_in_process

from memscope.analysis.static.config import (
    ModelSpec,
    ParallelSpec,
    PrecisionSpec,
    TrainingSpec,
    padded_vocab_size,
)
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.analysis.static.spec_checks import validate_spec
from memscope.analysis.static.terms import persistent_terms
from memscope.demo.launcher import free_port, spawn
from memscope.demo.tiny_gpt import TinyGPTConfig, build_model, destroy_process, init_process
from memscope.demo.traced_training import megatron_like_args
from memscope.inputs.config_files import spec_from_flagscale_yaml
from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = pytest.mark.integration


def spec_for(cfg: TinyGPTConfig, **precision) -> TrainingSpec:
    args = megatron_like_args(cfg, [])
    args.padded_vocab_size = cfg.vocab_size
    args.num_query_groups = cfg.num_query_groups
    args.swiglu = cfg.swiglu
    args.ffn_hidden_size = cfg.ffn_hidden_size
    share = cfg.share_embeddings if cfg.share_embeddings is not None else cfg.pp == 1
    args.untie_embeddings_and_output_weights = not share
    args.torch_optimizer = True
    spec = spec_from_megatron_args(args)
    if precision:
        spec = dataclasses.replace(spec, precision=dataclasses.replace(spec.precision, **precision))
    return spec


def real_params(rank: int, world_size: int, port: int, cfg: TinyGPTConfig) -> dict[str, int]:
    """Parameter name -> numel of the real model this rank builds."""
    from megatron.core import parallel_state

    init_process(rank, world_size, port, cfg)
    try:
        chunks = build_model(cfg)
        multi = len(chunks) > 1
        out = {
            (f"chunk{i}." if multi else "") + name: p.numel()
            for i, chunk in enumerate(chunks)
            for name, p in chunk.named_parameters()
        }
        out["__pp_rank__"] = parallel_state.get_pipeline_model_parallel_rank()
        out["__tp_rank__"] = parallel_state.get_tensor_model_parallel_rank()
        return out
    finally:
        destroy_process()


def _layer_offsets(names: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in names.items() if not k.startswith("__")}


def _estimated(spec: TrainingSpec, tp_rank: int, pp_rank: int) -> dict[str, int]:
    return {t.name: t.numel for t in rank_params(spec, RankPosition(tp_rank, pp_rank))}


def _normalise_layer_numbers(names: dict[str, int]) -> dict[str, int]:
    """Megatron numbers layers per chunk (decoder.layers.0, ...); ours are global: compare sums."""
    out: dict[str, int] = {}
    for name, numel in names.items():
        key = re.sub(r"decoder\.layers\.\d+", "decoder.layers.N", name)
        out[key] = out.get(key, 0) + numel
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        TinyGPTConfig(),
        TinyGPTConfig(num_query_groups=2, swiglu=True),
        TinyGPTConfig(
            share_embeddings=False, hidden_size=96, num_attention_heads=6, ffn_hidden_size=200
        ),
    ],
    ids=["tied-mha", "gqa-swiglu", "untied-odd-ffn"],
)
def test_single_rank_inventory_matches_the_real_model_exactly(cfg):
    real = _layer_offsets(real_params(0, 1, free_port(), cfg))
    assert _estimated(spec_for(cfg), 0, 0) == real


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "cfg",
    [
        TinyGPTConfig(tp=2, num_query_groups=2),
        TinyGPTConfig(pp=2),
        TinyGPTConfig(pp=2, vpp=2, num_layers=4),
    ],
    ids=["tp2-gqa", "pp2", "pp2-vpp2"],
)
def test_sharded_inventory_matches_every_rank_of_a_real_job(cfg):
    spec = spec_for(cfg)
    for real in spawn(2, real_params, free_port(), cfg):
        tp_rank, pp_rank = real.pop("__tp_rank__"), real.pop("__pp_rank__")
        est = _estimated(spec, tp_rank, pp_rank)
        assert _normalise_layer_numbers(est) == _normalise_layer_numbers(real)


def test_optimizer_and_grad_bytes_equal_what_torch_adam_holds(tmp_path):
    cfg = TinyGPTConfig(num_query_groups=2, swiglu=True, num_microbatches=1)
    result = run_in_process(cfg, 1, ["--memscope", "--memscope-outdir", str(tmp_path)])
    terms = persistent_terms(spec_for(cfg), rank_params(spec_for(cfg), RankPosition()))
    assert terms.weight_bytes == result.param_bytes
    assert terms.grad_bytes == result.param_bytes  # fp32 training: grads in param dtype
    assert terms.optimizer_bytes == result.optimizer_state_bytes


def test_mixed_precision_and_distributed_optimizer_terms_by_hand():
    spec = dataclasses.replace(
        spec_for(TinyGPTConfig()),
        parallel=ParallelSpec(dp=4),
        precision=PrecisionSpec(params_dtype="bfloat16", grads_in_fp32=True),
    )
    params = rank_params(spec, RankPosition())
    n = sum(t.numel for t in params)
    t = persistent_terms(spec, params)
    assert (t.weight_bytes, t.grad_bytes, t.optimizer_bytes) == (2 * n, 4 * n, 12 * n)
    dist = dataclasses.replace(
        spec, precision=dataclasses.replace(spec.precision, distributed_optimizer=True)
    )
    assert persistent_terms(dist, params).optimizer_bytes == -(-12 * n // 4)
    sgd = dataclasses.replace(spec, precision=PrecisionSpec(optimizer="sgd", sgd_momentum=False))
    assert persistent_terms(sgd, params).optimizer_bytes == 0


def test_vocab_padding_follows_megatron():
    assert padded_vocab_size(50257, 128, 1) == 50304
    assert padded_vocab_size(50257, 128, 8) == 51200
    assert padded_vocab_size(1024, 128, 2) == 1024


BASE = dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=32)


@pytest.mark.parametrize(
    ("model", "parallel", "precision", "needle"),
    [
        ({"hidden_size": 66}, {}, {}, "num_attention_heads (4) must divide model.hidden_size"),
        ({}, {"tp": 3}, {}, "parallel.tp (3) must divide model.num_attention_heads"),
        ({"num_query_groups": 2}, {"tp": 4}, {}, "must divide model.num_query_groups"),
        ({}, {"pp": 3}, {}, "must divide model.num_layers"),
        ({}, {}, {"params_dtype": "float8"}, "precision.params_dtype 'float8' is unknown"),
    ],
)
def test_contradictory_config_names_the_field(model, parallel, precision, needle):
    spec = TrainingSpec(
        ModelSpec(**{**BASE, **model}), ParallelSpec(**parallel), PrecisionSpec(**precision)
    )
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        validate_spec(spec)


def test_flagscale_yaml_sections_are_merged_like_the_runner():
    yaml_cfg = {
        "system": {
            "tensor_model_parallel_size": 2,
            "bf16": True,
            "use_distributed_optimizer": True,
        },
        "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                  "seq_length": 128, "swiglu": True, "group_query_attention": True,
                  "num_query_groups": 2, "micro_batch_size": 1, "global_batch_size": 8},
        "data": {"tokenizer": {"vocab_size": 1000}},
    }  # fmt: skip
    spec = spec_from_flagscale_yaml(yaml_cfg)
    assert spec.parallel.tp == 2 and spec.model.vocab_size == 1024  # padded to 128 * tp
    assert spec.precision.params_dtype == "bfloat16" and spec.precision.grads_in_fp32
    assert spec.model.query_groups == 2 and spec.model.gated_linear_unit
    with pytest.raises(ValueError, match="not a FlagScale training YAML"):
        spec_from_flagscale_yaml({"experiment": {}})
