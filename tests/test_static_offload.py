"""Fine-grained activation offloading in the static estimator.

What each offloaded module's group holds is what autograd saves during that module's forward
(megatron-core 0.16.1 ``FineGrainedActivationOffloadingInterface`` installs
``saved_tensors_hooks`` around it): measured here on a real GPTModel layer on CPU with the same
hooks around the same modules, for the modules whose group is one ``[s, b, h]`` input. The
offload manager itself needs CUDA streams and pinned memory and does not run here; the
``core_attn`` group is taken as the layer model's attention items (stated in the report's
``approximated`` list).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest

from memscope.analysis.static.activations import dims, layer_saved
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.offload import fine_grained_moved
from memscope.analysis.static.params import RankPosition
from memscope.inputs.megatron_args import spec_from_megatron_args

S, B, H, A = 128, 2, 64, 4
ARGS = dict(num_layers=1, hidden_size=H, num_attention_heads=A, padded_vocab_size=256,
            seq_length=S, micro_batch_size=B, bf16=True, transformer_impl="local",
            position_embedding_type="rope", num_microbatches=1, world_size=1)  # fmt: skip
SIMPLE = ("attn_norm", "qkv_linear", "attn_proj", "mlp_norm")


@contextlib.contextmanager
def _one_layer_gpt(**config: Any) -> Iterator[tuple[Any, Callable[[], Any]]]:
    """A one-layer local-spec megatron-core GPTModel on CPU (gloo, bf16, fusions off; ``config``
    overrides TransformerConfig fields) and a function running one forward of it."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.demo.launcher import free_port
    from memscope.demo.tiny_gpt import FUSIONS_OFF, TinyGPTConfig, destroy_process, init_process

    init_process(0, 1, free_port(), TinyGPTConfig())
    try:
        cfg = TransformerConfig(
            num_layers=1, hidden_size=H, num_attention_heads=A, bf16=True,
            params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
            use_cpu_initialization=True, **{**FUSIONS_OFF, **config},
        )  # fmt: skip
        with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):  # CPU build
            model = GPTModel(
                config=cfg, transformer_layer_spec=specs.get_gpt_layer_local_spec(),
                vocab_size=256, max_sequence_length=S, position_embedding_type="rope",
            )  # fmt: skip

        def forward() -> Any:
            tokens = torch.randint(0, 256, (B, S))
            positions = torch.arange(S).expand(B, S)
            mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1).view(1, 1, S, S)
            with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):
                return model(tokens, positions, mask, labels=tokens)

        yield model, forward
    finally:
        destroy_process()


def _saved_per_module() -> dict[str, int]:
    """Bytes of non-parameter tensors autograd saves inside each module's forward."""
    import torch

    with _one_layer_gpt() as (model, forward):
        layer = model.decoder.layers[0]
        modules = {
            "attn_norm": layer.input_layernorm,
            "qkv_linear": layer.self_attention.linear_qkv,
            "attn_proj": layer.self_attention.linear_proj,
            "mlp_norm": layer.pre_mlp_layernorm,
        }
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved: dict[str, dict[int, int]] = {name: {} for name in modules}
        open_hooks: dict[str, Any] = {}
        for name, module in modules.items():

            def pre(_m: Any, _a: Any, name: str = name) -> None:
                def pack(t: Any) -> Any:
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in params:  # parameters are marked not offloadable
                        saved[name][ptr] = t.numel() * t.element_size()
                    return t

                hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
                hooks.__enter__()
                open_hooks[name] = hooks

            def post(_m: Any, _a: Any, _o: Any, name: str = name) -> None:
                open_hooks.pop(name).__exit__(None, None, None)

            module.register_forward_pre_hook(pre)
            module.register_forward_hook(post)
        forward()
        # a norm also saves its [s*b] fp32 statistics: below any offload threshold
        return {n: sum(b for b in v.values() if b >= S * B * H) for n, v in saved.items()}


@pytest.mark.integration
def test_offloaded_group_bytes_match_what_the_real_modules_save():
    real = _saved_per_module()
    base = spec_from_megatron_args(dict(ARGS, fine_grained_activation_offloading=True,
                                        offload_modules=["core_attn"],
                                        min_offloaded_tensor_size=1))  # fmt: skip
    items = layer_saved(base, dims(base))
    for module in SIMPLE:  # one module at a time (attn_proj alone is refused by megatron-core)
        spec = dataclasses.replace(base, offload_modules=(module,))
        assert fine_grained_moved(spec, items, 2) == real[module] > 0, module


def _big_spec(**kw: Any) -> Any:
    big = dict(ARGS, num_layers=4, hidden_size=1024, num_attention_heads=8, seq_length=2048,
               micro_batch_size=1, padded_vocab_size=1024, use_flash_attn=True,
               transformer_impl="transformer_engine")  # fmt: skip
    return spec_from_megatron_args({**big, **kw})


