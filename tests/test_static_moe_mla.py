"""Mixture-of-experts, multi-latent attention and multi-token prediction in the static
estimator: the per-rank inventory against real megatron-core 0.16.1 GPTModels built on CPU,
and every example training YAML of the FlagScale 0.8.0 wheel.

The models are built the way Megatron-LM's ``gpt_builders.gpt_builder`` does with
``--transformer-impl local``: ``get_gpt_decoder_block_spec`` when there are experts,
``get_gpt_layer_local_spec`` otherwise, ``get_gpt_mtp_block_spec`` for MTP. Two CPU
stand-ins, neither of which holds or shapes a parameter: ``torch.cuda.current_device`` is
the CPU while building (the MLA rotary embedding and the router's expert-bias buffers ask
for it), and MLA's core attention is the local ``DotProductAttention`` accepting (and
ignoring) the ``k_channels``/``v_channels`` that megatron-core 0.16.1 passes only to Transformer
Engine's attention; likewise ``HAVE_TE`` is off in ``multi_latent_attention``, the
``grouped_gemm`` availability check is skipped for ``GroupedMLP`` (construction only) and
``Tensor.cuda`` is the identity while the tied embedding copies are synchronised (gloo, CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import re
import sys
from typing import Any
from unittest import mock

import pytest

from memscope.analysis.static.config import (
    ModelSpec,
    ParallelSpec,
    PrecisionSpec,
    TrainingSpec,
    stage_spec,
)
from memscope.analysis.static.estimator import estimate_all_ranks, estimate_rank, position_of_rank
from memscope.analysis.static.megatron_versions import mtp_inner_layer
from memscope.analysis.static.params import RankPosition, layer_params, rank_params
from memscope.analysis.static.spec_checks import validate_spec
from memscope.demo.launcher import free_port, spawn
from memscope.demo.tiny_gpt import FUSIONS_OFF, TinyGPTConfig, destroy_process, init_process
from memscope.inputs.config_files import load_config_file, spec_from_flagscale_yaml
from memscope.inputs.flagscale_checks import eval_layer_pattern
from memscope.inputs.megatron_args import spec_from_megatron_args

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))
from flagscale_wheel import flagscale_tree

pytestmark = pytest.mark.integration

MLA_DIMS = dict(kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=12)


def _args(**kw: Any) -> dict[str, Any]:
    """Megatron argument names (as a FlagScale YAML or ``args`` namespace gives them)."""
    base: dict[str, Any] = dict(
        num_layers=3,
        hidden_size=64,
        num_attention_heads=4,
        padded_vocab_size=128,
        seq_length=32,
        max_position_embeddings=32,
        position_embedding_type="rope",
        transformer_impl="local",
        micro_batch_size=1,
    )
    return {**base, **kw}


def _pattern(args: dict[str, Any]) -> list[int] | int:
    freq = args.get("moe_layer_freq", 1)
    return eval_layer_pattern(freq) if isinstance(freq, str) else freq


def _config(args: dict[str, Any]) -> Any:
    """The TransformerConfig Megatron's ``core_transformer_config_from_args`` would make."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    kw: dict[str, Any] = dict(
        num_layers=args["num_layers"],
        hidden_size=args["hidden_size"],
        num_attention_heads=args["num_attention_heads"],
        ffn_hidden_size=args.get("ffn_hidden_size"),
        add_bias_linear=not args.get("disable_bias_linear", False),
        qk_layernorm=args.get("qk_layernorm", False),
        normalization=args.get("normalization", "LayerNorm"),
        tensor_model_parallel_size=args.get("tensor_model_parallel_size", 1),
        pipeline_model_parallel_size=args.get("pipeline_model_parallel_size", 1),
        expert_model_parallel_size=args.get("expert_model_parallel_size", 1),
        expert_tensor_parallel_size=args.get("expert_tensor_parallel_size"),
        num_layers_in_last_pipeline_stage=args.get("decoder_last_pipeline_num_layers"),
        mtp_num_layers=args.get("mtp_num_layers"),
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
        **FUSIONS_OFF,
    )
    if args.get("swiglu"):
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    if args.get("num_experts"):
        kw.update(
            num_moe_experts=args["num_experts"],
            moe_ffn_hidden_size=args.get("moe_ffn_hidden_size"),
            moe_shared_expert_intermediate_size=args.get("moe_shared_expert_intermediate_size"),
            moe_layer_freq=_pattern(args),
            moe_router_topk=args.get("moe_router_topk", 2),
            moe_grouped_gemm=args.get("moe_grouped_gemm", False),
            moe_router_enable_expert_bias=args.get("moe_router_enable_expert_bias", False),
            moe_router_score_function=args.get("moe_router_score_function", "softmax"),
            moe_token_dispatcher_type="allgather",  # alltoall wants a CUDA stream; no params
        )
    if args.get("multi_latent_attention"):
        kw.update(q_lora_rank=args.get("q_lora_rank"), rope_type="rope")
        kw.update({k: args[k] for k in MLA_DIMS})
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def _build(args: dict[str, Any]) -> dict[str, int]:
    """Parameter name -> numel of the model this rank builds (parallel state already set)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.moe import experts
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    class MLACoreAttention(DotProductAttention):  # no parameters, like the original
        def __init__(self, *a: Any, k_channels: Any = None, v_channels: Any = None, **kw: Any):
            super().__init__(*a, **kw)

    config = _config(args)
    mla = config.multi_latent_attention
    with (
        mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")),
        mock.patch.object(multi_latent_attention, "HAVE_TE", False),
        # the legacy GroupedMLP's grouped_gemm check (megatron-core 0.19 has no GroupedMLP)
        mock.patch.object(experts.gg, "assert_grouped_gemm_is_available", lambda: None)
        if hasattr(experts, "gg")
        else contextlib.nullcontext(),
        mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self),  # tied copy sync
    ):
        if config.num_moe_experts:  # gpt_builders: the decoder block spec
            spec: Any = specs.get_gpt_decoder_block_spec(
                config, use_transformer_engine=False, normalization=config.normalization
            )
        else:
            spec = _layer_spec(config)
        layer_specs = spec.layer_specs if hasattr(spec, "layer_specs") else [spec]
        mtp_spec = None
        if config.mtp_num_layers:  # gpt_builders: the layer spec when the stage has none
            mtp_from = spec if layer_specs else _layer_spec(config)
            mtp_spec = specs.get_gpt_mtp_block_spec(config, mtp_from, use_transformer_engine=False)
            if mtp_spec is not None:
                layer_specs = [*layer_specs, *map(_mtp_inner_layer, mtp_spec.layer_specs)]
        if mla:
            for layer in layer_specs:
                layer.submodules.self_attention.submodules.core_attention = MLACoreAttention
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=args["padded_vocab_size"],
            max_sequence_length=args["max_position_embeddings"],
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=not args.get(
                "untie_embeddings_and_output_weights", False
            ),
            position_embedding_type=args["position_embedding_type"],
            mtp_block_spec=mtp_spec,
        )
    offset = get_transformer_layer_offset(config)  # Megatron numbers layers per stage

    def global_name(name: str) -> str:
        return re.sub(
            r"^decoder\.layers\.(\d+)", lambda g: f"decoder.layers.{int(g[1]) + offset}", name
        )

    out = {global_name(name): p.numel() for name, p in model.named_parameters()}
    for name, buf in model.named_buffers():
        if ".router." in name:
            out["buffer:" + global_name(name)] = buf.numel()
    return out


def _mtp_inner_layer(mtp_layer_spec: Any) -> Any:
    """The transformer layer inside an MTP layer's spec: ``mtp_model_layer`` from
    megatron-core 0.17 (multi_token_prediction.py ``MultiTokenPredictionLayerSubmodules``),
    ``transformer_layer`` before."""
    sub = mtp_layer_spec.submodules
    return sub.mtp_model_layer if hasattr(sub, "mtp_model_layer") else sub.transformer_layer


def _layer_spec(config: Any) -> Any:
    """gpt_builders' ``_get_transformer_layer_spec`` with ``use_te=False``."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(
        config.num_moe_experts,
        config.moe_grouped_gemm,
        config.qk_layernorm,
        config.multi_latent_attention,
        normalization=config.normalization,
    )


