"""Multi-latent attention's activation terms (``memscope/analysis/static/mla.py``) against what a
real megatron-core 0.16.1 ``MLASelfAttention`` (local spec, one process, gloo) keeps after
``get_query_key_value_tensors`` on CPU, measured with the exact storage ledger: query/key/value,
the kept latents with and without ``qk_layernorm`` (LayerNorm and RMSNorm), with and without a
query latent (``q_lora_rank``), unfused RoPE's cos/sin tables; and what ``mla_up_proj``
recompute drops once the core attention has run. The MLA module is megatron-core's; its core
attention is never run here (the local ``DotProductAttention`` assumes one head width), and
``HAVE_TE`` is off in ``multi_latent_attention`` as on any machine without Transformer Engine.

megatron-core 0.19 refuses ``qk_layernorm`` without ``q_lora_rank`` on the local spec
(``mla_qk_norm_config.py``: the query norm would be the fused norm+linear only Transformer
Engine has); for that case the test asserts that the estimator refuses it too, as
``megatron_versions.MLA_QK_NORM_RESOLVER`` says, and on 0.16.1 that both build it.
"""

from __future__ import annotations

import gc
import os
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest

from memscope.analysis.static.mla import mla_saved, mla_up_proj_discarded
from memscope.demo.launcher import free_port, spawn
from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

S, B = 32, 2
BASE: dict[str, Any] = dict(h=64, heads=4, q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8,
                            qk_pos_emb_head_dim=4, v_head_dim=12)  # fmt: skip
CASES: dict[str, dict[str, Any]] = {
    "plain": dict(BASE),
    "no_query_latent": {**BASE, "q_lora_rank": None},
    "layernorm": {**BASE, "qk_layernorm": True},
    "rmsnorm": {**BASE, "qk_layernorm": True, "normalization": "RMSNorm"},
    "rmsnorm_no_query_latent": {
        **BASE,
        "qk_layernorm": True,
        "normalization": "RMSNorm",
        "q_lora_rank": None,
    },
}
for _name in list(CASES):
    CASES[f"{_name}_up_proj_recompute"] = {**CASES[_name], "recompute_up_proj": True}
# TP 2 without sequence parallelism: the down projections' sharded outputs all-gathered to the
# whole latent width. (Under SP megatron-core refuses torch's norms, and the plain case's CPU
# run holds one more [s, b, h] per call that neither a Python tensor nor autograd references:
# the all-gathered input's size, consistent with gloo's staging buffer; see mla.py.)
CASES["plain_tp2"] = {**BASE, "tp": 2}
CASES["plain_tp2_up_proj_recompute"] = {**BASE, "tp": 2, "recompute_up_proj": True}


def _config(cfg: dict[str, Any]) -> Any:
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    from memscope.demo.tiny_gpt import FUSIONS_OFF

    extra: dict[str, Any] = {}
    if cfg.get("recompute_up_proj"):
        extra.update(recompute_granularity="selective", recompute_modules=["mla_up_proj"])
    tp = cfg.get("tp", 1)
    return MLATransformerConfig(
        tensor_model_parallel_size=tp,
        sequence_parallel=cfg.get("sp", False),
        num_layers=1,
        hidden_size=cfg["h"],
        num_attention_heads=cfg["heads"],
        q_lora_rank=cfg["q_lora_rank"],
        kv_lora_rank=cfg["kv_lora_rank"],
        qk_head_dim=cfg["qk_head_dim"],
        qk_pos_emb_head_dim=cfg["qk_pos_emb_head_dim"],
        v_head_dim=cfg["v_head_dim"],
        qk_layernorm=cfg.get("qk_layernorm", False),
        normalization=cfg.get("normalization", "LayerNorm"),
        rope_type="rope",
        add_bias_linear=False,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        bf16=True,
        use_cpu_initialization=True,
        transformer_impl="local",  # as the spec built below (0.19 resolves the q/kv norms by it)
        **{**FUSIONS_OFF, **extra},
    )


Measured = dict[str, tuple[int, int] | str]
QUERY_NORM_NEEDS_TE = "qk_layernorm requires TransformerEngine"  # mla_qk_norm_config.py (0.19)