def _estimate(**kw: Any) -> Any:
    return estimate_rank(_big_spec(**kw), RankPosition(0, 0))


def test_offloading_moves_every_layer_but_the_last_and_the_threshold_keeps_small_tensors():
    plain = _estimate()
    off = _estimate(fine_grained_activation_offloading=True,
                    offload_modules="core_attn,attn_proj")  # fmt: skip
    hidden = 2048 * 1024 * 2  # [s, b, h] bf16: 2M elements, above the 1M threshold
    per_layer = 3 * hidden + hidden  # q, k, v (core_attn) and linear_proj's input
    assert off.activations.detail["offloaded_to_host"] == 3 * per_layer  # 4 layers, last kept
    saved = plain.activations.chunk_saved_bytes - off.activations.chunk_saved_bytes
    assert saved == 3 * per_layer
    assert off.peak_memory_bytes < plain.peak_memory_bytes
    above = _estimate(fine_grained_activation_offloading=True, offload_modules=["core_attn"],
                      min_offloaded_tensor_size=4 * 1024 * 1024)  # fmt: skip
    assert above.activations.chunk_saved_bytes == plain.activations.chunk_saved_bytes


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(offload_modules=["attn_proj"]), "attn_proj needs core_attn"),
        (dict(offload_modules=["everything"]), "unknown: everything"),
        (dict(offload_modules=[]), "offload_modules"),
        (dict(offload_modules=["core_attn"], cpu_offloading=True), "cpu_offloading"),
    ],
)
def test_what_megatron_core_refuses_for_offloading_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        spec_from_megatron_args(dict(ARGS, fine_grained_activation_offloading=True, **kw))


def test_report_footer_lists_offloading_as_modelled_with_the_expert_groups():
    from memscope.analysis.static.coverage import config_coverage

    args = dict(ARGS, fine_grained_activation_offloading=True,
                offload_modules=["core_attn", "expert_fc1"])  # fmt: skip
    result = config_coverage(args, spec_from_megatron_args(args), None)
    assert result.not_modelled == ()
    assert any("fine-grained activation offloading (core_attn, expert_fc1" in m
               for m in result.modelled)  # fmt: skip
    assert not any("stay counted on the GPU" in a for a in result.approximated)


MOE = dict(num_experts=2, moe_router_topk=2, moe_ffn_hidden_size=512, moe_grouped_gemm=True,
           swiglu=True, moe_token_dispatcher_type="alltoall")  # fmt: skip


def test_the_expert_groups_move_fc1s_input_and_the_activations_input():
    """megatron-core 0.20 experts.py: ``expert_fc1`` saves the ``[A, h]`` permuted tokens,
    ``moe_act`` under its recompute the ``2f``-wide fc1 output (the checkpoint's input)."""
    from memscope.analysis.static.moe import expert_offload_bytes, routed_rows

    kw = dict(MOE, recompute_granularity="selective", recompute_modules=["moe_act"],
              fine_grained_activation_offloading=True)  # fmt: skip
    attention = _estimate(**kw, offload_modules=["core_attn"])
    experts = _estimate(**kw, offload_modules=["core_attn", "expert_fc1", "moe_act"])
    spec = _big_spec(**kw, offload_modules=["core_attn", "expert_fc1", "moe_act"])
    n = routed_rows(spec, 2048)
    per_layer = n * 1024 * 2 + 2 * n * 512 * 2  # [A, h] and [A, 2f], bf16
    assert expert_offload_bytes(spec, 2048, 1, 1, 2) == per_layer
    moved = experts.activations.detail["offloaded_to_host"]
    assert moved - attention.activations.detail["offloaded_to_host"] == 3 * per_layer
    high = dataclasses.replace(spec, min_offloaded_tensor_size=n * 2 * 512 + 1)
    assert expert_offload_bytes(high, 2048, 1, 1, 2) == 0  # both below the threshold


MLA = dict(multi_latent_attention=True, q_lora_rank=256, kv_lora_rank=128, qk_head_dim=128,
           qk_pos_emb_head_dim=64, v_head_dim=128, normalization="RMSNorm")  # fmt: skip


def test_what_a_recompute_drops_is_not_offloaded_a_second_time():
    """MLA's ``mla_up_proj`` recompute discards the up-projected query/key/value that the
    ``core_attn`` group would save: they leave the GPU once."""
    kw = dict(MLA, fine_grained_activation_offloading=True, offload_modules=["core_attn"],
              recompute_granularity="selective")  # fmt: skip
    plain = _estimate(**kw, recompute_modules=["core_attn"])
    both = _estimate(**kw, recompute_modules=["core_attn", "mla_up_proj"])
    qkv = both.activations.per_layer["attention_qkv"]
    assert qkv > 0
    moved_plain = plain.activations.detail["offloaded_to_host"]
    assert moved_plain - both.activations.detail["offloaded_to_host"] == 3 * qkv


