"""The in-run static spec: the attached model's settings first, the args for the rest.

Real megatron-core models (CPU, gloo, one process) are read by
``memscope.integrations.megatron.model_spec``; ``memscope.inputs.inrun`` merges them
with the args and lists where they disagree; the runtime's report carries both.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from typing import Any

import pytest
import torch

from memscope.capture.parallel import ParallelInfo
from memscope.demo.launcher import free_port
from memscope.demo.tiny_gpt import TinyGPTConfig, build_model, destroy_process, init_process
from memscope.demo.traced_training import MINIMAL_ARGS_DROP, megatron_like_args
from memscope.inputs.inrun import (
    ARGS,
    MODEL,
    SETTINGS,
    Disagreement,
    ModelFacts,
    chunk_disagreements,
    inrun_inputs,
)
from memscope.inputs.runtime_estimate import estimate_for_runtime
from memscope.integrations.megatron.model_spec import _config_values, read_model_facts
from memscope.integrations.torch.runtime import optimizer_settings

CFG = TinyGPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                    swiglu=True, seq_length=64, num_microbatches=2)  # fmt: skip
ONE_RANK = ParallelInfo(world_size=1, dp_size=1)
pytestmark = pytest.mark.integration  # builds a real megatron-core GPT in a process group


@pytest.fixture(scope="module")
def tiny_model() -> Any:
    """The tiny real megatron-core GPT (local spec, FUSIONS_OFF), built in this process."""
    gc.collect()
    init_process(0, 1, free_port(), CFG)
    try:
        yield build_model(CFG)
    finally:
        destroy_process()


# -- reading the model -------------------------------------------------------------------------


def test_model_facts_come_from_the_transformer_config_and_the_module_classes(tiny_model):
    facts = read_model_facts(tiny_model)
    assert facts is not None
    v = facts.values
    # the run's TransformerConfig turns the fusions off: Megatron-LM's argument defaults
    # (on) must not be what is read
    assert v["bias_swiglu_fusion"] is False and v["masked_softmax_fusion"] is False
    assert v["apply_rope_fusion"] is False and v["gradient_accumulation_fusion"] is False
    assert v["bias_dropout_fusion"] is False and v["persist_layer_norm"] is False
    # the local spec's classes: ColumnParallelLinear and megatron's DotProductAttention
    assert v["transformer_impl"] == "local" and v["attention_backend"] == "local"
    assert (v["swiglu"], v["num_query_groups"], v["group_query_attention"]) == (True, 2, True)
    assert v["attention_softmax_in_fp32"] is True  # megatron-core's TransformerConfig default
    # the model's own sizes
    assert v["padded_vocab_size"] == CFG.vocab_size
    assert v["max_position_embeddings"] == CFG.seq_length
    assert v["untie_embeddings_and_output_weights"] is False  # pp 1: tied
    assert facts.chunk_layers == (2,)
    assert (facts.chunk_embedding, facts.chunk_output) == ((True,), (True,))


def test_a_plain_torch_model_has_no_model_facts():
    assert read_model_facts([torch.nn.Linear(4, 4)]) is None


def test_moe_and_mla_settings_are_read_from_an_mla_transformer_config():
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=4,
        moe_ffn_hidden_size=32, moe_router_topk=2, moe_layer_freq=[0, 1], kv_lora_rank=16,
        q_lora_rank=24, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=12, mtp_num_layers=1,
        recompute_granularity="selective", recompute_modules=["core_attn", "mla_up_proj"],
        normalization="RMSNorm", add_bias_linear=False, use_cpu_initialization=True,
    )  # fmt: skip
    v = _config_values(config)
    assert (v["num_experts"], v["moe_ffn_hidden_size"], v["moe_layer_freq"]) == (4, 32, [0, 1])
    assert v["multi_latent_attention"] is True
    assert (v["q_lora_rank"], v["kv_lora_rank"], v["v_head_dim"]) == (24, 16, 12)
    assert v["mtp_num_layers"] == 1 and v["recompute_modules"] == ["core_attn", "mla_up_proj"]
    assert (v["normalization"], v["disable_bias_linear"]) == ("RMSNorm", True)


# TransformerConfig settings beyond the fusions that change what a rank holds: (the config
# both runs share, the settings as TransformerConfig fields, the same as Megatron-LM arguments
# (core_transformer_config_from_args copies them by name; fp8_param_gather -> fp8_param), the
# module-class facts of the model).
TE = {"transformer_impl": "transformer_engine", "attention_backend": "flash"}
MOE = dict(num_moe_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2, add_bias_linear=False,
           moe_token_dispatcher_type="alltoall")  # fmt: skip
CONFIG_ONLY_CASES: dict[str, tuple[dict, dict, dict, dict]] = {
    "fp8-tensorwise-primary-weights-bf16-ends": (
        {},
        dict(fp8="hybrid", fp8_recipe="tensorwise", fp8_param=True, first_last_layers_bf16=True,
             disable_parameter_transpose_cache=True),
        dict(fp8_format="hybrid", fp8_recipe="tensorwise", fp8_param_gather=True,
             first_last_layers_bf16=True, disable_parameter_transpose_cache=True),
        TE,
    ),
    "fp4-nvfp4": ({}, dict(fp4="e2m1", fp4_recipe="nvfp4", fp4_param=True),
                  dict(fp4="e2m1", fp4_recipe="nvfp4", fp4_param=True), TE),
    "moe-z-loss-shared-overlap": (
        MOE,
        dict(moe_z_loss_coeff=1e-3, moe_shared_expert_intermediate_size=64,
             moe_shared_expert_overlap=True),
        dict(moe_z_loss_coeff=1e-3, moe_shared_expert_intermediate_size=64,
             moe_shared_expert_overlap=True),
        TE,
    ),
    "fine-grained-offloading": (
        {},
        dict(fine_grained_activation_offloading=True, offload_modules=["attn_norm", "core_attn"],
             min_offloaded_tensor_size=64),
        dict(fine_grained_activation_offloading=True, offload_modules=["attn_norm", "core_attn"],
             min_offloaded_tensor_size=64),
        {"transformer_impl": "local", "attention_backend": "local"},
    ),
    "pipeline-layout": (
        dict(pipeline_model_parallel_size=2, pipeline_dtype=torch.bfloat16),
        dict(pipeline_model_parallel_layout="Et|tttL"),
        dict(pipeline_model_parallel_layout="Et|tttL"),
        TE,
    ),
}  # fmt: skip
# what the model object (not its TransformerConfig) and the trainer give in every case
RUN = dict(padded_vocab_size=256, max_position_embeddings=128, seq_length=128,
           micro_batch_size=2, num_microbatches=4, world_size=2, optimizer="adam")  # fmt: skip


def _real_config(extra: dict[str, Any]) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw: dict[str, Any] = dict(num_layers=4, hidden_size=64, num_attention_heads=4, bf16=True,
                              params_dtype=torch.bfloat16, use_cpu_initialization=True)  # fmt: skip
    return TransformerConfig(**{**kw, **extra})


def _peaks(values: dict[str, Any]) -> list[int]:
    from memscope.analysis.static.estimator import estimate_rank
    from memscope.analysis.static.params import RankPosition
    from memscope.inputs.megatron_args import spec_from_megatron_args

    spec = spec_from_megatron_args(values)
    return [
        estimate_rank(spec, RankPosition(0, stage)).peak_memory_bytes
        for stage in range(spec.parallel.pp)
    ]


@pytest.mark.parametrize("name", list(CONFIG_ONLY_CASES))
def test_settings_only_the_transformer_config_carries_give_the_args_estimate(name):
    """FP8/FP4, MoE z-loss and shared-expert overlap, fine-grained offloading and the pipeline
    layout are read from a real TransformerConfig, so a run with no Megatron args gets the
    estimate the Megatron-LM arguments that built the model give, on every pipeline stage."""
    shared, config_kw, args_kw, modules = CONFIG_ONLY_CASES[name]
    with_settings = ModelFacts({**_config_values(_real_config({**shared, **config_kw})),
                                **modules})  # fmt: skip
    without = ModelFacts({**_config_values(_real_config(shared)), **modules})
    from_model = inrun_inputs(with_settings, None, RUN).values
    from_args = {**inrun_inputs(without, None, RUN).values, **args_kw}
    assert _peaks(from_model) == _peaks(from_args), name
    # and the settings matter: the model without them is estimated differently
    assert _peaks(inrun_inputs(without, None, RUN).values) != _peaks(from_args), name


def test_moe_permute_fusion_the_model_was_built_without_is_a_disagreement():
    """Megatron-LM's --moe-permute-fusion in the args of a model built without it (the fused
    permute needs Transformer Engine): the model's value is used and the report says so."""
    config = _real_config(dict(num_moe_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2,
                               moe_token_dispatcher_type="alltoall"))  # fmt: skip
    facts = ModelFacts({**_config_values(config), **TE})
    args = argparse.Namespace(moe_permute_fusion=True, num_layers=4, **RUN)
    inputs = inrun_inputs(facts, args)
    assert inputs.values["moe_permute_fusion"] is False
    assert inputs.sources["moe_permute_fusion"] == MODEL
    assert Disagreement("moe_permute_fusion", False, True) in inputs.disagreements


