"""Megatron-FSDP and torch FSDP2 in the static estimator.

The persistent buffers of each ``data_parallel_sharding_strategy`` are checked against the
buffers real megatron-core 0.16.1 Megatron-FSDP allocates for a real GPTModel on two gloo
ranks (CPU stand-ins in ``tests/harness/megatron_fsdp_cpu.py``). torch FSDP2 as megatron-core
wraps it (``TorchFullyShardedDataParallel``, its device mesh built on the CPU instead of
"cuda") runs a forward and backward on two gloo ranks: the parameter and gradient shards are
compared. The optimizer over FSDP2's shards and the in-flight buffers of both are derived
from the source (the report's ``approximated`` list says so).
"""

from __future__ import annotations

from typing import Any

import pytest

from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.megatron_versions import MEGATRON_FSDP_GRADS_DTYPE, at_least
from memscope.analysis.static.params import RankPosition
from memscope.inputs.megatron_args import spec_from_megatron_args

ARGS = dict(num_layers=2, hidden_size=64, num_attention_heads=4, padded_vocab_size=192,
            seq_length=32, max_position_embeddings=32, micro_batch_size=1, num_microbatches=2,
            transformer_impl="local", untie_embeddings_and_output_weights=True, bf16=True,
            use_distributed_optimizer=True, position_embedding_type="rope")  # fmt: skip
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
FSDP2_OK = dict(use_distributed_optimizer=False, no_gradient_accumulation_fusion=True)