def test_a_chunk_waiting_for_its_backward_has_every_layer_on_the_host():
    # megatron-core 0.16.1 fine_grained_activation_offload.py: should_bulk_offload keeps the
    # last layer's groups only of the chunk whose backward is next (post_warmup_callback's one
    # group per module name is in the first chunk to run backward): a microbatch waiting in the
    # 1F1B schedule has its last layer on the host too
    kw = dict(num_layers=8, pipeline_model_parallel_size=2, num_microbatches=4, world_size=2)
    plain = _estimate(**kw)
    off = _estimate(fine_grained_activation_offloading=True, offload_modules="core_attn,attn_proj",
                    **kw)  # fmt: skip
    per_layer = 4 * 2048 * 1024 * 2  # q, k, v and linear_proj's input, [s, b, h] bf16 each
    act = off.activations
    assert act.in_flight == 2  # the first of two stages, 1F1B
    assert act.detail["offloaded_to_host"] == 3 * per_layer  # at its backward: last layer kept
    assert act.saved_per_chunk == (act.chunk_saved_bytes - per_layer,)  # waiting: all 4 moved
    assert plain.activations.saved_per_chunk[0] - act.saved_per_chunk[0] == 4 * per_layer
    # the peak (the last layer's backward): the waiting microbatch's 4 layers and the running
    # one's first 3 are on the host
    assert off.activations.peak_moment == plain.activations.peak_moment == "layer 3 mlp_backward"
    assert plain.peak_memory_bytes - off.peak_memory_bytes == 7 * per_layer


def test_a_chunk_without_decoder_layers_offloads_nothing():
    # a pipeline layout may give a chunk only the MTP layer and the loss ("mL"): no layer of
    # its own to offload, so nothing on the host (not minus one layer)
    from memscope.analysis.static.activations import chunk_activations

    spec = spec_from_megatron_args(dict(ARGS, fine_grained_activation_offloading=True,
                                        offload_modules=["core_attn"],
                                        min_offloaded_tensor_size=1))  # fmt: skip
    _, _, _, detail = chunk_activations(spec, 0, False, True)
    assert "offloaded_to_host" not in detail and detail["layers"] == 0
    _, _, _, two = chunk_activations(spec, 2, False, True)
    assert two["offloaded_to_host"] == two["fine_grained_last_layer"] > 0  # one layer of two


def _core_attention_saved_twice(attention_dropout: float, softmax_in_fp32: bool) -> int:
    """Bytes megatron-core's offload manager would reload twice for one layer's core_attn
    group: run the real local-spec core attention (CPU, torch softmax) under a pack hook that
    records every save as ``ChunkOffloadHandler.tensor_push`` does (one entry per save; the
    manager's offload/reload copy each entry, fine_grained_activation_offload.py), and sum the
    entries that repeat an earlier one (same tensor: same data pointer and size)."""
    import torch

    config = dict(attention_dropout=attention_dropout, attention_softmax_in_fp32=softmax_in_fp32)
    with _one_layer_gpt(**config) as (model, forward):
        core = model.decoder.layers[0].self_attention.core_attention
        entries: list[tuple[int, int, int]] = []

        def pack(t: Any) -> Any:
            entries.append((t.data_ptr(), t.numel(), t.numel() * t.element_size()))
            return t

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        core.register_forward_pre_hook(lambda *_: hooks.__enter__())
        core.register_forward_hook(lambda *_: hooks.__exit__(None, None, None))
        forward()
    seen: set[tuple[int, int]] = set()
    twice = 0
    for ptr, numel, size in entries:
        if (ptr, numel) in seen:
            twice += size
        seen.add((ptr, numel))
    return twice


@pytest.mark.integration
@pytest.mark.parametrize("dropout, fp32", [(0.0, False), (0.0, True), (0.1, False)])
def test_a_reloaded_core_attention_holds_the_softmax_output_twice(dropout, fp32):
    # without dropout and without an fp32 upcast the softmax output is saved by the softmax
    # and by the context bmm: two offload entries, two GPU copies after the reload
    real = _core_attention_saved_twice(dropout, fp32)
    spec = spec_from_megatron_args(dict(
        ARGS, attention_dropout=dropout, attention_softmax_in_fp32=fp32,
        masked_softmax_fusion=False, fine_grained_activation_offloading=True,
        offload_modules=["core_attn"], min_offloaded_tensor_size=1,
    ))  # fmt: skip
    x = dims(spec)
    from memscope.analysis.static.activations import softmax_output_saved_twice
    from memscope.analysis.static.offload import reloaded_duplicate

    assert reloaded_duplicate(spec, softmax_output_saved_twice(spec, x), x.e) == real
    assert real == (x.scores if (dropout, fp32) == (0.0, False) else 0)