class TEDotProductAttention(torch.nn.Module):
    """Stands in for megatron's ``TEDotProductAttention`` (Transformer Engine does not install
    on this CPU machine): only its class name and module are read."""


TEDotProductAttention.__module__ = "megatron.core.extensions.transformer_engine"


def test_te_attention_class_means_te_and_the_configs_attention_backend(tiny_model):
    from megatron.core.transformer.enums import AttnBackend

    from memscope.integrations.megatron.model_spec import _implementation

    layer = tiny_model[0].decoder.layers[0].self_attention
    local, notes = _implementation(tiny_model, AttnBackend.flash)
    assert local == {"transformer_impl": "local", "attention_backend": "local"} and not notes
    original = layer.core_attention
    layer.core_attention = TEDotProductAttention()
    try:
        te, _ = _implementation(tiny_model, AttnBackend.flash)
    finally:
        layer.core_attention = original
    assert te == {"transformer_impl": "transformer_engine", "attention_backend": "flash"}


# -- merging: one source per field ---------------------------------------------------------------


def test_a_field_the_model_carries_comes_from_the_model_even_when_the_args_say_otherwise():
    facts = ModelFacts({"masked_softmax_fusion": False, "num_layers": 2})
    args = argparse.Namespace(masked_softmax_fusion=True, num_layers=2, micro_batch_size=4)
    inputs = inrun_inputs(facts, args)
    assert inputs.values["masked_softmax_fusion"] is False
    assert inputs.sources["masked_softmax_fusion"] == MODEL


