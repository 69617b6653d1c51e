"""Test helper: run a real megatron-core ``MoELayer`` on CPU (gloo), 0.16.1 or 0.19.x.

CUDA-only calls are redirected here, and only here; none of them holds or shapes an
activation:

* ``torch.cuda.current_device`` is the CPU (the router and the alltoall dispatcher ask it
  where to put tensors);
* ``torch.cuda.Stream`` / ``current_stream`` / ``stream`` are inert (the alltoall
  dispatcher's device-to-host side stream and its event);
* ``token_dispatcher.maybe_move_tensor_to_cpu`` turns a CPU split-size tensor into fresh host
  memory as it would a CUDA one (the sizes ``all_to_all_single`` needs);
* ``moe_utils.te_general_gemm`` is ``None`` when unbound: megatron-core 0.16.1 without
  Transformer Engine never binds the name and the router's gating raises ``NameError``;
  ``None`` selects its own ``torch.mm`` branch (the one 0.15 takes without TE);
* MemScope's CPU shims (:func:`memscope.demo.megatron_cpu_shims.apply_cpu_shims`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any


class _Event:
    def synchronize(self) -> None:
        pass


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def record_event(self, *args: Any) -> _Event:
        return _Event()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream)

    __hash__ = object.__hash__


_STREAM = _Stream()


def install_moe_cpu_stand_ins() -> None:
    """Apply the redirections listed in the module docstring (idempotent)."""
    import numpy as np
    import torch
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    from memscope.demo.megatron_cpu_shims import apply_cpu_shims

    apply_cpu_shims()
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.cuda.Stream = _Stream  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *a, **k: _STREAM  # type: ignore[assignment]
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]

    def move_to_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if torch.is_tensor(tensor) and as_numpy:
            return np.array(tensor.tolist())
        return tensor

    token_dispatcher.maybe_move_tensor_to_cpu = move_to_cpu


def build_moe_layer(cfg: dict[str, Any]) -> Any:
    """A ``MoELayer`` of megatron-core's local spec for ``cfg`` (keys: h, f_e, E, k, ep,
    dispatcher, dtype, gated, router_dtype, aux_loss, z_loss, cf, pad)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.demo.tiny_gpt import FUSIONS_OFF

    dtype = getattr(torch, cfg["dtype"])
    kwargs: dict[str, Any] = dict(
        num_layers=1,
        hidden_size=cfg["h"],
        num_attention_heads=4,
        ffn_hidden_size=cfg["f_e"],
        moe_ffn_hidden_size=cfg["f_e"],
        num_moe_experts=cfg["E"],
        moe_router_topk=cfg["k"],
        expert_model_parallel_size=cfg["ep"],
        moe_token_dispatcher_type=cfg["dispatcher"],
        moe_router_dtype=cfg.get("router_dtype"),
        moe_router_load_balancing_type="aux_loss" if cfg.get("aux_loss") else "none",
        moe_aux_loss_coeff=1e-2 if cfg.get("aux_loss") else 0.0,
        moe_z_loss_coeff=1e-3 if cfg.get("z_loss") else None,
        moe_expert_capacity_factor=cfg.get("cf"),
        moe_pad_expert_input_to_capacity=cfg.get("pad", False),
        add_bias_linear=False,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=True,
        **FUSIONS_OFF,
    )
    if cfg.get("gated", True):
        kwargs.update(gated_linear_unit=True, activation_func=F.silu)
    spec = get_gpt_layer_local_spec(num_experts=cfg["E"])
    mlp = spec.submodules.mlp
    if isinstance(mlp, functools.partial):  # megatron-core 0.19 specs: a partial of MoELayer
        layer = mlp(config=TransformerConfig(**kwargs))
    else:  # 0.16: a ModuleSpec
        layer = build_module(mlp, config=TransformerConfig(**kwargs))
    layer.train()
    return layer
