"""Transformer Engine CUDA graphs in the static estimator (``memscope/analysis/static/
cuda_graphs.py``): the settings as Megatron-LM's releases spell them, the static buffers in the
steady allocation, the capture before the first optimizer step without Adam's moments, the
replayed step without the graphed tensors, and Megatron's own graphs still warned as not
modelled. CUDA graphs do not run on CPU: the terms are derived from Megatron-LM's and
Transformer Engine's code (the module's docstring names it) and checked on GPU memory that
NVIDIA published (tools/bench_static_published.py, tools/bench_static_gpu_golden.py)."""

from __future__ import annotations

import dataclasses

import pytest

from memscope.analysis.static.activations import dims, layer_saved
from memscope.analysis.static.coverage import config_coverage
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition
from memscope.inputs.megatron_args import spec_from_megatron_args

S, B, H, A, L = 512, 2, 256, 4, 4
ARGS = dict(num_layers=L, hidden_size=H, num_attention_heads=A, padded_vocab_size=1024,
            seq_length=S, micro_batch_size=B, global_batch_size=B, bf16=True,
            transformer_impl="transformer_engine", attention_backend="unfused",
            world_size=1)  # fmt: skip


def _spec(release: str = "0.20.0", **extra):
    """The args' spec on a GPU, for megatron-core ``release``."""
    spec = spec_from_megatron_args({**ARGS, **extra})
    model = dataclasses.replace(spec.model, megatron_core_version=release)
    return dataclasses.replace(spec, device="cuda", model=model)


def _attention_half(spec) -> int:
    """What a layer saves up to its pre-MLP norm (no recompute here): all but the MLP, the
    pre-MLP norm's output and statistics, the layer's output and the MLP's dropout mask."""
    x = dims(spec)
    items = layer_saved(spec, x)
    mlp_half = items["mlp"] + items["layer_output"] + items["residual_dropout_masks"] // 2
    mlp_half += (items["norm_outputs"] + items["norm_statistics"]) // 2
    return sum(items.values()) - mlp_half


@pytest.mark.parametrize(
    ("args", "impl", "modules", "warmup"),
    [
        ({"external_cuda_graph": True, "cuda_graph_scope": "attn"}, "transformer_engine",
         ("attn",), 3),
        ({"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn", "mlp"],
          "cuda_graph_warmup_steps": 0}, "transformer_engine", ("attn", "mlp"), 0),
        ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "full"},
         "transformer_engine", (), 3),
        ({"cuda_graph_impl": "transformer_engine",
          "cuda_graph_modules": "[attn mlp moe_router]"}, "transformer_engine",
         ("attn", "mlp", "moe_router"), 3),
        ({"enable_cuda_graph": True}, "local", (), 3),
        ({}, "none", (), 3),
    ],
)  # fmt: skip
def test_the_args_reader_takes_every_releases_spelling_of_cuda_graphs(args, impl, modules, warmup):
    spec = _spec(**args)
    assert (spec.cuda_graph_impl, spec.cuda_graph_modules) == (impl, modules)
    assert spec.cuda_graph_warmup_steps == warmup


def test_static_inputs_stay_allocated_one_set_per_graphed_layer_in_flight():
    eager = estimate_rank(_spec(), RankPosition())
    graphed = estimate_rank(
        _spec(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"]), RankPosition()
    )
    x = dims(_spec())
    mask = B * S * S  # the batch's [b, 1, s, s] bool attention mask, an input of the graph
    # no pipelining: one microbatch in flight, every layer graphed
    assert graphed.steady_bytes - eager.steady_bytes == L * (x.hidden + mask) + 2 * x.hidden
    without_mask = estimate_rank(
        _spec(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"],
              create_attention_mask_in_dataloader=False), RankPosition(),
    )  # fmt: skip
    assert without_mask.cuda_graphs.static_bytes == L * x.hidden + 2 * x.hidden


def test_a_capture_before_the_first_step_holds_the_graphed_halves_without_adams_moments():
    spec = _spec(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"],
                 cuda_graph_warmup_steps=0)  # fmt: skip
    est = estimate_rank(spec, RankPosition())
    graphs = est.cuda_graphs
    assert graphs is not None and not graphs.eager_warmup
    assert graphs.graphed_per_layer == _attention_half(spec)
    # the unfused scores make the capture, with every layer's attention half, the peak
    assert est.peak_stage == "cuda_graph_capture"
    comp = est.components()
    # bf16 Adam, one rank: 4 bytes of fp32 main weights per parameter exist before the first
    # step, its two fp32 moments (8 bytes) not yet
    assert comp["optimizer_state"] == 4 * est.persistent.param_count
    assert sum(comp.values()) == est.peak_memory_bytes
    eager = estimate_rank(_spec(), RankPosition())
    # the MLP halves were never run in the capture: below the eager peak
    assert est.peak_memory_bytes < eager.peak_memory_bytes


def test_megatron_core_before_0_16_captures_before_the_loop_whatever_the_warmup():
    old = _spec("0.15.0", external_cuda_graph=True, cuda_graph_scope="attn")
    new = _spec(external_cuda_graph=True, cuda_graph_scope="attn")
    assert old.cuda_graph_warmup_steps == new.cuda_graph_warmup_steps == 3
    assert not estimate_rank(old, RankPosition()).cuda_graphs.eager_warmup
    assert estimate_rank(new, RankPosition()).cuda_graphs.eager_warmup


def test_after_eager_warmup_the_peak_is_never_below_the_eager_one():
    spec = _spec(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"])
    est, eager = estimate_rank(spec, RankPosition()), estimate_rank(_spec(), RankPosition())
    assert est.peak_memory_bytes >= eager.peak_memory_bytes
    assert est.peak_stage == "forward_backward"


def test_a_replayed_step_keeps_the_graphed_tensors_in_the_pool():
    spec = _spec(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"],
                 cuda_graph_warmup_steps=0)  # fmt: skip
    est, eager = estimate_rank(spec, RankPosition()), estimate_rank(_spec(), RankPosition())
    x = dims(spec)
    replayed = est._transient_moments()["forward_backward"]
    # each layer's attention half and its output (copied into the next graph's input) leave
    # the allocated bytes; the static inputs come in
    removed = L * (_attention_half(spec) + x.hidden)
    assert replayed == eager.activations.total_bytes - removed + est.cuda_graphs.static_bytes
    assert replayed < eager.activations.total_bytes


def test_whole_layer_graphs_of_a_dense_model_hold_every_saved_tensor_at_the_capture():
    spec = _spec(cuda_graph_impl="transformer_engine", cuda_graph_warmup_steps=0)
    x = dims(spec)
    assert estimate_rank(spec, RankPosition()).cuda_graphs.graphed_per_layer == sum(
        layer_saved(spec, x).values()
    )


def test_megatrons_own_graphs_are_warned_and_transformer_engines_are_modelled():
    local = _spec(cuda_graph_impl="local")
    te = _spec(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"])
    warned = config_coverage({"cuda_graph_impl": "local"}, local).not_modelled
    assert [n.key for n in warned] == ["cuda_graph_impl"]
    coverage = config_coverage({"cuda_graph_impl": "transformer_engine"}, te)
    assert coverage.not_modelled == ()
    assert any("CUDA graphs" in line for line in coverage.modelled)
    assert estimate_rank(local, RankPosition()).cuda_graphs is None