def test_a_field_the_model_lacks_comes_from_the_args_then_from_the_run_settings():
    facts = ModelFacts({"num_layers": 2})
    args = argparse.Namespace(micro_batch_size=4, seq_length=None)
    inputs = inrun_inputs(facts, args, {"micro_batch_size": 8, "seq_length": 256})
    assert (inputs.values["micro_batch_size"], inputs.sources["micro_batch_size"]) == (4, ARGS)
    assert (inputs.values["seq_length"], inputs.sources["seq_length"]) == (256, SETTINGS)


def test_keys_the_estimator_does_not_read_are_not_taken_from_the_args():
    inputs = inrun_inputs(ModelFacts({"num_layers": 2}), argparse.Namespace(lr=0.1, save="x"))
    assert set(inputs.values) == {"num_layers"}


def test_without_megatron_args_there_is_no_megatron_dataloader_mask():
    """Megatron-LM's dataloader (and its ``[b, 1, s, s]`` batch mask) comes with its args:
    without them the run settings say none, unless the trainer's settings say otherwise."""
    facts = ModelFacts({"num_layers": 2})
    key = "create_attention_mask_in_dataloader"
    bare = inrun_inputs(facts, None, {"micro_batch_size": 1})
    assert (bare.values[key], bare.sources[key]) == (False, SETTINGS)
    told = inrun_inputs(facts, None, {key: True})
    assert told.values[key] is True
    with_args = inrun_inputs(facts, argparse.Namespace(micro_batch_size=1))
    assert key not in with_args.values  # the args reader's default: Megatron-LM's (on)


