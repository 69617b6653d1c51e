"""``pipeline_model_parallel_layout`` in the static estimator, against megatron-core 0.16.1's
own ``PipelineParallelLayerLayout`` (parsing, per-chunk layer counts and offsets, the
validation it asserts) and the parameters real GPTModel chunks build on every pipeline rank
(gloo, CPU) with the layout, MTP on its own stage and virtual pipelining included."""

from __future__ import annotations

from typing import Any

import pytest

from memscope.analysis.static.activations import chunk_activations
from memscope.analysis.static.config import chunk_layer_counts, chunk_layer_offset, chunk_roles
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.muon import muon_managed
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.analysis.static.pipeline_layout import format_layout, parse_layout
from memscope.inputs.megatron_args import spec_from_megatron_args

BASE = dict(hidden_size=64, num_attention_heads=4, padded_vocab_size=128, seq_length=32,
            max_position_embeddings=32, position_embedding_type="rope", micro_batch_size=1,
            num_microbatches=8, transformer_impl="local")  # fmt: skip
CHAR = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}

# (layout, pp, num_layers, mtp_num_layers)
LAYOUTS = [
    ("Et*3|(tt|)*29,m|L", 16, 61, 1),  # DeepSeek-V3's recipe: MTP on its own stage
    ("Ett|tt|tt|tL", 2, 7, None),  # vpp 2, loss chunk with a layer
    ("E|t*4|tt|t,L", 2, 7, None),  # an embedding-only chunk
    ("Ettt|ttmm|L", 3, 5, 2),  # no vpp, MTP standalone with two depths
    ("Et|tt|t|tmL", 2, 5, 1),  # vpp 2, MTP on the loss chunk
]


def _megatron_layout(text: str, pp: int) -> Any:
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    return PipelineParallelLayerLayout(text, pp)


@pytest.mark.parametrize("text", [t for t, *_ in LAYOUTS] + ["(Et|)*2,t*2L", "((tt|)*2)*2"])
def test_layout_strings_parse_like_megatron_core(text):
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    if "((" in text:  # nested repeats: megatron's regexes do not unroll them, we do
        assert parse_layout(text) == ("tt",) * 4 + ("",)
        return
    theirs = PipelineParallelLayerLayout.parse_str_to_list(text)
    assert parse_layout(text) == tuple("".join(CHAR[x.name] for x in row) for row in theirs)


@pytest.mark.parametrize("text", [t for t, *_ in LAYOUTS] + ["Etttt|(tttt|)*14tmL", "E|L"])
def test_a_written_layout_reads_back_the_same_in_megatron_core(text):
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    stages = parse_layout(text)
    written = format_layout(stages)  # what the planner prints as --pipeline-model-parallel-layout
    theirs = PipelineParallelLayerLayout.parse_str_to_list(written)
    assert tuple("".join(CHAR[x.name] for x in row) for row in theirs) == stages
    assert len(written) <= len(text.replace(",", ""))  # repeats are written as repeats


@pytest.fixture
def virtual_world():
    """megatron-core's layout queries read the virtual pipeline size from parallel_state."""
    from megatron.core import parallel_state

    def set_vpp(vpp: int | None) -> None:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp)

    yield set_vpp
    parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


@pytest.mark.parametrize("text, pp, layers, mtp", LAYOUTS)
def test_layer_split_and_offsets_match_megatron_core(virtual_world, text, pp, layers, mtp):
    from megatron.core.transformer.enums import LayerType

    theirs = _megatron_layout(text, pp)
    theirs.validate_layer_layout(num_layers=layers, mtp_num_layers=mtp)
    vpp = theirs.virtual_pipeline_model_parallel_size
    virtual_world(vpp if vpp > 1 else None)
    spec = spec_from_megatron_args(dict(BASE, num_layers=layers, mtp_num_layers=mtp,
                                        pipeline_model_parallel_size=pp,
                                        pipeline_model_parallel_layout=text))  # fmt: skip
    m, p = spec.model, spec.parallel
    assert (p.vpp or 1) == vpp
    for r in range(pp):
        counts = chunk_layer_counts(m, p, r)
        for c in range(vpp):
            kw = dict(vp_stage=c, pp_rank=r)
            assert counts[c] == theirs.get_num_layers_to_build(LayerType.decoder, **kw)
            assert chunk_layer_offset(m, p, r, c) == theirs.get_layer_offset(
                LayerType.decoder, **kw
            )
    # every decoder layer on exactly one rank, each MTP depth once
    names = [t.name for r in range(pp) for t in rank_params(spec, RankPosition(0, r))]
    decoder = {n.split("decoder.layers.")[1].split(".")[0] for n in names if "decoder.layers." in n}
    assert decoder == {str(i) for i in range(layers)}
    eh = [n for n in names if n.endswith("eh_proj.weight")]
    assert len(eh) == (mtp or 0)


