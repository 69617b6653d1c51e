"""Memory savers in the static estimator and the planner: the precision-aware optimizer,
optimizer CPU offload, activation CPU offload and selective recompute modules.

TE's FusedAdam and the hybrid optimizer need CUDA, so their terms are checked against a hand
derivation from the cited megatron-core 0.16.1 lines; the planner's choices are checked
through MemScope's own Megatron-args and FlagScale YAML readers."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from memscope.analysis.static.activations import dims, layer_saved, recompute_discarded
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition, rank_param_count
from memscope.analysis.static.planner import (
    PRECISION_AWARE,
    apply,
    base_layouts,
    current_layout,
    layouts,
    plan,
    saver_variants,
    stage_peaks,
)
from memscope.inputs.config_files import spec_from_flagscale_yaml
from memscope.inputs.megatron_args import spec_from_megatron_args

ARGS = dict(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=512,
            vocab_size=1024, micro_batch_size=2, global_batch_size=16, bf16=True,
            use_distributed_optimizer=True, data_parallel_size=2, swiglu=True,
            transformer_impl="transformer_engine", attention_backend="flash")  # fmt: skip


def _spec(**extra):
    return spec_from_megatron_args({**ARGS, **extra})


def _rank(spec):
    return estimate_rank(spec, RankPosition())


def test_precision_aware_optimizer_keeps_int16_remainders_and_bf16_moments():
    base, aware = _spec(), _spec(use_precision_aware_optimizer=True, exp_avg_dtype="bf16",
                                 exp_avg_sq_dtype="fp8", main_grads_dtype="bf16")  # fmt: skip
    n = rank_param_count(base, RankPosition())
    # distrib_optimizer.py: fp32 main shard + fp32 exp_avg/exp_avg_sq, over dp=2
    assert _rank(base).persistent.optimizer_bytes == -(-n * 12 // 2)
    # optimizer/__init__.py: TE FusedAdam exp_avg bf16 (2) + exp_avg_sq fp8 (1) + master as
    # int16 remainders (store_param_remainders under bf16, 2); no DO main-param shard
    assert _rank(aware).persistent.optimizer_bytes == -(-n * 5 // 2)
    # arguments.py: main_grads_dtype bf16 keeps the DDP buffer in bf16 (2 bytes, not 4)
    assert _rank(base).persistent.grad_bytes == 4 * n
    assert _rank(aware).persistent.grad_bytes == 2 * n
    assert _rank(aware).post_step_bytes == 0  # FusedAdam reads the bf16 decoupled_grad
    no_rem = _spec(use_precision_aware_optimizer=True, store_param_remainders=False)
    assert _rank(no_rem).persistent.optimizer_bytes == -(-n * 12 // 2)  # fp32 master


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_optimizer_cpu_offload_keeps_the_gpu_share_and_moves_the_rest_to_host(fraction):
    spec = _spec(use_precision_aware_optimizer=True, optimizer_cpu_offload=True,
                 optimizer_offload_fraction=fraction, main_grads_dtype="bf16")  # fmt: skip
    n = rank_param_count(spec, RankPosition())
    est = _rank(spec)
    # hybrid_optimizer.py: an fp32 copy + fp32 Adam state (12 bytes) per element of the
    # distributed optimizer's shard; the offloaded fraction lives in pinned host memory
    shard_state = -(-n * 12 // 2)
    on_gpu = int(shard_state * (1 - fraction))
    assert est.persistent.optimizer_bytes == on_gpu
    assert est.persistent.host_optimizer_bytes == shard_state - on_gpu
    # fp32_param.grad = grad.to(fp32) for the GPU share of the 16-bit gradient shard
    assert est.post_step_bytes == int(-(-n // 2) * (1 - fraction)) * 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"optimizer_cpu_offload": True}, "needs use_precision_aware_optimizer"),
        ({"exp_avg_dtype": "bf16"}, "only be fp32 without use_precision_aware_optimizer"),
        ({"use_precision_aware_optimizer": True, "use_distributed_optimizer": False},
         "needs the adam optimizer and use_distributed_optimizer"),
        ({"cpu_offloading": True, "cpu_offloading_num_layers": 1,
          "pipeline_model_parallel_size": 2}, "pipeline parallelism"),
        ({"cpu_offloading": True, "cpu_offloading_num_layers": 4}, "must be in 0..3"),
        ({"cpu_offloading": True, "recompute_granularity": "selective"}, "recompute"),
        ({"recompute_granularity": "selective", "recompute_modules": ["moe_act"]},
         "needs moe_grouped_gemm"),
        ({"recompute_granularity": "selective", "recompute_modules": ["mla_up_proj"]},
         "needs multi_latent_attention"),
    ],
)  # fmt: skip
def test_megatrons_constraints_on_the_savers_are_refused(extra, message):
    with pytest.raises(ValueError, match=message):
        _spec(**extra)


def test_each_recompute_module_drops_its_saved_tensors():
    local = dict(transformer_impl="local", attention_backend="unfused")
    spec = _spec(recompute_granularity="selective",
                 recompute_modules=["core_attn", "layernorm", "mlp"], **local)  # fmt: skip
    x = dims(spec)
    saved = layer_saved(spec, x)
    dropped = recompute_discarded(spec, x, saved)
    # transformer_layer.py: both norms (local spec) lose output and statistics; the dense
    # MLP's checkpoint keeps only its input (the norm output, counted by the norm)
    assert dropped == {"layernorm": saved["norm_outputs"] + saved["norm_statistics"],
                       "mlp": saved["mlp"]}  # fmt: skip
    plain = _spec(recompute_granularity="selective", **local)
    lighter = _rank(spec).activations.chunk_saved_bytes
    assert _rank(plain).activations.chunk_saved_bytes - lighter == 4 * sum(dropped.values())
    # TE fuses the norms into the next linear layer: layernorm recompute drops nothing
    te = _spec(recompute_granularity="selective", recompute_modules=["layernorm"])
    assert recompute_discarded(te, dims(te), layer_saved(te, dims(te))) == {"layernorm": 0}


def test_activation_offload_keeps_the_rest_and_one_reloaded_layer():
    plain = _spec()
    offload = _spec(cpu_offloading=True, cpu_offloading_num_layers=3)
    x = dims(plain)
    saved = layer_saved(plain, x)
    moved = sum(saved.values()) - saved.get("residual_dropout_masks", 0)
    a, b = _rank(plain).activations, _rank(offload).activations
    assert a.chunk_saved_bytes - b.chunk_saved_bytes == 3 * moved
    assert b.detail["offloaded_to_host"] == 3 * moved
    local = _spec(cpu_offloading=True, cpu_offloading_num_layers=3, transformer_impl="local")
    assert "offloaded_to_host" not in _rank(local).activations.detail  # nothing TE-marked


def _yaml_spec(user_args, layout):
    """The plan's FlagScale YAML snippet merged into the user's config, read back."""
    merged = {**user_args, **layout.megatron_args()}
    merged.pop("data_parallel_size", None)
    return spec_from_flagscale_yaml({"system": merged}, world_size=layout.tp * layout.pp
                                    * layout.cp * layout.dp)  # fmt: skip


def _flags_spec(user_args, layout):
    """The plan's printed flags parsed the way Megatron's argparse names them."""
    out = dict(user_args)
    out.pop("data_parallel_size", None)
    for key in [k for k in out if "recompute" in k or "offload" in k]:
        out.pop(key)
    words = shlex.split(layout.flags())
    i = 0
    while i < len(words):
        key = words[i][2:].replace("-", "_")
        values = []
        i += 1
        while i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        out[key] = True if not values else (values if key == "recompute_modules" else values[0])
    out["world_size"] = layout.tp * layout.pp * layout.cp * layout.dp
    return spec_from_megatron_args(out)


def test_the_planner_uses_savers_when_the_budget_needs_them_and_flags_round_trip():
    args = {**ARGS, "num_layers": 8, "seq_length": 2048, "global_batch_size": 8}
    spec = spec_from_megatron_args(args)
    world = 2
    peaks = stage_peaks(spec)
    budget = int(max(peaks) * 0.55)
    result = plan(spec, world, budget, top=50)
    assert result["plans"], "a saver must make some layout fit"
    chosen = [p["layout"] for p in result["plans"]]
    assert any(c["precision_aware"] or c["optimizer_offload_fraction"] is not None
               or c["cpu_offloading_num_layers"] is not None
               or c["recompute_modules"] != ["core_attn"] for c in chosen)  # fmt: skip
    for p in result["plans"]:
        layout = dataclasses.replace(
            current_layout(spec),
            **{k: tuple(v) if isinstance(v, list) else v for k, v in p["layout"].items()},
        )
        expected = apply(spec, layout)
        assert p["peak_bytes"] <= budget
        assert stage_peaks(_flags_spec(args, layout)) == stage_peaks(expected), p["flags"]
        # the YAML snippet over the user's FlagScale YAML (FlagScale's own defaults)
        user_yaml = {k: v for k, v in args.items() if k != "data_parallel_size"}
        mine = spec_from_flagscale_yaml({"system": user_yaml}, world_size=world)
        assert stage_peaks(_yaml_spec(args, layout)) == stage_peaks(apply(mine, layout))


def test_activation_offload_is_never_offered_with_pipeline_parallelism():
    spec = _spec(num_layers=8)
    seen = list(layouts(spec, 4))
    offloads = [lay for lay in seen if lay.cpu_offloading_num_layers is not None]
    assert offloads and all(lay.pp == 1 and lay.recompute is None for lay in offloads)
    assert all(lay.precision_aware for lay in seen if lay.optimizer_offload_fraction is not None)
    assert {m for lay in seen for m in lay.recompute_modules} >= {"core_attn", "mlp"}


def test_bf16_optimizer_state_is_searched_only_when_asked():
    spec = _spec(num_layers=8)
    base = next(base_layouts(spec, 2))
    lossless = {v.precision_aware for v in saver_variants(spec, base)}
    assert lossless == {None, "fp32"}
    everything = {v.precision_aware for v in saver_variants(spec, base, bf16_state=True)}
    assert everything == {None, *PRECISION_AWARE}
    # under a budget only lighter optimizer state can meet, the default plans keep fp32 state
    budget = int(max(stage_peaks(spec)) * 0.55)
    default = plan(spec, 2, budget, top=50)
    assert default["bf16_optimizer_state"] is False
    assert {p["layout"]["precision_aware"] for p in default["plans"]} <= {None, "fp32"}
    opted = plan(spec, 2, budget, top=50, bf16_state=True)
    assert opted["fitting"] >= default["fitting"]