def _estimated(args: dict[str, Any], tp_rank: int = 0, pp_rank: int = 0) -> dict[str, int]:
    spec = spec_from_megatron_args(args)
    out = {t.name: t.numel for t in rank_params(spec, RankPosition(tp_rank, pp_rank))}
    m = spec.model
    if m.moe_router_enable_expert_bias:  # two fp32 [num_experts] buffers per router
        for name in [n for n in out if n.endswith(".router.weight")]:
            stem = "buffer:" + name[: -len("weight")]
            out[stem + "local_tokens_per_expert"] = out[stem + "expert_bias"] = m.num_experts or 0
    return out


def _real_single(args: dict[str, Any]) -> dict[str, int]:
    init_process(0, 1, free_port(), TinyGPTConfig())
    try:
        return _build(args)
    finally:
        destroy_process()


MOE = dict(
    num_experts=4,
    moe_ffn_hidden_size=48,
    moe_router_topk=2,
    swiglu=True,
    normalization="RMSNorm",
    disable_bias_linear=True,
)
MLA = dict(multi_latent_attention=True, **MLA_DIMS)

SINGLE = {
    "moe-shared-dense-first-expert-bias": dict(
        MOE,
        moe_shared_expert_intermediate_size=32,
        moe_layer_freq="[0]+[1]*2",
        moe_router_enable_expert_bias=True,
        moe_router_score_function="sigmoid",
        untie_embeddings_and_output_weights=True,
    ),
    "moe-bias-layernorm-every-2nd": dict(
        num_experts=4, moe_layer_freq=2, num_layers=4, moe_router_topk=3
    ),
    "moe-grouped-gemm": dict(MOE, moe_grouped_gemm=True, moe_layer_freq="([1]+[0])+[1]"),
    "mla-no-q-lora": dict(MLA, disable_bias_linear=True),
    "mla-q-lora-qk-norm-layernorm": dict(MLA, q_lora_rank=24, qk_layernorm=True),
    "mla-moe-mtp2": dict(MOE, **MLA, q_lora_rank=24, qk_layernorm=True, mtp_num_layers=2,
                         moe_shared_expert_intermediate_size=32, moe_layer_freq="[0]+[1]*2"),
    "dense-mtp-learned-absolute": dict(position_embedding_type="learned_absolute",
                                       mtp_num_layers=1),
}  # fmt: skip