def _tiny_bf16_gpt() -> tuple[Any, Any]:
    """(config, model): ARGS's GPT (local spec, untied, learned positions) in bf16, as
    Megatron's Float16Module makes it before wrapping."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.demo.tiny_gpt import FUSIONS_OFF

    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, bf16=True,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=True, **FUSIONS_OFF,
    )  # fmt: skip
    model = GPTModel(
        config=config, transformer_layer_spec=specs.get_gpt_layer_local_spec(),
        vocab_size=192, max_sequence_length=32,  # learned positions (RoPE asks for CUDA)
        share_embeddings_and_output_weights=False,
    ).bfloat16()  # fmt: skip
    return config, model


def _fsdp_worker(rank: int, world: int, port: int) -> dict[str, dict[str, int]]:
    from megatron.core.distributed import DistributedDataParallelConfig

    from memscope.demo.tiny_gpt import TinyGPTConfig, destroy_process, init_process
    from tests.harness.megatron_fsdp_cpu import buffer_bytes, megatron_fsdp_on_cpu

    init_process(rank, world, port, TinyGPTConfig())
    out = {}
    try:
        for strategy in STRATEGIES:
            config, model = _tiny_bf16_gpt()
            ddp = DistributedDataParallelConfig(
                use_megatron_fsdp=True, data_parallel_sharding_strategy=strategy,
                grad_reduce_in_fp32=True, use_distributed_optimizer=True,
            )  # fmt: skip
            out[strategy] = buffer_bytes(megatron_fsdp_on_cpu(config, ddp, model))
    finally:
        destroy_process()
    return out


def _estimate(**kw: Any) -> Any:
    spec = spec_from_megatron_args(dict(ARGS, world_size=2, **kw))
    return estimate_rank(spec, RankPosition(0, 0))


@pytest.mark.integration
@pytest.mark.multiprocess
def test_persistent_buffers_match_megatron_fsdp_for_each_strategy():
    from memscope.demo.launcher import free_port, spawn

    real = spawn(2, _fsdp_worker, free_port())[0]
    for strategy in STRATEGIES:
        est = _estimate(use_megatron_fsdp=True, data_parallel_sharding_strategy=strategy)
        ours = est.persistent
        bufs = real[strategy]
        # Adam's two moments have the main weights' (sharded) shape
        theirs_optimizer = 3 * bufs["main_weight"]
        for name, mine, theirs in (
            ("weights", ours.weight_bytes, bufs["model_weight"]),
            ("gradients", ours.grad_bytes, bufs["main_grad"]),
            ("optimizer", ours.optimizer_bytes, theirs_optimizer),
        ):
            # each buffer's shard is padded to Megatron-FSDP's chunk alignment (not counted)
            assert mine <= theirs <= mine * 1.03 + 4096, (strategy, name, mine, theirs)


def _loss_moment_worker(rank: int, world: int, port: int) -> list[int]:
    """Bytes of unsharded parameter buckets Megatron-FSDP (``optim_grads_params``) holds when
    the output layer has run, just before the loss, in each of two training steps."""
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig

    from memscope.demo.tiny_gpt import TinyGPTConfig, destroy_process, init_process
    from tests.harness.megatron_fsdp_cpu import megatron_fsdp_on_cpu, unsharded_weight_bytes

    init_process(rank, world, port, TinyGPTConfig())
    try:
        config, model = _tiny_bf16_gpt()
        ddp = DistributedDataParallelConfig(
            use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params",
            grad_reduce_in_fp32=True, use_distributed_optimizer=True,
            gradient_reduce_div_fusion=False,  # gloo has no PREMUL_SUM reduction
        )  # fmt: skip
        wrapped = megatron_fsdp_on_cpu(config, ddp, model)
        held: list[int] = []
        model.output_layer.register_forward_hook(
            lambda *_: held.append(unsharded_weight_bytes(wrapped.module))
        )
        tokens = torch.randint(0, 192, (1, 32))
        positions = torch.arange(32).unsqueeze(0)
        for _ in range(2):
            wrapped(tokens, positions, None, labels=tokens).float().sum().backward()
        return held
    finally:
        destroy_process()


@pytest.mark.integration
@pytest.mark.multiprocess
def test_megatron_fsdp_parameters_at_the_loss_match_the_installed_megatron_core():
    """The final norm's forward prefetch all-gathers the released layers again before the
    loss in every step before megatron-core 0.18, in the first step only from 0.18 (its
    backward marks the final norm PRE_BACKWARD for good); the estimate's loss moment follows
    the steady steps of the installed release (run on 0.16.1 and, in CI's second run, 0.19.2)."""
    from memscope.analysis.static.fsdp import in_flight
    from memscope.analysis.static.megatron_versions import megatron_fsdp_loss_regather
    from memscope.analysis.static.params import rank_params
    from memscope.demo.launcher import free_port, spawn

    first, second = spawn(2, _loss_moment_worker, free_port())[0]
    kw = dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    args = dict(ARGS, world_size=2, position_embedding_type="learned_absolute", **kw)
    spec = spec_from_megatron_args(args)
    params = rank_params(spec, RankPosition(0, 0))
    every = sum(t.numel for t in params) * 2  # bf16: the whole model unsharded
    loss = in_flight(spec, params).loss
    # each bucket is padded to Megatron-FSDP's chunk alignment (not counted)
    assert every <= first <= every * 1.03 + 4096  # the first step re-gathers on every release
    assert loss <= second <= loss * 1.03 + 4096, (spec.model.megatron_core_version, loss, second)
    layers = sum(t.numel for t in params if ".layers." in t.name) * 2
    assert (second > first - layers // 2) is megatron_fsdp_loss_regather(spec.model)


def _fsdp2_worker(rank: int, world: int, port: int) -> tuple[int, int]:
    """(parameter bytes, gradient bytes) this rank holds under megatron-core's FSDP2."""
    from unittest import mock

    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed import torch_fully_sharded_data_parallel as fsdp2
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.distributed import DeviceMesh

    from memscope.demo.tiny_gpt import FUSIONS_OFF, TinyGPTConfig, destroy_process, init_process

    class CpuMesh:  # megatron-core asks for a "cuda" mesh over the data-parallel group
        @staticmethod
        def from_group(group: Any, device_type: str = "cuda", **_: Any) -> Any:
            return DeviceMesh.from_group(group, "cpu", mesh_dim_names=("dp",))

    init_process(rank, world, port, TinyGPTConfig())
    try:
        cfg = TransformerConfig(
            num_layers=2, hidden_size=64, num_attention_heads=4, bf16=True,
            params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
            use_cpu_initialization=True, transformer_impl="local", **FUSIONS_OFF,
        )  # fmt: skip
        cpu = mock.patch("torch.cuda.current_device", lambda: torch.device("cpu"))
        with cpu:
            model = GPTModel(
                config=cfg, transformer_layer_spec=specs.get_gpt_layer_local_spec(),
                vocab_size=192, max_sequence_length=32,
                share_embeddings_and_output_weights=False,
            ).bfloat16()  # fmt: skip
        with mock.patch.object(fsdp2, "DeviceMesh", CpuMesh):
            wrapped = fsdp2.TorchFullyShardedDataParallel(
                cfg, DistributedDataParallelConfig(), model
            )
        tokens = torch.randint(0, 192, (2, 32))
        positions = torch.arange(32).expand(2, 32)
        mask = torch.triu(torch.ones(32, 32, dtype=torch.bool), 1).view(1, 1, 32, 32)
        with cpu:
            wrapped(tokens, positions, mask, labels=tokens).sum().backward()
        params = list(wrapped.parameters())
        held = sum(p.to_local().numel() * p.element_size() for p in params)
        grads = sum(p.grad.to_local().numel() * p.grad.element_size() for p in params)
        return held, grads
    finally:
        destroy_process()


@pytest.mark.integration
@pytest.mark.multiprocess
def test_fsdp2_parameter_and_gradient_shards_match_megatron_core():
    from memscope.demo.launcher import free_port, spawn

    est = _estimate(**FSDP2_OK, use_torch_fsdp2=True).persistent
    for held, grads in spawn(2, _fsdp2_worker, free_port()):
        # FSDP2 pads each tensor's first dimension to the group size (not counted)
        assert est.weight_bytes <= held <= est.weight_bytes * 1.02
        assert est.grad_bytes <= grads <= est.grad_bytes * 1.02  # 16-bit gradient shards


def test_each_strategy_shards_one_more_term():
    ddp = _estimate()
    terms = {s: _estimate(use_megatron_fsdp=True, data_parallel_sharding_strategy=s).persistent
             for s in STRATEGIES}  # fmt: skip
    count = ddp.persistent.param_count
    assert terms["no_shard"].optimizer_bytes == 12 * count  # fp32 main + two moments, whole
    assert terms["optim"].optimizer_bytes == -(-12 * count // 2)
    # bf16 training's gradient buffer: fp32 up to megatron-core 0.18, bf16 ("auto") from 0.19
    installed = spec_from_megatron_args(dict(ARGS, world_size=2)).model
    grad = 2 if at_least(installed, MEGATRON_FSDP_GRADS_DTYPE) else 4
    assert terms["optim"].grad_bytes == grad * count == terms["no_shard"].grad_bytes
    assert terms["optim_grads"].grad_bytes == grad * count // 2
    assert terms["optim_grads"].weight_bytes == 2 * count
    assert terms["optim_grads_params"].weight_bytes == count
    # the unsharded parameters and the first unit's gradient come back in backward
    zero3 = _estimate(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    assert zero3.activations.detail["fsdp_unsharded"] >= 2 * count
    assert zero3.persistent.total_bytes < ddp.persistent.total_bytes


def test_torch_fsdp2_shards_everything_and_gathers_two_units():
    ddp = _estimate(**FSDP2_OK)
    fsdp2 = _estimate(**FSDP2_OK, use_torch_fsdp2=True)
    count = ddp.persistent.param_count
    assert fsdp2.persistent.weight_bytes == count  # bf16 over 2 ranks
    assert fsdp2.persistent.grad_bytes == count  # bf16 gradients (no fp32 main-grad buffer)
    assert fsdp2.persistent.optimizer_bytes == 6 * count
    unsharded = fsdp2.activations.detail["fsdp_unsharded"]
    assert 0 < unsharded < 2 * count * 2  # two units and one unit's gradient, not the model


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(FSDP2_OK, use_torch_fsdp2=True, pipeline_model_parallel_size=2), "pipeline"),
        (
            dict(FSDP2_OK, use_torch_fsdp2=True, use_distributed_optimizer=True),
            "use_distributed_optimizer",
        ),
        (dict(FSDP2_OK, use_torch_fsdp2=True, untie_embeddings_and_output_weights=False), "tied"),
        (dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="zero9"), "strategy"),
        (dict(use_megatron_fsdp=True, optimizer="muon", use_distributed_optimizer=False), "muon"),
    ],
)
def test_what_megatron_lm_refuses_for_fsdp_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        spec_from_megatron_args({**ARGS, "world_size": 2, **kw})


