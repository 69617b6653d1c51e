"""Muon (``--optimizer muon``) and the layer-wise distributed Muon (``dist_muon``) in the
static estimator, against the installed megatron-core (CI: 0.16.1 and the newest).

Which tensors Muon updates is checked on real GPTModels (the layout test covers the MTP
chunk's embedding copy, tagged from 0.18); how ``dist_muon`` deals whole tensors to
data-parallel ranks is checked by running megatron-core's own
``LayerWiseDistributedOptimizer.shard_params`` on two gloo ranks (its size-sorted ping-pong
split, Megatron-LM's ``--no-use-layer-wise-param-layout``); from 0.18 Megatron-LM passes the
bucket layout by default, checked by running ``compute_full_param_layout`` and
``shard_params``' layout path on the newest megatron-core (skipped before 0.18). Muon's
step itself needs the ``emerging_optimizers`` package, which is not installable here: the two
parameter groups are carried by plain ``torch.optim.SGD`` instances (``shard_params`` reads
only their ``param_groups``), and the Newton-Schulz temporaries are derived from source
(stated in the report's ``approximated`` list).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.muon import bucket_layout_owned, layer_wise_owned, muon_managed
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.inputs.megatron_args import spec_from_megatron_args

# h 64, vocab 160, 40 positions: no Muon tensor has the size of an Adam one (shard_params
# orders equal sizes by parameter group)
ARGS = dict(num_layers=3, hidden_size=64, num_attention_heads=4, padded_vocab_size=160,
            seq_length=40, max_position_embeddings=40, micro_batch_size=1,
            num_microbatches=2, transformer_impl="local", mtp_num_layers=1,
            untie_embeddings_and_output_weights=True, bf16=True)  # fmt: skip


def _tiny_model() -> Any:
    """The GPTModel of ``ARGS`` on CPU (process groups already set up)."""
    from unittest import mock

    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.demo.tiny_gpt import FUSIONS_OFF

    config = TransformerConfig(
        num_layers=3, hidden_size=64, num_attention_heads=4, mtp_num_layers=1,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, bf16=True,
        use_cpu_initialization=True, **FUSIONS_OFF,
    )  # fmt: skip
    layer = specs.get_gpt_layer_local_spec()
    with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):  # CPU build
        return GPTModel(
            config=config, transformer_layer_spec=layer, vocab_size=160,
            max_sequence_length=40, share_embeddings_and_output_weights=False,
            mtp_block_spec=specs.get_gpt_mtp_block_spec(config, layer, False),
        )  # fmt: skip


def _muon_split(named: dict[str, Any]) -> list[str]:
    """get_megatron_muon_optimizer's split, as muon.py writes it."""
    return [
        n
        for n, p in named.items()
        if p.dim() == 2 and not getattr(p, "is_embedding_or_output_parameter", False)
    ]


def _shard_worker(rank: int, world: int, port: int) -> dict[str, Any]:
    """This rank's tensors under megatron-core's layer-wise sharding (data parallel 2)."""
    import torch
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
    from megatron.core.process_groups_config import ProcessGroupCollection

    from memscope.demo.tiny_gpt import TinyGPTConfig, destroy_process, init_process

    init_process(rank, world, port, TinyGPTConfig())
    try:
        named = dict(_tiny_model().named_parameters())
        muon = _muon_split(named)
        adam = [n for n in named if n not in muon]  # fmt: skip
        carriers = [torch.optim.SGD([named[n] for n in group], lr=0.0) for group in (muon, adam)]
        # the optimizer without its __init__ (which would build the Muon step): what
        # shard_params reads of it are the process groups (0.16.1), or the dp_cp and expt_dp
        # groups __init__ caches (0.18+, where no full_param_layouts means the
        # ping-pong split: Megatron-LM's --no-use-layer-wise-param-layout; the default bucket
        # layout is test_dist_muon_bucket_layout_matches_megatron_core's)
        groups = ProcessGroupCollection.use_mpu_process_groups()
        holder = LayerWiseDistributedOptimizer.__new__(LayerWiseDistributedOptimizer)
        holder.pg_collection, holder.dp_cp, holder.expt_dp = groups, groups.dp_cp, groups.expt_dp
        holder.shard_params(carriers)
        by_id = {id(p): n for n, p in named.items()}
        own = [by_id[id(p)] for opt in carriers for g in opt.param_groups for p in g["params"]]
        return {"muon": muon, "own": sorted(own), "numel": {n: p.numel() for n, p in named.items()}}
    finally:
        destroy_process()