def test_an_offloaded_layer_backward_holds_one_more_score_tensor_than_a_kept_one():
    # four layers, unfused attention without dropout (local spec), only the [b, a, s, s]
    # softmax output above the threshold: the first three layers' core_attn groups come back
    # from the host with that tensor twice; the last layer's stayed on the GPU (one copy)
    kw = dict(num_layers=4, use_flash_attn=False, transformer_impl="local", hidden_dropout=0.0,
              attention_dropout=0.0, fine_grained_activation_offloading=True,
              offload_modules=["core_attn"],
              min_offloaded_tensor_size=2 * 1024 * 1024 + 1)  # fmt: skip
    scores = 8 * 2048 * 2048 * 2  # [b, a, s, s] bf16, 32M elements; q, k, v are 2M each
    off = _estimate(**kw)
    with mock.patch("memscope.analysis.static.activations.reloaded_duplicate", lambda *a: 0):
        single = _estimate(**kw)
    assert off.activations.detail["offloaded_to_host"] == 3 * scores  # layers 0-2
    assert single.activations.peak_moment == "layer 3 attention_backward"  # kept, one copy
    assert off.activations.peak_moment == "layer 2 attention_backward"  # reloaded, two
    # the peak moves from the kept last layer to layer 2, whose moment without the second
    # copy sits a few [s, b, h]-sized tensors below it: the rise is one score tensor less those
    rise = off.peak_memory_bytes - single.peak_memory_bytes
    assert scores - 2048 * 1024 * 2 < rise <= scores
    # above the threshold only: a score tensor that stays on the GPU is one copy
    kept = _estimate(**{**kw, "min_offloaded_tensor_size": scores})
    with mock.patch("memscope.analysis.static.activations.reloaded_duplicate", lambda *a: 0):
        assert _estimate(**{**kw, "min_offloaded_tensor_size": scores}).peak_memory_bytes == (
            kept.peak_memory_bytes
        )


def test_the_replay_lists_the_forwards_run_beside_a_pre_reloaded_layer():
    """megatron-core 0.20 ``bulk_reload``: backward k - 1's first layer pre-reloads backward
    k's last layer, and the plain schedule runs forward k + warmup before backward k."""
    from memscope.analysis.static.activations import _prereload_forward_steps

    # the last of two stages, one chunk: no warm-up forward, so backward k's microbatch has
    # not finished its forward when backward k - 1 runs: nothing is pre-reloaded
    assert _prereload_forward_steps(2, 1, 1, 4, 2) == ()
    # the first stage warms up one forward: steady forwards 2 and 3 run beside backwards 1, 2
    steps = _prereload_forward_steps(2, 0, 1, 4, 2)
    assert steps == ((0, (1,), 0),)  # forward chunk, alive before it, backward chunk
    # interleaved (2 chunks, microbatch groups of 2): every step names real chunks
    inter = _prereload_forward_steps(2, 1, 2, 4, 2)
    assert inter and all(0 <= f < 2 and 0 <= b < 2 and sum(a) >= 1 for f, a, b in inter)


def test_a_forward_beside_a_pre_reloaded_layer_can_be_the_peak_and_the_overlap_has_none():
    """Unfused attention (two score tensors at the forward's attention) under interleaved
    1F1B: the forward beside backward k's pre-reloaded last layer (its groups and the second
    softmax copy) is priced; the combined 1F1B schedule pairs that forward with a backward."""
    from memscope.analysis.static.activations import prereload_forward_steps

    kw = dict(num_layers=8, pipeline_model_parallel_size=2,
              virtual_pipeline_model_parallel_size=2, num_microbatches=4, world_size=2,
              use_flash_attn=False, attention_backend="unfused", attention_dropout=0.0,
              fine_grained_activation_offloading=True,
              offload_modules="core_attn,attn_proj")  # fmt: skip
    off = _estimate(**kw)
    act = off.activations
    assert act.peak_moment.endswith("forward beside a pre-reloaded layer")
    scores = 2048 * 2048 * 8 * 2  # [b, a, s, s] bf16
    assert act.detail["forward_layer"] >= 2 * scores
    assert act.detail["prereloaded_layer"] >= scores  # the reloaded second softmax copy
    assert (
        act.backward_working_bytes == act.detail["prereloaded_layer"] + act.detail["forward_layer"]
    )
    spec = _big_spec(**kw)
    overlapped = dataclasses.replace(
        spec, parallel=dataclasses.replace(spec.parallel, moe_a2a_overlap=True)
    )
    assert prereload_forward_steps(overlapped, 1) == ()