@pytest.mark.parametrize(
    "text, pp, layers, mtp",
    [
        ("Ettt|tL", 2, 3, None),  # 4 decoder layers, num_layers 3
        ("tE|ttL", 2, 3, None),  # not starting with the embedding
        ("Ett|mt|L", 3, 3, 1),  # a decoder layer after the MTP layer
        ("Ett|m|t|L", 2, 3, 1),  # MTP on a rank's first of two chunks
        ("Ett|tL|t", 2, 4, None),  # 3 stages over pp 2
        ("Et|tL", 2, 2, 1),  # no m but mtp_num_layers 1
    ],
)
def test_invalid_layouts_are_refused_where_megatron_asserts(text, pp, layers, mtp):
    with pytest.raises((AssertionError, ValueError)):  # megatron-core refuses it
        _megatron_layout(text, pp).validate_layer_layout(num_layers=layers, mtp_num_layers=mtp)
    with pytest.raises(ValueError, match="pipeline_model_parallel_layout"):
        spec_from_megatron_args(dict(BASE, num_layers=layers, mtp_num_layers=mtp,
                                     pipeline_model_parallel_size=pp,
                                     pipeline_model_parallel_layout=text))  # fmt: skip


def test_layout_conflicting_with_vpp_or_other_split_is_refused():
    base = dict(BASE, num_layers=4, pipeline_model_parallel_size=2)
    with pytest.raises(ValueError, match="conflicts"):
        spec_from_megatron_args(dict(base, pipeline_model_parallel_layout="Et|t|t|tL",
                                     virtual_pipeline_model_parallel_size=3))  # fmt: skip
    with pytest.raises(ValueError, match="cannot be combined"):
        spec_from_megatron_args(dict(base, pipeline_model_parallel_layout="Ett|ttL",
                                     num_virtual_stages_per_pipeline_rank=2))  # fmt: skip


def test_moving_layers_off_the_last_stage_moves_its_memory():
    """Direction and size: the layout that gives the loss stage two layers fewer holds two
    layers' parameters fewer there (and one more stage's worth of layers on the first)."""
    even = spec_from_megatron_args(dict(BASE, num_layers=8, pipeline_model_parallel_size=2))
    shifted = spec_from_megatron_args(dict(BASE, num_layers=8, pipeline_model_parallel_size=2,
                                           pipeline_model_parallel_layout="Et*6|ttL"))  # fmt: skip
    layer = sum(t.numel for t in rank_params(even, RankPosition(0, 1))
                if t.name.startswith("decoder.layers.4."))  # fmt: skip
    last = [sum(t.numel for t in rank_params(s, RankPosition(0, 1))) for s in (even, shifted)]
    first = [sum(t.numel for t in rank_params(s, RankPosition(0, 0))) for s in (even, shifted)]
    assert last[0] - last[1] == 2 * layer
    assert first[1] - first[0] == 2 * layer
    peaks = [estimate_rank(s, RankPosition(0, 1)).peak_memory_bytes for s in (even, shifted)]
    assert peaks[1] < peaks[0]