def _layout_worker(rank: int, world: int, port: int, cases: list) -> dict[str, Any]:
    """Each data-parallel shard's tensors under megatron-core's (0.18+) bucket layout, for
    each (shards, bucket size) of ``cases``: ``compute_full_param_layout`` as Megatron-LM's
    ``wrap_model_chunks_with_ddp`` calls it (after ``tag_params_for_buffer_routing``), then
    ``_shard_params_from_layout`` (``shard_params`` with a layout) on a Muon carrier; with no
    data-parallel group it fills every shard's list (``dp_cp_params_list``)."""
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import layer_wise_optimizer as lw
    from megatron.core.transformer.module import Float16Module

    from memscope.demo.tiny_gpt import TinyGPTConfig, destroy_process, init_process

    init_process(rank, world, port, TinyGPTConfig())
    try:
        model = _tiny_model()
        # Megatron-LM's get_model wraps the chunk in Float16Module (every parameter bf16: one
        # buffer dtype) before DDP; the layout is computed on the wrapped chunk's parameters
        Float16Module(model.config, model)
        lw.tag_params_for_buffer_routing([model])
        named = dict(model.named_parameters())
        by_id = {id(p): n for n, p in named.items()}
        ddp = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=True
        )
        out = {}
        for ranks, size in cases:
            layout = lw.LayerWiseDistributedOptimizer.compute_full_param_layout(
                list(named.values()), size, ranks, ddp, expert_data_parallel_world_size=1
            )
            carrier = torch.optim.SGD([named[n] for n in _muon_split(named)], lr=0.0)
            holder = lw.LayerWiseDistributedOptimizer.__new__(lw.LayerWiseDistributedOptimizer)
            holder.dp_cp = holder.expt_dp = None
            holder._shard_params_from_layout([carrier], [layout], ranks, 1)
            out[f"{ranks} {size}"] = [sorted(by_id[id(p)] for p in shard)
                              for shard in holder.dp_cp_params_list]  # fmt: skip
        return out
    finally:
        destroy_process()


def _installed_has_bucket_layout() -> bool:
    """Whether the installed megatron-core has the layer-wise bucket layout (0.18+); where
    not, the test skips, or fails where ``MEMSCOPE_REQUIRE_MEGATRON_VERSIONS=1`` (CI's newest
    megatron-core run)."""
    import importlib.metadata
    import os

    from memscope.analysis.static.megatron_versions import (
        LAYER_WISE_PARAM_LAYOUT,
        release_at_least,
    )

    if release_at_least(importlib.metadata.version("megatron-core"), LAYER_WISE_PARAM_LAYOUT):
        return True
    if os.environ.get("MEMSCOPE_REQUIRE_MEGATRON_VERSIONS") == "1":
        pytest.fail("the newest megatron-core run needs megatron-core 0.18+")
    return False


LAYOUT_CASES = [(2, None), (3, None), (2, 20_000), (3, 30_000)]  # (shards, bucket size)


@pytest.mark.integration
@pytest.mark.multiprocess
@pytest.mark.megatron_versions
def test_dist_muon_bucket_layout_matches_megatron_core():
    """megatron-core 0.18+ optimizer/layer_wise_optimizer.py
    ``LayerWiseDistributedOptimizer.compute_full_param_layout`` and ``shard_params``
    (``_shard_params_from_layout``) against muon.py ``bucket_layout_owned``."""
    if not _installed_has_bucket_layout():
        pytest.skip("megatron-core before 0.18 has no layer-wise bucket layout")
    from memscope.demo.launcher import free_port, spawn

    [real] = spawn(1, _layout_worker, free_port(), LAYOUT_CASES)
    spec = spec_from_megatron_args(dict(ARGS, world_size=2, optimizer="dist_muon"))
    params = [t for t in rank_params(spec, RankPosition(0, 0)) if muon_managed(t)]
    for ranks, size in LAYOUT_CASES:
        ours = [sorted(t.name for t in shard) for shard in bucket_layout_owned(params, ranks, size)]
        assert ours == real[f"{ranks} {size}"], (ranks, size)
    assert real["2 None"] != real["2 20000"]  # the bucket size moves tensors between shards


@pytest.mark.integration
@pytest.mark.multiprocess
def test_muon_split_and_layer_wise_shards_match_megatron_core():
    from memscope.demo.launcher import free_port, spawn

    results = spawn(2, _shard_worker, free_port())
    spec = spec_from_megatron_args(dict(ARGS, world_size=2, optimizer="dist_muon"))
    params = rank_params(spec, RankPosition(0, 0))
    assert {t.name: t.numel for t in params} == results[0]["numel"]
    assert sorted(t.name for t in params if muon_managed(t)) == sorted(results[0]["muon"])
    assert "embedding.word_embeddings.weight" not in results[0]["muon"]  # tagged: Adam
    assert "embedding.position_embeddings.weight" in results[0]["muon"]  # 2-D, untagged
    for rank, real in enumerate(results):
        assert sorted(t.name for t in layer_wise_owned(params, 2, rank)) == real["own"]
    assert set(results[0]["own"]) | set(results[1]["own"]) == set(results[0]["numel"])