def test_without_model_or_args_there_is_nothing_to_estimate():
    with pytest.raises(ValueError, match="neither a megatron-core model"):
        inrun_inputs(None, None, {"micro_batch_size": 1})


# -- disagreements -------------------------------------------------------------------------------


def test_disagreements_list_the_setting_with_both_values():
    facts = ModelFacts({"bias_gelu_fusion": False, "hidden_size": 64, "bf16": True,
                        "attention_backend": "local"})  # fmt: skip
    args = argparse.Namespace(bias_gelu_fusion=True, hidden_size=64, bf16=True,
                              attention_backend="AttnBackend.auto")  # fmt: skip
    found = inrun_inputs(facts, args).disagreements
    assert found == (
        Disagreement("attention_backend", "local", "AttnBackend.auto"),
        Disagreement("bias_gelu_fusion", False, True),
    )
    assert found[1].to_dict() == {"key": "bias_gelu_fusion", "model": False, "args": True}


def test_the_same_value_spelled_differently_is_no_disagreement():
    facts = ModelFacts({"attention_backend": "auto", "hidden_dropout": 0.0, "num_layers": 2})
    args = argparse.Namespace(attention_backend="AttnBackend.auto", hidden_dropout=0, num_layers=2)
    assert inrun_inputs(facts, args).disagreements == ()


def test_megatron_lm_ignores_num_query_groups_without_group_query_attention():
    facts = ModelFacts({"num_query_groups": 4, "group_query_attention": False})
    args = argparse.Namespace(num_query_groups=1, group_query_attention=False)  # the CLI default
    assert inrun_inputs(facts, args).disagreements == ()


def test_a_layer_split_or_embedding_placement_unlike_the_estimators_is_a_disagreement():
    facts = ModelFacts({}, chunk_layers=(3, 1), chunk_embedding=(True, False),
                       chunk_output=(False, False))  # fmt: skip
    assert chunk_disagreements(facts, (2, 2), True, False) == (
        Disagreement("layers_per_chunk", [3, 1], [2, 2]),
    )
    assert [d.key for d in chunk_disagreements(facts, (3, 1), False, True)] == [
        "holds_embedding",
        "holds_output_layer",
    ]


# -- the estimate from each kind of input ----------------------------------------------------------


def test_minimal_args_alone_take_megatron_lms_defaults_the_model_corrects_them(tiny_model):
    facts = read_model_facts(tiny_model)
    full = megatron_like_args(CFG, [])
    minimal = megatron_like_args(CFG, [])
    for name in MINIMAL_ARGS_DROP:
        delattr(minimal, name)
    from_full = estimate_for_runtime(full, ONE_RANK, "cpu")["peak_memory_bytes"]
    alone = estimate_for_runtime(minimal, ONE_RANK, "cpu")["peak_memory_bytes"]
    with_model = estimate_for_runtime(minimal, ONE_RANK, "cpu", model=facts)
    assert alone < 0.8 * from_full  # fused kernels and TE modelled where none run
    assert with_model["peak_memory_bytes"] == from_full
    assert with_model["spec_sources"]["masked_softmax_fusion"] == MODEL
    assert with_model["spec_sources"]["micro_batch_size"] == ARGS


def test_without_args_the_model_and_the_trainers_settings_give_the_full_args_estimate(tiny_model):
    facts = read_model_facts(tiny_model)
    optimizer = torch.optim.Adam([p for c in tiny_model for p in c.parameters()])
    settings = {**optimizer_settings([optimizer]), "seq_length": CFG.seq_length,
                "micro_batch_size": CFG.micro_batch_size,
                "num_microbatches": CFG.num_microbatches}  # fmt: skip
    full = estimate_for_runtime(megatron_like_args(CFG, []), ONE_RANK, "cpu")
    none = estimate_for_runtime(None, ONE_RANK, "cpu", model=facts, settings=settings)
    assert none["peak_memory_bytes"] == full["peak_memory_bytes"]
    assert none["components"] == full["components"]


def test_the_optimizer_object_gives_its_kind():
    w = [torch.nn.Parameter(torch.zeros(2))]
    assert optimizer_settings([torch.optim.AdamW(w)]) == {"optimizer": "adam",
                                                          "torch_optimizer": True}  # fmt: skip
    sgd = optimizer_settings([torch.optim.SGD(w, lr=0.1, momentum=0.9)])
    assert (sgd["optimizer"], sgd["sgd_momentum"]) == ("sgd", 0.9)
    assert optimizer_settings([torch.optim.Adagrad(w)]) == {}