def test_standalone_mtp_stage_keeps_the_mtp_layers_and_the_loss_stage_the_concatenation():
    """DeepSeek-V3's shape in small: MTP alone on the next-to-last rank's last chunk. That
    chunk keeps the MTP layers' activations; the loss chunk receives (1 + depth) hidden
    states and keeps the MTP losses."""
    args = dict(BASE, num_layers=6, mtp_num_layers=1, pipeline_model_parallel_size=3,
                pipeline_model_parallel_layout="Ett|tt|tt||m|L")  # fmt: skip
    spec = spec_from_megatron_args(args)
    mtp_rank = estimate_rank(spec, RankPosition(0, 1))  # chunk 1 of rank 1 holds 'm'
    loss_rank = estimate_rank(spec, RankPosition(0, 2))
    assert any(".mtp.layers.0.eh_proj" in t.name for t in mtp_rank.params)
    assert not any(".mtp." in t.name for t in loss_rank.params)
    assert any("embedding.word_embeddings" in t.name for t in mtp_rank.params)
    plain = spec_from_megatron_args(
        {**args, "mtp_num_layers": None, "pipeline_model_parallel_layout": "Ett|tt|tt|||L"}
    )
    loss_plain = estimate_rank(plain, RankPosition(0, 2))
    hidden = 32 * 1 * 64 * 4  # s b h, fp32
    loss_roles = chunk_roles(spec.model, spec.parallel, 2, 1)
    loss_chunk = chunk_activations(spec, 0, False, True, roles=loss_roles)[3]
    assert loss_chunk["chunk_input"] == 2 * hidden  # the main and the one depth's states
    assert "mtp_layers" not in loss_chunk and loss_chunk["mtp_cross_entropy"] > 0
    mtp_roles = chunk_roles(spec.model, spec.parallel, 1, 1)
    mtp_chunk = chunk_activations(spec, 0, False, False, roles=mtp_roles)[3]
    assert mtp_chunk["mtp_layers"] > 0 and "mtp_cross_entropy" not in mtp_chunk
    plain_roles = chunk_roles(plain.model, plain.parallel, 2, 1)
    plain_chunk = chunk_activations(plain, 0, False, True, roles=plain_roles)[3]
    # with MTP the final norm sits with the last decoder layer (rank 2's first chunk)
    assert "final_norm" in plain_chunk and "final_norm" not in loss_chunk
    saved = [e.activations.saved_per_chunk[1] for e in (loss_rank, loss_plain)]
    moved = hidden + loss_chunk["mtp_cross_entropy"] - plain_chunk["final_norm"]
    assert saved[0] - saved[1] == moved


# ---------------------------------------------------------------------------------------------
# Real GPTModel chunks on every pipeline rank (gloo)


def _layout_worker(rank: int, world: int, port: int, cases: list[dict[str, Any]]) -> list[Any]:
    """Per case: the parameters (name -> numel, layers numbered globally, ``chunkN.`` prefix
    with virtual pipelining) of every model chunk this pipeline rank builds."""
    import re
    from unittest import mock

    import torch
    from megatron.core import parallel_state
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from memscope.demo.tiny_gpt import FUSIONS_OFF, TinyGPTConfig, destroy_process, init_process

    init_process(rank, world, port, TinyGPTConfig())
    out = []
    try:
        for args in cases:
            parallel_state.destroy_model_parallel()
            config = TransformerConfig(
                num_layers=args["num_layers"], hidden_size=64, num_attention_heads=4,
                mtp_num_layers=args.get("mtp_num_layers"), pipeline_model_parallel_size=world,
                pipeline_model_parallel_layout=args["pipeline_model_parallel_layout"],
                num_moe_experts=args.get("num_experts"), moe_router_topk=2,
                moe_ffn_hidden_size=args.get("moe_ffn_hidden_size"),
                moe_layer_freq=args.get("moe_layer_freq", 1), add_bias_linear=False,
                moe_token_dispatcher_type="allgather", params_dtype=torch.float32,
                pipeline_dtype=torch.float32, use_cpu_initialization=True, **FUSIONS_OFF,
            )  # fmt: skip
            vpp = config.virtual_pipeline_model_parallel_size
            parallel_state.initialize_model_parallel(
                pipeline_model_parallel_size=world,
                virtual_pipeline_model_parallel_size=vpp,
                create_gloo_process_groups=False,
            )
            found: dict[str, tuple[int, bool]] = {}
            for chunk in range(vpp or 1):
                vp = chunk if vpp else None
                # CPU stand-ins while building, neither shapes a parameter: the current
                # device is the CPU, and the tied embedding copies are not synchronised
                # (their start values do not matter here; the all-reduce per chunk would
                # pair chunks of different ranks out of order)
                with (
                    mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")),
                    mock.patch.object(LanguageModule, "_is_in_embd_group", lambda self: False),
                ):
                    if config.num_moe_experts:  # gpt_builders: the decoder block spec
                        spec: Any = specs.get_gpt_decoder_block_spec(
                            config, use_transformer_engine=False, vp_stage=vp
                        )
                        has_layers = bool(spec.layer_specs)
                    else:
                        spec = specs.get_gpt_layer_local_spec()
                        has_layers = True
                    mtp_spec = None
                    if config.mtp_num_layers:  # gpt_builders: a layer spec when none here
                        mtp_from = spec if has_layers else specs.get_gpt_layer_local_spec(
                            config.num_moe_experts)  # fmt: skip
                        mtp_spec = specs.get_gpt_mtp_block_spec(
                            config, mtp_from, use_transformer_engine=False, vp_stage=vp
                        )
                    model = GPTModel(
                        config=config, transformer_layer_spec=spec, vocab_size=128,
                        max_sequence_length=32, position_embedding_type="rope",
                        pre_process=parallel_state.is_pipeline_first_stage(
                            ignore_virtual=False, vp_stage=vp),
                        post_process=parallel_state.is_pipeline_last_stage(
                            ignore_virtual=False, vp_stage=vp),
                        mtp_block_spec=mtp_spec, vp_stage=vp,
                    )  # fmt: skip
                offset = get_transformer_layer_offset(config, vp_stage=vp)
                tag = f"chunk{chunk}." if vpp else ""
                for name, param in model.named_parameters():
                    number = re.match(r"decoder\.layers\.(\d+)\.", name)
                    if number:  # Megatron numbers a chunk's layers from 0
                        rest = name[number.end() :]
                        name = f"decoder.layers.{int(number[1]) + offset}.{rest}"
                    # (numel, whether megatron-core's muon.py gives it to Muon: 2-D and not
                    # tagged is_embedding_or_output_parameter)
                    tagged = getattr(param, "is_embedding_or_output_parameter", False)
                    found[tag + name] = (param.numel(), param.dim() == 2 and not tagged)
            out.append((parallel_state.get_pipeline_model_parallel_rank(), found))
    finally:
        destroy_process()
    return out


