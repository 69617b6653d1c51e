"""Muon (``--optimizer muon``) and the layer-wise distributed Muon (``dist_muon``) in the
static estimator, against the installed megatron-core (CI: 0.16.1 and the newest).

Which tensors Muon updates is checked on real GPTModels (the layout test covers the MTP
chunk's embedding copy, tagged from 0.18); how ``dist_muon`` deals whole tensors to
data-parallel ranks is checked by running megatron-core's own
``LayerWiseDistributedOptimizer.shard_params`` on two gloo ranks (its size-sorted ping-pong
split; from 0.18 Megatron-LM passes a bucket layout instead unless
``--no-use-layer-wise-param-layout``, which the estimate does not model and says so). Muon's
step itself needs the ``emerging_optimizers`` package, which is not installable here: the two
parameter groups are carried by plain ``torch.optim.SGD`` instances (``shard_params`` reads
only their ``param_groups``), and the Newton-Schulz temporaries are derived from source
(stated in the report's ``approximated`` list).
"""

from __future__ import annotations

from typing import Any

import pytest

from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.muon import layer_wise_owned, muon_managed
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.inputs.megatron_args import spec_from_megatron_args

# h 64, vocab 160, 40 positions: no Muon tensor has the size of an Adam one (shard_params
# orders equal sizes by parameter group)
ARGS = dict(num_layers=3, hidden_size=64, num_attention_heads=4, padded_vocab_size=160,
            seq_length=40, max_position_embeddings=40, micro_batch_size=1,
            num_microbatches=2, transformer_impl="local", mtp_num_layers=1,
            untie_embeddings_and_output_weights=True, bf16=True)  # fmt: skip


def _shard_worker(rank: int, world: int, port: int) -> dict[str, Any]:
    """This rank's tensors under megatron-core's layer-wise sharding (data parallel 2)."""
    from unittest import mock

    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.demo.tiny_gpt import FUSIONS_OFF, TinyGPTConfig, destroy_process, init_process

    init_process(rank, world, port, TinyGPTConfig())
    try:
        config = TransformerConfig(
            num_layers=3, hidden_size=64, num_attention_heads=4, mtp_num_layers=1,
            params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, bf16=True,
            use_cpu_initialization=True, **FUSIONS_OFF,
        )  # fmt: skip
        layer = specs.get_gpt_layer_local_spec()
        with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):  # CPU build
            model = GPTModel(
                config=config, transformer_layer_spec=layer, vocab_size=160,
                max_sequence_length=40, share_embeddings_and_output_weights=False,
                mtp_block_spec=specs.get_gpt_mtp_block_spec(config, layer, False),
            )  # fmt: skip
        named = dict(model.named_parameters())
        # get_megatron_muon_optimizer's split, as muon.py writes it
        muon = [
            n
            for n, p in named.items()
            if p.dim() == 2 and not getattr(p, "is_embedding_or_output_parameter", False)
        ]
        adam = [n for n in named if n not in muon]  # fmt: skip
        carriers = [torch.optim.SGD([named[n] for n in group], lr=0.0) for group in (muon, adam)]
        # the optimizer without its __init__ (which would build the Muon step): what
        # shard_params reads of it are the process groups (0.16.1), or the dp_cp and expt_dp
        # groups __init__ caches (0.18+, where no full_param_layouts means the
        # ping-pong split: Megatron-LM's --no-use-layer-wise-param-layout; the default bucket
        # layout is megatron_versions.LAYER_WISE_PARAM_LAYOUT, not modelled)
        groups = ProcessGroupCollection.use_mpu_process_groups()
        holder = LayerWiseDistributedOptimizer.__new__(LayerWiseDistributedOptimizer)
        holder.pg_collection, holder.dp_cp, holder.expt_dp = groups, groups.dp_cp, groups.expt_dp
        holder.shard_params(carriers)
        by_id = {id(p): n for n, p in named.items()}
        own = [by_id[id(p)] for opt in carriers for g in opt.param_groups for p in g["params"]]
        return {"muon": muon, "own": sorted(own), "numel": {n: p.numel() for n, p in named.items()}}
    finally:
        destroy_process()


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


def _optimizer_bytes(**kw: Any) -> tuple[int, int, list[Any]]:
    spec = spec_from_megatron_args(dict(ARGS, **kw))
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
def test_what_megatron_refuses_for_muon_is_refused(kw, match):
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
    assert layer_wise == _optimizer_bytes(optimizer="dist_muon", world_size=4)[0]


def test_a_parsed_namespaces_layer_wise_flag_means_layer_wise_muon_on_any_release(monkeypatch):
    import memscope.inputs.megatron_args as megatron_args

    monkeypatch.setattr(megatron_args, "package_version", lambda name: "0.16.1")
    spec = spec_from_megatron_args(dict(ARGS, world_size=4, optimizer="muon",
                                        use_layer_wise_distributed_optimizer=True))  # fmt: skip
    assert spec.precision.optimizer == "dist_muon"