# Also run on the newest megatron-core (CI's `-m megatron_versions` run): 0.17 builds local
# grouped-GEMM experts as SequentialMLP and renames MTP's inner layer (megatron_versions.py).
NEWEST = {"moe-grouped-gemm", "mla-moe-mtp2", "dense-mtp-learned-absolute"}


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(v, id=k, marks=[pytest.mark.megatron_versions] if k in NEWEST else [])
        for k, v in SINGLE.items()
    ],
)
def test_inventory_matches_real_model_on_one_rank(overrides):
    args = _args(**overrides)
    assert _estimated(args) == _real_single(args)


def _sharded_worker(rank: int, world: int, port: int, cases: list[dict[str, Any]]) -> list[Any]:
    """Each case: megatron parallel state for its sizes, then the model this rank builds."""
    from megatron.core import parallel_state

    init_process(rank, world, port, TinyGPTConfig())
    out = []
    try:
        for args in cases:
            parallel_state.destroy_model_parallel()
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=args.get("tensor_model_parallel_size", 1),
                pipeline_model_parallel_size=args.get("pipeline_model_parallel_size", 1),
                expert_model_parallel_size=args.get("expert_model_parallel_size", 1),
                expert_tensor_parallel_size=args.get("expert_tensor_parallel_size"),
                create_gloo_process_groups=False,
            )
            real = _build(args)
            tp_rank = parallel_state.get_tensor_model_parallel_rank()
            pp_rank = parallel_state.get_pipeline_model_parallel_rank()
            ep_rank = parallel_state.get_expert_model_parallel_rank()
            out.append((tp_rank, pp_rank, ep_rank, real))
    finally:
        destroy_process()
    return out


SHARDED = {
    "tp2-ep2-etp1-mla-shared": dict(MOE, **MLA, q_lora_rank=24, tensor_model_parallel_size=2,
                                    expert_model_parallel_size=2, expert_tensor_parallel_size=1,
                                    moe_shared_expert_intermediate_size=32),
    "tp2-etp2-moe-grouped": dict(MOE, tensor_model_parallel_size=2, moe_grouped_gemm=True,
                                 moe_layer_freq="[0]+[1]*2"),
    "pp2-moe-mtp-after-dense-last-layer": dict(MOE, num_layers=4, moe_layer_freq="[1]*3+[0]",
                                               pipeline_model_parallel_size=2, mtp_num_layers=1),
    "pp2-uneven-moe-mtp": dict(MOE, num_layers=3, moe_layer_freq="[0]+[1]*2",
                               pipeline_model_parallel_size=2, mtp_num_layers=1,
                               decoder_last_pipeline_num_layers=1),
    "pp2-dense-mtp-tied-learned-absolute": dict(
        position_embedding_type="learned_absolute", num_layers=2,
        pipeline_model_parallel_size=2, mtp_num_layers=1),
}  # fmt: skip