def test_report_footer_lists_fsdp_as_modelled_and_its_buffers_as_approximated():
    from memscope.analysis.static.coverage import config_coverage

    args = dict(ARGS, world_size=2, use_megatron_fsdp=True,
                data_parallel_sharding_strategy="optim_grads_params")  # fmt: skip
    result = config_coverage(args, spec_from_megatron_args(args), None)
    assert result.not_modelled == ()
    assert any(m.startswith("Megatron-FSDP (optim_grads_params)") for m in result.modelled)
    assert any("FSDP's unsharded buffers" in a for a in result.approximated)


@pytest.mark.parametrize(
    ("megatron_core", "overlap"), [("0.16.1", False), ("0.19.2", False), ("0.19.2", True)]
)
def test_report_footer_says_what_megatron_fsdp_holds_at_the_loss_and_leaves_out(
    megatron_core, overlap
):
    from memscope.analysis.static.coverage import config_coverage

    args = dict(ARGS, world_size=2, use_megatron_fsdp=True, overlap_grad_reduce=overlap,
                overlap_param_gather=overlap,
                data_parallel_sharding_strategy="optim_grads_params")  # fmt: skip
    spec = spec_from_megatron_args(args, megatron_core=megatron_core)
    (line,) = [a for a in config_coverage(args, spec, None).approximated if "at the loss" in a]
    assert ("every decoder layer again" in line) is (megatron_core == "0.16.1")
    assert ("after the optimizer step" in line) is not overlap