def _measure(rank: int, world: int, port: int, names: list[str]) -> Measured:
    """Per case: (bytes held after the qkv build, bytes the up-proj checkpoint's discard frees:
    it shrinks the outputs' storages in place, which the ledger does not see as a free), or
    megatron-core's message where it refuses to build the attention."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import build_module

    from memscope.capture.backends.storage import StorageLedgerBackend
    from memscope.demo.megatron_cpu_shims import apply_cpu_shims
    from memscope.demo.tiny_gpt import destroy_process, quiet_megatron_cpu_warnings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    quiet_megatron_cpu_warnings()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(minutes=5))  # fmt: skip
    out: Measured = {}
    try:
        apply_cpu_shims()
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        model_parallel_cuda_manual_seed(1234)
        stand_ins = (
            mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")),
            mock.patch.object(multi_latent_attention, "HAVE_TE", False),
        )
        for patch in stand_ins:  # the rotary tables ask for the device at build and forward
            patch.start()
        for name in names:
            cfg = CASES[name]
            config = _config(cfg)
            spec = specs.get_gpt_layer_local_spec(
                multi_latent_attention=True,
                qk_layernorm=config.qk_layernorm,
                normalization=config.normalization,
            ).submodules.self_attention
            # never run here: MLA's core attention would be built with k/v widths that only
            # Transformer Engine's attention accepts
            spec.submodules.core_attention = torch.nn.Identity
            if cfg["q_lora_rank"] is None:
                # no query latent, nothing for a query norm to normalise: 0.16.1 never builds
                # q_layernorm then; 0.19's QKNormConfigResolver refuses a non-identity one (the
                # local spec builder sets it from qk_layernorm alone)
                spec.submodules.q_layernorm = IdentityOp
            try:
                attn = build_module(spec, config=config, layer_number=1, cp_comm_type="p2p")
            except RuntimeError as exc:  # megatron-core refuses the configuration
                out[name] = str(exc)
                continue
            attn.train()
            rows = S // world if cfg.get("sp") else S
            x = torch.randn(rows, B, cfg["h"], dtype=torch.bfloat16, requires_grad=True)
            attn.get_query_key_value_tensors(x)  # warm the rotary tables' cache
            attn.qkv_up_checkpoint = None
            gc.collect()
            ledger = StorageLedgerBackend("cpu")
            ledger.start()
            try:
                base = ledger.sample().allocated
                query, key, value, _, _ = attn.get_query_key_value_tensors(x)
                gc.collect()
                held = ledger.sample().allocated - base
                freed = 0
                if cfg.get("recompute_up_proj"):  # what forward does after the core attention:
                    # the outputs' storages are resized to nothing (tensor_parallel/random.py)
                    outputs = (query, key, value)
                    before = sum(t.untyped_storage().nbytes() for t in outputs)
                    attn.qkv_up_checkpoint.discard_output_and_register_recompute(query.sum())
                    attn.qkv_up_checkpoint = None
                    freed = before - sum(t.untyped_storage().nbytes() for t in outputs)
                    del outputs
                del query, key, value
            finally:
                ledger.stop()
            out[name] = (held, freed)
        for patch in stand_ins:
            patch.stop()
        return out
    finally:
        destroy_process()


@pytest.fixture(scope="module")
def measured() -> Measured:
    """Per case, rank 0's (held, freed) or megatron-core's refusal; both TP ranks agree."""
    out: Measured = {}
    for world in (1, 2):
        names = [n for n, c in CASES.items() if c.get("tp", 1) == world]
        ranks = spawn(world, _measure, free_port(), names)
        assert all(r == ranks[0] for r in ranks)
        out.update(ranks[0])
    return out


def _spec(cfg: dict[str, Any]) -> Any:
    tp = cfg.get("tp", 1)
    args: dict[str, Any] = dict(
        tensor_model_parallel_size=tp, sequence_parallel=cfg.get("sp", False), world_size=tp,
        num_layers=1, hidden_size=cfg["h"], num_attention_heads=cfg["heads"],
        multi_latent_attention=True, q_lora_rank=cfg["q_lora_rank"],
        kv_lora_rank=cfg["kv_lora_rank"], qk_head_dim=cfg["qk_head_dim"],
        qk_pos_emb_head_dim=cfg["qk_pos_emb_head_dim"], v_head_dim=cfg["v_head_dim"],
        qk_layernorm=cfg.get("qk_layernorm", False),
        normalization=cfg.get("normalization", "LayerNorm"), no_rope_fusion=True,
        position_embedding_type="rope", padded_vocab_size=128, seq_length=S,
        micro_batch_size=B, global_batch_size=B, bf16=True, transformer_impl="local",
    )  # fmt: skip
    if cfg.get("recompute_up_proj"):
        args.update(recompute_granularity="selective", recompute_modules=["mla_up_proj"])
    return spec_from_megatron_args(args)


def _refused_by_both(measured: Measured, name: str) -> bool:
    """Whether megatron-core refused to build the case; if so, the estimate must refuse it too
    (and the release be one that refuses it: megatron_versions.MLA_QK_NORM_RESOLVER)."""
    result = measured[name]
    if not isinstance(result, str):
        return False
    assert QUERY_NORM_NEEDS_TE in result, (name, result)
    with pytest.raises(ValueError, match="cannot build the query norm"):
        _spec(CASES[name])
    return True


@pytest.mark.parametrize("name", [n for n in CASES if not n.endswith("_up_proj_recompute")])
def test_mla_keeps_what_the_estimate_itemises(measured, name):
    cfg = CASES[name]
    if _refused_by_both(measured, name):
        return
    held, _ = measured[name]
    tp = cfg.get("tp", 1)
    sp = tp if cfg.get("sp") else 1
    items = mla_saved(_spec(cfg), S, B, cfg["heads"] // tp, sp, 2)
    modelled = sum(v for k, v in items.items() if k != "attention_context")  # not built here
    assert held == modelled, (name, held, items)


@pytest.mark.parametrize("name", [n for n in CASES if n.endswith("_up_proj_recompute")])
def test_mla_up_proj_recompute_drops_what_the_estimate_says(measured, name):
    cfg = CASES[name]
    if _refused_by_both(measured, name):
        return
    spec = _spec(cfg)
    held, freed = measured[name]
    plain_held, _ = measured[name.removesuffix("_up_proj_recompute")]
    tp = cfg.get("tp", 1)
    sp = tp if cfg.get("sp") else 1
    dropped = mla_up_proj_discarded(spec, S, B, cfg["heads"] // tp, sp, 2)
    # after the discard, the layer holds what it held without recompute minus the saving
    assert plain_held - (held - freed) == dropped, (name, plain_held, held, freed, dropped)
    assert 0 < dropped < plain_held