@pytest.mark.multiprocess
def test_sharded_inventory_matches_every_rank_with_ep_etp_and_mtp_stages():
    cases = [_args(**c) for c in SHARDED.values()]
    per_rank = spawn(2, _sharded_worker, free_port(), cases)
    for i, name in enumerate(SHARDED):
        ep_ranks = set()
        for results in per_rank:
            tp_rank, pp_rank, ep_rank, real = results[i]
            ep_ranks.add(ep_rank)
            assert _estimated(cases[i], tp_rank, pp_rank) == real, name
        assert len(ep_ranks) == cases[i].get("expert_model_parallel_size", 1), name


def test_transformer_engine_mla_keeps_down_projections_whole_on_each_tp_rank():
    """TE's MLA spec builds linear_q_down_proj / linear_kv_down_proj as ``TELinear`` with
    ``parallel_mode="duplicated"`` (megatron-core ``MLASelfAttention.__init__``): the full
    ``[rank, h]`` weight on every TP rank, where the local spec shards it by ``tp``."""
    args = _args(**MLA, q_lora_rank=24, tensor_model_parallel_size=2)
    local = _estimated(args)
    te = _estimated({**args, "transformer_impl": "transformer_engine"})
    assert local.keys() == te.keys()
    differ = {n for n in local if local[n] != te[n]}
    assert {n.split(".")[-2] for n in differ} == {"linear_q_down_proj", "linear_kv_down_proj"}
    assert all(te[n] == 2 * local[n] for n in differ)
    assert te["decoder.layers.0.self_attention.linear_q_down_proj.weight"] == 24 * 64


def test_expert_parallel_layout_by_hand():
    """EP=4, ETP=2 on 8 experts: each rank holds 2 experts, each fc1 [2 * ffn / 2, h]."""
    m = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128,
                  seq_length=16, num_experts=8, moe_ffn_hidden_size=96, gated_linear_unit=True,
                  add_bias_linear=False, moe_layer_pattern=(1, 0))  # fmt: skip
    spec = validate_spec(TrainingSpec(m, ParallelSpec(tp=2, ep=4, etp=2, dp=4), PrecisionSpec()))
    params = {t.name: t for t in rank_params(spec, RankPosition())}
    experts = [n for n in params if ".experts." in n]
    assert {n.split(".")[6] for n in experts} == {"0", "1"}  # local experts of this EP rank
    fc1 = params["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"]
    assert fc1.numel == 2 * 96 // 2 * 64 and fc1.expert
    assert params["decoder.layers.0.mlp.router.weight"].numel == 8 * 64
    assert not any(".experts." in n for n in params if n.startswith("decoder.layers.1."))
    assert spec.parallel.expert_dp == 1  # tp x cp x dp = 8 = etp x ep x expert_dp


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (dict(ep=3), r"parallel.ep \(3\) must divide model.num_experts \(8\)"),
        (dict(pattern=(1, 0, 1)), "moe_layer_pattern has 3 entries, model.num_layers is 2"),
        (dict(etp=5), r"parallel.etp \(5\) must divide model.moe_ffn_hidden_size"),
        (dict(ep=8, dp=1), r"parallel.ep x etp \(8 x 1\) must divide parallel.tp x cp x dp"),
        (dict(topk=9), r"model.moe_router_topk \(9\) must be in 1..model.num_experts"),
    ],
)
def test_moe_contradictions_name_the_field(change, needle):
    m = ModelSpec(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=128,
        seq_length=16,
        num_experts=8,
        moe_ffn_hidden_size=96,
        add_bias_linear=False,
        moe_layer_pattern=change.get("pattern"),
        moe_router_topk=change.get("topk", 2),
    )
    p = ParallelSpec(ep=change.get("ep", 2), etp=change.get("etp", 1), dp=change.get("dp", 8))
    with pytest.raises(ValueError, match=needle):
        validate_spec(TrainingSpec(m, p, PrecisionSpec()))  # fmt: skip