def _optimizer_bytes(version: str = "0.16.1", **kw: Any) -> tuple[int, int, list[Any]]:
    """Optimizer state and step temporaries of rank (0, 0), as megatron-core ``version``."""
    spec = spec_from_megatron_args(dict(ARGS, **kw))
    spec = replace(spec, model=replace(spec.model, megatron_core_version=version))
    est = estimate_rank(spec, RankPosition(0, 0))
    return est.persistent.optimizer_bytes, est.optimizer_step_bytes, est.params


def test_muon_keeps_one_moment_for_matrices_and_adams_two_for_the_rest():
    adam, _, params = _optimizer_bytes(optimizer="adam", world_size=1)
    muon, step, _ = _optimizer_bytes(optimizer="muon", world_size=1)
    matrices = sum(t.numel for t in params if muon_managed(t))
    assert adam - muon == 4 * matrices  # one fp32 moment fewer per Muon element
    assert muon == 8 * sum(t.numel for t in params) + 4 * (sum(t.numel for t in params) - matrices)
    largest = max(t.numel for t in params if muon_managed(t))
    assert step == 12 * largest  # three fp32 copies at muon.py's scaling line


def test_dist_muon_shards_state_over_data_parallel_and_gathers_after_the_step():
    muon, _, params = _optimizer_bytes(optimizer="muon", world_size=4)
    dist, step, _ = _optimizer_bytes(optimizer="dist_muon", world_size=4)
    assert muon / 4 <= dist < muon / 2  # whole tensors: about a quarter, never below it
    total = sum(t.numel for t in params)
    assert step >= 2 * total  # the all-gather buffer of every tensor, bf16


def test_muon_tp_duplicated_mode_orthogonalises_the_full_matrix():
    _, blockwise, _ = _optimizer_bytes(optimizer="muon", tensor_model_parallel_size=2,
                                       world_size=2)  # fmt: skip
    _, duplicated, _ = _optimizer_bytes(optimizer="muon", tensor_model_parallel_size=2,
                                        world_size=2, muon_tp_mode="duplicated")  # fmt: skip
    assert duplicated == 2 * blockwise


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(optimizer="muon", use_distributed_optimizer=True), "dist_muon"),
        (dict(optimizer="muon", bf16=False, fp16=True), "fp16"),
        (dict(optimizer="muon", muon_tp_mode="sideways"), "muon_tp_mode"),
    ],
)
def test_what_megatron_refuses_for_muon_is_refused(kw, match, monkeypatch):
    import memscope.inputs.megatron_args as megatron_args

    # megatron-core 0.16's Muon (0.19 reads muon + the distributed optimizer as dist_muon)
    monkeypatch.setattr(megatron_args, "package_version", lambda name: "0.16.1")
    with pytest.raises(ValueError, match=match):
        spec_from_megatron_args(dict(ARGS, **kw))


@pytest.mark.parametrize("version", ["0.19.2", "0.16.1"])
def test_muon_with_the_distributed_optimizer_is_layer_wise_muon_from_0_19(monkeypatch, version):
    import memscope.inputs.megatron_args as megatron_args

    monkeypatch.setattr(megatron_args, "package_version", lambda name: version)
    args = dict(ARGS, world_size=4, optimizer="muon", use_distributed_optimizer=True)
    if version == "0.16.1":  # megatron-core 0.16's Muon refuses the distributed optimizer
        with pytest.raises(ValueError, match="dist_muon"):
            spec_from_megatron_args(args)
        return
    spec = spec_from_megatron_args(args)
    assert (spec.precision.optimizer, spec.precision.distributed_optimizer) == ("dist_muon", False)
    layer_wise = estimate_rank(spec, RankPosition(0, 0)).persistent.optimizer_bytes
    assert layer_wise == _optimizer_bytes(version, optimizer="dist_muon", world_size=4)[0]


def test_a_parsed_namespaces_layer_wise_flag_means_layer_wise_muon_on_any_release(monkeypatch):
    import memscope.inputs.megatron_args as megatron_args

    monkeypatch.setattr(megatron_args, "package_version", lambda name: "0.16.1")
    spec = spec_from_megatron_args(dict(ARGS, world_size=4, optimizer="muon",
                                        use_layer_wise_distributed_optimizer=True))  # fmt: skip
    assert spec.precision.optimizer == "dist_muon"