@pytest.mark.parametrize("megatron_core", ["0.16.1", "0.19.2"])
def test_megatron_fsdp_holds_its_non_unit_groups_and_before_0_18_the_layers_at_the_loss(
    megatron_core,
):
    """At the loss the embedding, output layer and final norm (non-unit groups) are gathered;
    before megatron-core 0.18 so are the layers again (the final norm's forward prefetch).
    The layers' backward holds the whole prefetch window and the first unit's gradient."""
    from memscope.analysis.static.fsdp import in_flight, unsharded_bytes
    from memscope.analysis.static.params import rank_params

    kw = dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    spec = spec_from_megatron_args(dict(ARGS, world_size=2, **kw), megatron_core=megatron_core)
    params = rank_params(spec, RankPosition(0, 0))
    flight = in_flight(spec, params)
    root = sum(t.numel for t in params if ".layers." not in t.name)
    layers = sum(t.numel for t in params if ".layers." in t.name)
    regathered = layers if megatron_core == "0.16.1" else 0
    assert flight.loss == (root + regathered) * 2  # bf16
    assert flight.layers == unsharded_bytes(spec, params) >= flight.loss
    output = sum(t.numel for t in params if "output_layer" in t.name)
    assert flight.output_layer - flight.loss == output * 4  # its fp32 gradient bucket
    est = estimate_rank(spec, RankPosition(0, 0))
    held = est.activations.detail["fsdp_unsharded"]
    assert held == (flight.layers if "layer " in est.activations.peak_moment else flight.loss)
    # a stage without the final norm re-gathers nothing
    first = spec_from_megatron_args(
        dict(ARGS, world_size=4, pipeline_model_parallel_size=2, **kw), megatron_core="0.16.1"
    )
    first_params = rank_params(first, RankPosition(0, 0))
    first_root = sum(t.numel for t in first_params if ".layers." not in t.name)
    assert in_flight(first, first_params).loss == first_root * 2


def test_megatron_fsdp_overlap_param_gather_prefetches_the_next_forward_after_the_step():
    from memscope.analysis.static.fsdp import in_flight
    from memscope.analysis.static.params import rank_params

    kw = dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    plain_spec = spec_from_megatron_args(dict(ARGS, world_size=2, **kw))
    plain = estimate_rank(plain_spec, RankPosition(0, 0))
    spec = spec_from_megatron_args(dict(ARGS, world_size=2, overlap_param_gather=True, **kw))
    overlapped = estimate_rank(spec, RankPosition(0, 0))
    count = plain.persistent.param_count  # every bucket fits the 5e8-element window
    assert overlapped.steady_bytes - plain.steady_bytes == 2 * count  # bf16, unsharded
    params = rank_params(spec, RankPosition(0, 0))
    assert overlapped.prefetched_bytes == in_flight(spec, params).after_step
    assert overlapped.peak_memory_bytes == plain.peak_memory_bytes  # not at the step's peak


def test_the_docs_figure_for_the_dense_zero3_golden_case_is_the_benchmarks():
    """docs/static-estimator.md quotes the GPU golden benchmark's dense ZeRO-3 row (measured
    by megatron-core 0.15, so the final norm's re-gather counts); the committed benchmark is
    checked fresh by tests/test_gpu_benchmark_fresh.py."""
    import json
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "benchmarks", "static_gpu_golden.json"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    row = next(r for r in rows if "_tp2_zp_z3_resume_fsdp_dtensor" in r["name"])
    assert row["megatron_core"].startswith("0.15")
    with open(os.path.join(root, "docs", "static-estimator.md"), encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    assert f"counting the re-gather moved it from -2.7% to {100 * row['error']:+.1f}%." in docs