def test_moe_layer_freq_is_evaluated_like_megatron_without_eval():
    assert eval_layer_pattern("[0]+[1]*26") == [0] + [1] * 26
    assert eval_layer_pattern("([1]*3+[0]*1)*3") == [1, 1, 1, 0] * 3
    for bad in ("__import__('os')", "[1]**2", "[1]*[2]", "[1]*10000000", "[1"):
        with pytest.raises(ValueError, match="moe_layer_freq"):
            eval_layer_pattern(bad)
    spec = spec_from_megatron_args(_args(**MOE, num_layers=4, moe_layer_freq="3"))
    assert spec.model.moe_layer_pattern == (1, 0, 0, 1)  # Megatron: i % N == 0


def _yaml(model: dict[str, Any], **system: Any) -> dict[str, Any]:
    base = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32)
    return {"system": system, "model": {**base, **model}, "data": {"tokenizer": {}}}


def test_flagscale_yaml_gets_megatron_defaults_vocab_hint_and_hetero_meshes():
    with pytest.raises(ValueError, match=r"placeholder 'xxx'.*pass --vocab-size"):
        spec_from_flagscale_yaml(_yaml({"vocab_size": "xxx"}))
    spec = spec_from_flagscale_yaml(_yaml({"swiglu": True, "multiple_of": 256,
                                           "hidden_size": 4096, "num_attention_heads": 32,
                                           "num_query_groups": 8}), vocab_size=1000)  # fmt: skip
    assert spec.model.ffn == 11008 and spec.model.vocab_size == 1024
    assert spec.model.query_groups == 32  # num_query_groups needs --group-query-attention
    hetero = {
        "enable_hetero": True,
        "hetero_process_meshes": [2, 1, 1, 2, 1, 2, 1, 1, 2, 2],
        "hetero_pipeline_layer_split": [1, 2, 1],
        "pipeline_model_parallel_size": 3,
    }
    spec = spec_from_flagscale_yaml(_yaml({}, hetero=hetero), vocab_size=1000)
    p = spec.parallel
    assert (p.tp, p.pp, p.dp, p.stage_layers, p.stage_meshes) == (2, 3, 2, (1, 2, 1), None)
    # meshes of different tp and dp: each stage gets its own, ranks mesh after mesh
    hetero["hetero_process_meshes"] = [2, 1, 1, 2, 1, 1, 1, 1, 4, 2]
    spec = spec_from_flagscale_yaml(_yaml({}, hetero=hetero), vocab_size=1000)
    p = spec.parallel
    assert p.stage_meshes == ((2, 2), (1, 4), (1, 4)) and p.world_size == 4 + 4 + 4
    assert [position_of_rank(spec, r) for r in (0, 3, 4, 7, 8, 11)] == [
        RankPosition(0, 0), RankPosition(1, 0), RankPosition(0, 1), RankPosition(0, 1),
        RankPosition(0, 2), RankPosition(0, 2),
    ]  # fmt: skip
    stage0, stage1 = (
        estimate_rank(spec, RankPosition(0, 0)),
        estimate_rank(spec, RankPosition(0, 1)),
    )
    full_layer = sum(t.numel for t in layer_params(stage_spec(spec, 1), "layer"))
    half_layer = sum(t.numel for t in layer_params(stage_spec(spec, 0), "layer"))
    assert stage1.persistent.param_count == 2 * full_layer  # two layers at tp 1
    assert half_layer < full_layer  # stage 0 shards its one layer over tp 2
    assert stage0.persistent.param_count > half_layer  # plus its embedding shard
    hetero["hetero_process_meshes"] = [2, 1, 1, 2, 1, 2, 2, 1, 2, 2]
    with pytest.raises(ValueError, match=r"hetero_process_meshes: .* different cp sizes \[1, 2\]"):
        spec_from_flagscale_yaml(_yaml({}, hetero=hetero), vocab_size=1000)


# ---------------------------------------------------------------------------------------------
# Every example training YAML of the FlagScale 0.8.0 wheel

GPT_EXAMPLES = {"aquila", "llama2", "llama3", "qwen2_5", "qwen3", "qwq", "mixtral", "deepseek_v3"}
# Stages on meshes of different tp or dp (FlagScale's heterogeneous training)
MIXED_MESHES = {"aquila/hetero", "deepseek_v3/hetero", "llama3/8b_hetero"}


def _wheel_yamls() -> list[str]:
    try:
        tree = flagscale_tree()
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"FlagScale wheel unavailable: {exc}")
    paths = sorted(glob.glob(os.path.join(tree, "examples", "*", "conf", "train", "*.yaml")))
    assert len(paths) == 36
    return paths


