"""What an unfused gated MLP keeps across megatron-core releases (megatron_versions.py:
SWIGLU_FUSION, GLU_LINEAR_COPY): the two ``glu`` bodies measured on CPU, the estimate's count
for each release, and analyze-log dating a published pre-0.5 run's arguments block to them."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from memscope.analysis.static.megatron_versions import dense_mlp_tensors, release_range
from memscope.cli.analyze_log_cmd import analyze_logs
from memscope.inputs.megatron_args import spec_from_megatron_args

LOGS = pathlib.Path(__file__).parent / "data" / "logs"
S, B, F_WIDE = 8, 2, 16  # [s, b, f]: the fc1 output is [s, b, 2f]


def glu_up_to_0_14(x: torch.Tensor) -> torch.Tensor:
    """megatron-core 0.14's ``MLP.forward`` ``glu`` (transformer/mlp.py, before 2e29a5e1e3)."""
    x = torch.chunk(x, 2, dim=-1)
    return F.silu(x[0]) * x[1]


def glu_from_0_15(x: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
    """megatron-core 0.15's ``glu`` (2e29a5e1e3; ``activation_func_clamp_value`` None)."""
    x_glu, x_linear = torch.chunk(x, 2, dim=-1)
    return F.silu(x_glu) * (x_linear + offset)


def _ffn_tensors_kept(glu: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """``[s, b, f]`` tensors autograd keeps for the fc1 output -> glu -> fc2 chain: the
    distinct storages saved (fc1's output, what glu makes, fc2's input), over one
    ``[s, b, f]``'s bytes; fc2's weight and fc1's input are left out."""
    fc1_out = torch.randn(S, B, 2 * F_WIDE, requires_grad=True)
    weight = torch.randn(4, F_WIDE, requires_grad=True)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() != weight.untyped_storage().data_ptr():
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = F.linear(glu(fc1_out), weight)  # fc2 keeps its input, the product
    out.sum().backward()
    return sum(storages.values()) / (S * B * F_WIDE * fc1_out.element_size())


def _spec(version: str | None, **extra: Any) -> Any:
    args: dict[str, Any] = dict(
        num_layers=2, hidden_size=64, num_attention_heads=4, padded_vocab_size=128,
        seq_length=32, micro_batch_size=2, global_batch_size=4, bf16=True, world_size=1,
        swiglu=True, bias_swiglu_fusion=False, transformer_impl="local",
    )  # fmt: skip
    spec = spec_from_megatron_args({**args, **extra})
    return dataclasses.replace(
        spec, model=dataclasses.replace(spec.model, megatron_core_version=version)
    )


def test_the_linear_half_copy_is_one_ffn_tensor_more_from_0_15():
    kept_old, kept_new = _ffn_tensors_kept(glu_up_to_0_14), _ffn_tensors_kept(glu_from_0_15)
    assert (kept_old, kept_new) == (4.0, 5.0)
    assert dense_mlp_tensors(_spec("0.14").model) == kept_old
    assert (
        dense_mlp_tensors(_spec("0.15.0rc5").model)
        == dense_mlp_tensors(_spec(None).model)
        == kept_new
    )


def test_swiglu_is_fused_only_from_0_5():
    assert dense_mlp_tensors(_spec(None, bias_swiglu_fusion=True).model) == 3
    assert dense_mlp_tensors(_spec("0.5", bias_swiglu_fusion=True).model) == 3
    # before 0.5 Megatron-LM set bias_gelu_fusion False under --swiglu: never fused
    assert dense_mlp_tensors(_spec("0.4", bias_swiglu_fusion=True).model) == 4


def test_an_arguments_block_is_dated_by_the_oldest_argument_it_lacks():
    every = {"bias_swiglu_fusion", "cross_entropy_loss_fusion", "glu_linear_offset"}

    def dated(names: set[str]) -> tuple[str, str] | None:
        found = release_range(names)
        return None if found is None else (found.missing, found.newest)

    assert dated(every) is None
    assert dated(every - {"glu_linear_offset"}) == ("glu_linear_offset", "0.14")
    assert dated({"bias_swiglu_fusion"}) == ("cross_entropy_loss_fusion", "0.7")
    assert dated({"fp16"}) == ("bias_swiglu_fusion", "0.4")


def test_a_published_pre_0_5_swiglu_run_out_of_memory_is_within_3_percent():
    """jindajia's GPT 774M fp16 run (legacy model, --swiglu, mid-2023; NVIDIA/Megatron-LM#525)
    ran out of memory in its first cross entropy. Its block has no bias_swiglu_fusion: SwiGLU
    unfused, four ffn-wide tensors per layer. Allocated + request is then within 3% of the
    estimate for that moment (it was 5.6% below with the fused count)."""
    run = analyze_logs([str(LOGS / "gpt2_774m_fp16_oom_v100.log")])["runs"][0]
    assert any("has no bias_swiglu_fusion" in str(n) for n in run["notes"])
    (oom,) = run["ooms"]
    measured = oom["sizes"]["allocated"] + oom["sizes"]["requested"]
    error = (oom["estimate"]["peak_bytes"] - measured) / measured
    assert -0.03 <= error <= 0.0, error