LAYOUT_MODELS = {
    "vpp2-mtp-on-its-own-chunk": dict(num_layers=5, mtp_num_layers=1,
                                      pipeline_model_parallel_layout="Ett|t|tt|mL"),
    "mtp-standalone-moe-chunk-without-layers": dict(
        num_layers=3, mtp_num_layers=1, num_experts=4, moe_ffn_hidden_size=32,
        moe_layer_freq=[1, 1, 0], pipeline_model_parallel_layout="Et|tt|m|L"),
    "vpp2-embedding-alone-loss-with-layers": dict(num_layers=5,
                                                  pipeline_model_parallel_layout="E|ttt|t|tL"),
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.multiprocess
def test_every_rank_builds_the_parameters_the_layout_says():
    from memscope.demo.launcher import free_port, spawn

    cases = list(LAYOUT_MODELS.values())
    per_rank = spawn(2, _layout_worker, free_port(), cases)
    for i, name in enumerate(LAYOUT_MODELS):
        args = dict(BASE, pipeline_model_parallel_size=2, disable_bias_linear=True,
                    **cases[i])  # fmt: skip
        spec = spec_from_megatron_args(args)
        for results in per_rank:
            pp_rank, real = results[i]
            ours = {
                t.name: (t.numel, muon_managed(t))
                for t in rank_params(spec, RankPosition(0, pp_rank))
            }
            assert ours == real, (name, pp_rank)


def test_remedies_never_propose_more_stages_for_a_fixed_layout():
    """A layout lists its stages: another pipeline size would need a new layout."""
    from memscope.analysis.static.remedies import rank_remedies

    spec = spec_from_megatron_args(dict(BASE, num_layers=6, pipeline_model_parallel_size=2,
                                        world_size=12, global_batch_size=48,
                                        pipeline_model_parallel_layout="Ettt|tttL"))  # fmt: skip
    names = [r.name for r in rank_remedies(spec, RankPosition(0, 0))]
    assert names and not any("pipeline stages" in n for n in names)
    plain = spec_from_megatron_args(dict(BASE, num_layers=6, pipeline_model_parallel_size=2,
                                         world_size=12, global_batch_size=48))  # fmt: skip
    assert any("pipeline stages" in r.name for r in rank_remedies(plain, RankPosition(0, 0)))