def test_every_flagscale_example_yaml_is_estimated_or_refused_with_the_reason():
    estimated, refused = [], []
    for path in _wheel_yamls():
        example = path.split(os.sep)[-4]
        key = f"{example}/{os.path.splitext(os.path.basename(path))[0]}"
        if example in GPT_EXAMPLES:
            spec = load_config_file(path, vocab_size=151851)
            estimates = estimate_all_ranks(spec)
            for pp_rank in range(spec.parallel.pp):
                counts = {e.persistent.param_count for e in estimates
                          if e.position.pp_rank == pp_rank}  # fmt: skip
                assert len(counts) == 1 and counts.pop() > 0, key  # TP shards agree
            assert all(e.peak_memory_bytes > e.persistent.total_bytes for e in estimates)
            if key in MIXED_MESHES:
                assert spec.parallel.stage_meshes is not None, key
            estimated.append(key)
        else:
            with pytest.raises(ValueError, match="not a GPTModel"):
                load_config_file(path, vocab_size=151851)
            refused.append(key)
    assert len(estimated) == 23 and len(refused) == 13
    moe = [k for k in estimated if re.search(r"mixtral|a\d+b|deepseek", k)]
    assert len(moe) == 7  # mixtral, qwen3 a3b/a22b, deepseek_v3 (4, one hetero)


def test_wheel_moe_mla_mtp_yamls_read_every_expert_field():
    tree = os.path.dirname(_wheel_yamls()[0])
    ds = load_config_file(os.path.join(tree, "..", "..", "..", "deepseek_v3", "conf", "train",
                                       "16b_a3b.yaml"))  # fmt: skip
    m, p = ds.model, ds.parallel
    assert (m.num_experts, m.moe_ffn, m.moe_shared_expert_intermediate_size) == (64, 1408, 2816)
    assert m.moe_layer_pattern == (0,) + (1,) * 26 and m.moe_router_topk == 6
    assert m.multi_latent_attention and m.q_lora_rank is None and m.kv_lora_rank == 512
    assert m.mtp_num_layers == 1 and m.moe_grouped_gemm and m.moe_router_enable_expert_bias
    assert m.transformer_impl == "transformer_engine"
    assert (p.ep, p.expert_tp, p.dp, p.first_stage_layers) == (4, 1, 4, 13)
    last = [t.name for t in rank_params(ds, RankPosition(pp_rank=1))]
    assert "embedding.word_embeddings.weight" in last and "output_layer.weight" in last
    inner = mtp_inner_layer(m)  # named as the installed megatron-core names it
    assert any(n.startswith(f"mtp.layers.0.{inner}.mlp.experts.") for n in last)


def test_mixtral_total_matches_the_published_parameter_count():
    """Mixtral-8x7B has 46,702,792,704 parameters (vocab 32000, untied)."""
    tree = os.path.dirname(_wheel_yamls()[0])
    path = os.path.join(tree, "..", "..", "..", "mixtral", "conf", "train", "8x7b.yaml")
    spec = load_config_file(path, vocab_size=32000)
    one = dataclasses.replace(spec, parallel=ParallelSpec())
    one = dataclasses.replace(one, model=dataclasses.replace(one.model, vocab_size=32000))
    assert sum(t.numel for t in rank_params(validate_spec(one), RankPosition())) == 46_702_792_704


def test_distributed_optimizer_shards_experts_over_expert_data_parallel():
    """tp=1, dp=4, ep=4: dense state is split 4 ways, each rank's own experts' not at all."""
    from memscope.analysis.static.terms import persistent_terms

    m = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128,
                  seq_length=16, num_experts=8, add_bias_linear=False)  # fmt: skip
    precision = PrecisionSpec(params_dtype="bfloat16", grads_in_fp32=True)
    precision = dataclasses.replace(precision, distributed_optimizer=True)
    spec = validate_spec(TrainingSpec(m, ParallelSpec(dp=4, ep=4), precision))
    params = rank_params(spec, RankPosition())
    expert = sum(t.numel for t in params if t.expert)
    dense = sum(t.numel for t in params) - expert
    assert expert == 2 * 2 * (2 * 4 * 64 * 64)  # 2 layers x 2 local experts x fc1 + fc2
    assert persistent_terms(spec, params).optimizer_bytes == 12 * dense // 4 + 12 * expert