# -- the runtime report ---------------------------------------------------------------------------


def _traced_step(runtime: Any, chunks: list[torch.nn.Module], cfg: TinyGPTConfig) -> str:
    from memscope.demo.tiny_gpt import build_optimizer
    from memscope.demo.tiny_gpt_training import make_data_iterators, train_step

    optimizer = build_optimizer(chunks, cfg)
    runtime.start()
    train_step(chunks, optimizer, cfg, 0, make_data_iterators(cfg), runtime)
    runtime.finalize()
    assert runtime.report_path is not None
    return runtime.report_path


@pytest.mark.integration
def test_the_runtime_report_names_where_args_and_model_disagree(tiny_model, tmp_path):
    from memscope.integrations.megatron.runtime import MemScopeMegatronRuntime

    args = megatron_like_args(CFG, ["--memscope", "--memscope-outdir", str(tmp_path)])
    args.masked_softmax_fusion = True  # the model runs without it
    runtime = MemScopeMegatronRuntime.from_megatron_args(args)
    runtime.attach_model(tiny_model)
    path = _traced_step(runtime, tiny_model, CFG)
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    comp = report["comparisons"]
    assert comp["spec_disagreements"] == [
        {"key": "masked_softmax_fusion", "model": False, "args": True}
    ]
    assert comp["spec_sources"]["masked_softmax_fusion"] == "model"
    assert report["training"]["static_spec"].startswith("the attached model")
    with open(path.replace(".json", ".md"), encoding="utf-8") as f:
        text = f.read()
    assert "the model and the args disagree" in text
    assert "| `masked_softmax_fusion` | False | True |" in text


@pytest.mark.integration
def test_a_torch_runtime_without_batch_sizes_says_which_are_missing(tiny_model, tmp_path):
    from memscope.integrations.torch.runtime import MemScopeTorchRuntime

    runtime = MemScopeTorchRuntime(tiny_model, outdir=str(tmp_path), backend="storage")
    runtime.start()
    runtime.finalize()
    assert runtime.report_path is not None and os.path.exists(runtime.report_path)
    with open(runtime.report_path, encoding="utf-8") as f:
        comp = json.load(f)["comparisons"]
    assert comp["status"] == "missing"
    assert "seq_length and micro_batch_size" in comp["reason"] and "training=" in comp["reason"]


class _BrokenConfig:
    """A config whose reading fails half-way (as a model with a foreign config might)."""

    num_layers, hidden_size, num_attention_heads = 2, 64, 4

    @property
    def tensor_model_parallel_size(self) -> int:
        raise RuntimeError("config exploded")


class _BrokenModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _BrokenConfig()
        self.decoder = torch.nn.Linear(2, 2)


def test_a_model_that_cannot_be_read_leaves_the_torch_runtime_tracing(tmp_path):
    from memscope.integrations.torch.runtime import MemScopeTorchRuntime

    model = _BrokenModel()
    ms = MemScopeTorchRuntime(model, outdir=str(tmp_path), backend="storage")
    with ms, ms.step(0):
        model.decoder(torch.ones(1, 2)).sum().backward()
    assert ms.report_path is not None
    with open(ms.report_path, encoding="utf-8") as f:
        comp = json.load(f)["comparisons"]
    assert comp["status"] == "missing" and "config exploded" in comp["reason"]


def test_a_model_that_cannot_be_read_leaves_the_megatron_estimate_to_the_args(tmp_path):
    from memscope.integrations.megatron.runtime import MemScopeMegatronRuntime

    args = megatron_like_args(CFG, ["--memscope", "--memscope-outdir", str(tmp_path)])
    runtime = MemScopeMegatronRuntime.from_megatron_args(args)
    runtime.attach_model(_BrokenModel())
    assert runtime.model_facts is None
    assert runtime._training_settings()["static_spec"] == "this run's Megatron args"
    assert any("config exploded" in str(f) for f in runtime.session.failures.to_list())
