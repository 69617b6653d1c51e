"""What each selective recompute module really saves, measured on a real megatron-core 0.16.1
``TransformerLayer`` (local spec, bf16, one gloo process on CPU), against the estimator's
``activations.recompute_discarded``.

The measurement is what autograd keeps for backward after the layer's forward: every tensor
the layer's autograd nodes and checkpoints save (``torch.autograd.graph.saved_tensors_hooks``),
counted once per storage at its size when the forward returns, parameters left out. An
output-discarding checkpoint (``layernorm``: ``CheckpointWithoutOutput``) shrinks the storage
of what it discards to nothing, which this counts as freed; a plain checkpoint (``mlp``,
``shared_experts``) never saves what runs inside it. A module's saving is the layer's saved
bytes without the module minus with it; the estimate's is the module's entry of
``recompute_discarded``. Tensors the forward leaves in the layer's attributes stay as well and
are counted with them, once per storage: a checkpointed MoE layer (``moe``) still holds its
token dispatcher's routing state. Dense layers: ``layernorm``, ``mlp`` and both; a MoE layer
with shared experts (alltoall dispatcher): ``shared_experts``, ``layernorm`` and ``moe``.
``core_attn`` is measured on whole training runs by the CPU accuracy matrix (``selective*``
rows).

Test stand-ins, and only these: megatron-core 0.16.1's ``CheckpointWithoutOutput`` sets
``self.fp8 = fp8 is not None`` (True for its default ``fp8=False``) and then calls Transformer
Engine's ``FP8GlobalStateManager`` / ``activation_recompute_forward`` / ``fp8_autocast``,
which exist only where TE is installed; here they answer as TE does with FP8 off (not enabled,
no recipe, a no-op context). The MoE layer runs under ``tests/harness/moe_cpu.py``'s CUDA
redirections.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import types
from datetime import timedelta
from typing import Any

import pytest

from memscope.analysis.static.activations import dims, layer_saved, recompute_discarded
from memscope.demo.launcher import free_port, spawn
from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

S, B, H = 32, 2, 64
MOE: dict[str, Any] = dict(
    num_moe_experts=4, moe_ffn_hidden_size=48, moe_router_topk=2,
    moe_shared_expert_intermediate_size=96, moe_token_dispatcher_type="alltoall",
)  # fmt: skip
# (layer kind, recompute modules)
CASES: list[tuple[str, tuple[str, ...]]] = [
    ("dense", ()),
    ("dense", ("layernorm",)),
    ("dense", ("mlp",)),
    ("dense", ("layernorm", "mlp")),
    ("moe", ()),
    ("moe", ("shared_experts",)),
    ("moe", ("layernorm",)),
    ("moe", ("moe",)),
]


def _te_with_fp8_off() -> None:
    """The Transformer Engine names ``CheckpointWithoutOutput`` calls, as TE answers them
    with FP8 off (see the module docstring)."""
    from megatron.core.tensor_parallel import random as tp_random

    if tp_random.HAVE_TE:  # the real ones are there
        return
    tp_random.FP8GlobalStateManager = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_fp8_enabled=lambda: False, get_fp8_recipe=lambda: None
    )
    tp_random.activation_recompute_forward = (  # type: ignore[attr-defined]
        lambda **kw: contextlib.nullcontext()
    )
    tp_random.fp8_autocast = lambda **kw: contextlib.nullcontext()  # type: ignore[attr-defined]


def _held_attributes(layer: Any) -> dict[tuple[str, str], Any]:
    """The tensors the layer's modules, and the megatron-core objects they hold that are no
    modules (the MoE layer's token dispatcher), keep as plain attributes."""
    import torch

    owners: list[tuple[str, Any]] = []
    for name, module in layer.named_modules():
        owners.append((name, module))
        owners += [
            (f"{name}.{attr}", value)
            for attr, value in vars(module).items()
            if type(value).__module__.startswith("megatron.")
            and not isinstance(value, torch.nn.Module)
            and hasattr(value, "__dict__")
        ]
    return {
        (owner, attr): value
        for owner, obj in owners
        for attr, value in vars(obj).items()
        if isinstance(value, torch.Tensor)
    }


def _saved_bytes(layer: Any, x: Any, mask: Any) -> int:
    """Bytes of the distinct non-parameter storages that stay after ``layer``'s forward: what
    autograd keeps for backward and the tensors the forward left in attributes (a checkpointed
    MoE layer's dispatcher keeps its routing state so: ``moe`` recompute cannot drop it)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    before = _held_attributes(layer)  # set at construction, not by the forward
    kept: list[Any] = []

    def pack(t: Any) -> Any:
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=mask)
    kept += [t for key, t in _held_attributes(layer).items() if before.get(key) is not t]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in kept}
    return sum(s.nbytes() for ptr, s in storages.items() if ptr not in params)


def _measure(rank: int, world: int, port: int) -> dict[tuple[str, tuple[str, ...]], int]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from harness.moe_cpu import install_moe_cpu_stand_ins
    from megatron.core import parallel_state
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.demo.tiny_gpt import FUSIONS_OFF, destroy_process, quiet_megatron_cpu_warnings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    quiet_megatron_cpu_warnings()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(minutes=5))  # fmt: skip
    try:
        install_moe_cpu_stand_ins()
        _te_with_fp8_off()
        parallel_state.initialize_model_parallel()
        model_parallel_cuda_manual_seed(1234)
        out = {}
        for kind, modules in CASES:
            extra: dict[str, Any] = dict(MOE) if kind == "moe" else {}
            if modules:
                extra.update(recompute_granularity="selective", recompute_modules=list(modules))
            config = TransformerConfig(
                num_layers=1, hidden_size=H, num_attention_heads=4, gated_linear_unit=True,
                activation_func=F.silu, add_bias_linear=False, params_dtype=torch.bfloat16,
                bf16=True, use_cpu_initialization=True, **FUSIONS_OFF, **extra,
            )  # fmt: skip
            spec = specs.get_gpt_layer_local_spec(
                num_experts=MOE["num_moe_experts"] if kind == "moe" else None
            )
            layer = build_module(spec, config=config, layer_number=1)
            layer.train()
            torch.manual_seed(0)
            x = torch.randn(S, B, H, dtype=torch.bfloat16, requires_grad=True)
            mask = torch.ones(1, 1, S, S, dtype=torch.bool).triu(1)
            gc.collect()
            out[(kind, modules)] = _saved_bytes(layer, x, mask)
        return out
    finally:
        destroy_process()


@pytest.fixture(scope="module")
def measured() -> dict[tuple[str, tuple[str, ...]], int]:
    return spawn(1, _measure, free_port())[0]


def _estimate(kind: str, modules: tuple[str, ...]) -> tuple[int, dict[str, int]]:
    """The layer's saved bytes before recompute and what each module drops (the same layer:
    megatron-core's TransformerConfig defaults, dropout 0.1, fp32 attention softmax)."""
    args: dict[str, Any] = dict(
        num_layers=1, hidden_size=H, num_attention_heads=4, swiglu=True, bf16=True,
        seq_length=S, micro_batch_size=B, global_batch_size=B, padded_vocab_size=128,
        world_size=1, transformer_impl="local", disable_bias_linear=True,
        hidden_dropout=0.1, attention_dropout=0.1, attention_softmax_in_fp32=True,
        bias_swiglu_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False,
    )  # fmt: skip
    if kind == "moe":
        args.update(num_experts=MOE["num_moe_experts"], moe_ffn_hidden_size=48,
                    moe_router_topk=2, moe_shared_expert_intermediate_size=96,
                    moe_token_dispatcher_type="alltoall")  # fmt: skip
    if modules:
        args.update(recompute_granularity="selective", recompute_modules=list(modules))
    spec = dataclasses.replace(spec_from_megatron_args(args), device="cpu")
    x = dims(spec)
    saved = layer_saved(spec, x)
    return sum(saved.values()), recompute_discarded(spec, x, saved)


@pytest.mark.parametrize(
    "kind, modules", [c for c in CASES if c[1]], ids=[f"{k}-{'+'.join(m)}" for k, m in CASES if m]
)
def test_each_recompute_modules_estimated_saving_is_what_the_real_layer_frees(
    measured, kind, modules
):
    true_saving = measured[(kind, ())] - measured[(kind, modules)]
    before, discarded = _estimate(kind, modules)
    assert set(discarded) == set(modules)
    assert true_saving > 0
    assert sum(discarded.values()) == true_saving, (kind, modules, discarded, true_saving)
    assert before == _estimate(kind, ())[0]  # recompute changes no other term of the layer