@pytest.mark.megatron_versions
def test_dist_muon_from_0_18_shards_by_bucket_layout_and_byte_shards_adams_state():
    """megatron-core 0.18+ (megatron_versions.LAYER_WISE_PARAM_LAYOUT): Muon's tensors by
    the bucket layout's shards, Adam's state byte-sharded by the separate
    DistributedOptimizer (optimizer/__init__.py), the all-gather in place (no buffers)."""
    kw = dict(optimizer="dist_muon", world_size=3)
    legacy, legacy_step, params = _optimizer_bytes("0.16.1", **kw)
    assert legacy == _optimizer_bytes("0.19.2", no_use_layer_wise_param_layout=True, **kw)[0]
    layout, step, _ = _optimizer_bytes("0.19.2", **kw)
    muon = [t for t in params if muon_managed(t)]
    adam = sum(t.numel for t in params if not muon_managed(t))
    busiest = max(sum(t.numel for t in shard) for shard in bucket_layout_owned(muon, 3, None))
    # Muon: fp32 main copy + momentum per element; Adam: main copy + two moments, over dp 3
    assert layout == 8 * busiest + -(-12 * adam // 3)
    assert layout != legacy
    largest = max(t.numel for t in muon)
    assert step == 12 * largest < legacy_step  # Newton-Schulz only: no flat gather buffers


@pytest.mark.megatron_versions
def test_dist_muon_buckets_need_overlap_grad_reduce_and_the_first_pipeline_stage():
    """Megatron-LM training.py ``resolve_ddp_bucket_size`` and ``get_model``'s per-chunk
    bucket sizes: one bucket without --overlap-grad-reduce, on later stages and chunks."""
    from memscope.analysis.static.muon import ddp_bucket_size

    spec = spec_from_megatron_args(dict(ARGS, optimizer="dist_muon", world_size=64,
                                        overlap_grad_reduce=True))  # fmt: skip
    assert ddp_bucket_size(spec, 0, 0) == 64_000_000  # max(4e7, 1e6 x dp_cp)
    assert ddp_bucket_size(spec, 1, 0) is None and ddp_bucket_size(spec, 0, 1) is None
    fixed = replace(spec, precision=replace(spec.precision, ddp_bucket_size=20_000))
    assert ddp_bucket_size(fixed, 0, 0) == 20_000
    off = spec_from_megatron_args(dict(ARGS, optimizer="dist_muon", world_size=64))
    assert ddp_bucket_size(off, 0, 0) is None


def test_bucket_layout_packs_whole_tensors_largest_first_per_bucket():
    """``_compute_per_buffer_param_layout``'s LPT on explicit sizes: the tensors walked in
    reverse, a bucket closing at max(bucket_size, int(0.9 x shards x its largest tensor))
    elements, each bucket bin-packed largest first onto the least-filled shard."""
    from memscope.analysis.static.params import ParamTensor

    def names(shards: list[list[ParamTensor]]) -> list[list[str]]:
        return [[t.name for t in shard] for shard in shards]

    ts = [ParamTensor(f"t{i}", n) for i, n in enumerate([100, 64, 64, 30, 1000])]
    # one bucket: t4 fills shard 0; t0, then t2 and t1 (equal: reverse order), t3 go to 1
    assert names(bucket_layout_owned(ts, 2, None)) == [["t4"], ["t0", "t2", "t1", "t3"]]
    # bucket_size 10: t4 alone sets the threshold to 1800 elements, more than all: one bucket
    assert names(bucket_layout_owned(ts, 2, 10)) == names(bucket_layout_owned(ts, 2, None))
    small = [ParamTensor(f"s{i}", 64) for i in range(4)]
    # threshold int(0.9 x 2 x 64) = 115: every two tensors close a bucket, each bucket
    # gives one tensor to each shard
    assert names(bucket_layout_owned(small, 2, 10)) == [["s3", "s1"], ["s2", "s0"]]
    assert names(bucket_layout_owned(small, 2, None)) == [["s3", "s1"], ["s2", "s0"]]
    assert names(bucket_layout_owned(small, 3, None)) == [["s3", "s0"], ["s2"], ["s1"]]


@pytest.mark.megatron_versions
@pytest.mark.parametrize("version, refused", [("0.19.2", True), ("0.16.1", False)])
def test_expert_biases_under_the_bucket_layout_are_refused_as_megatron_refuses_them(
    monkeypatch, version, refused
):
    """megatron-core 0.19 optimizer/__init__.py (``get_megatron_optimizer``'s layer-wise +
    DistributedOptimizer path) asserts that no expert-parallel group is Adam's."""
    import memscope.inputs.megatron_args as megatron_args

    monkeypatch.setattr(megatron_args, "package_version", lambda name: version)
    args = dict(ARGS, world_size=2, optimizer="dist_muon", num_experts=2, mtp_num_layers=None)
    if refused:
        with pytest.raises(ValueError, match="expert biases"):
            spec_from_megatron_args(args)
        spec_from_megatron_args(dict(args, disable_bias_linear=True))  # no biases: taken
        spec_from_megatron_args(dict(args, no_use_layer_wise_param_layout=True))  # ping-pong
    else:
        spec_from_megatron_args(args)
