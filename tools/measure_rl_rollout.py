"""What the RL loop's inference engine allocates in one step, measured on CPU with megatron-core's
own code (the functions Megatron-LM 4e85d74ae9's engine calls; megatron-core 0.16.1 here).

Two moments of a step (``memscope/analysis/static/rl_rollout.py``), each read from
``torch.profiler``'s memory timeline as the most allocated at once above the step's input:

- **the logits**: ``TextGenerationController._torch_sampling_func`` on the rows it is handed
  (``logits[indices, :]``, counted: the controller indexes them in the call) for each
  sampling setting the RL client can send (temperature, top-p; top-k stays 0), and
  ``DynamicInferenceContext.calculate_log_probs`` (a context built on the CPU) on
  ``[1, R, V]`` logits, in bytes per logits element above the logits;
- **the forward**: a megatron-core ``TransformerLayer`` (local spec, fusions off, one gloo
  process) under ``torch.inference_mode`` on ``[T, 1, h]`` its caller holds, dense (gated
  and not) and with experts (``SequentialMLP``, alltoall dispatcher, EP 1, under
  ``tests/harness/moe_cpu.py``'s CUDA redirections), in elements of ``T`` above its input,
  with oneDNN off (its bf16 GEMMs allocate packing buffers that cuBLAS, working in a
  preallocated workspace, does not). The core attention is a stand-in (the engine's flash
  kernel runs on GPUs only, the local spec's keeps ``[s, s]`` scores): torch's
  ``scaled_dot_product_attention``; at these sizes the MLP's moment is the layer's.

    python tools/measure_rl_rollout.py [--requests 64] [--vocab 8192] [--tokens 256]

``tests/test_rl_rollout_measured.py`` checks the estimator's terms against these figures.
The sampling function's ``self`` is a namespace holding its generator (``sampling_rng``,
the only attribute it reads); ``calculate_log_probs`` reads none in the last-token branch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from typing import Any
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from measure_fused_cross_entropy import _init_group, _memory_events, _peak_above  # noqa: E402

# (name, temperature, top_k, top_p) as the RL client reaches the engine: temperature and
# top-p (--rl-default-temperature 1, --rl-default-top-p 0), top-k always the server's 0
SAMPLING = (
    ("default", 1.0, 0, 0.0),
    ("temperature", 0.7, 0, 0.0),
    ("top_p", 1.0, 0, 0.9),
)
HIDDEN, FFN, MOE_FFN, EXPERTS, TOPK = 64, 160, 48, 4, 2
# the non-gated layer's FFN: wide enough that its MLP, not the attention stand-in, peaks
PLAIN_FFN = 320


@dataclass(frozen=True)
class LogitsMeasured:
    """Bytes per logits element above the logits, for one logits dtype."""

    element_bytes: int
    sampling: dict[str, float]
    log_probs: float


def _profile() -> Any:
    from torch.profiler import ProfilerActivity, profile

    return profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    )


def measure_logits(requests: int, vocab: int, dtype_name: str) -> LogitsMeasured:
    """The sampling settings' and the log-probabilities' working sets on ``[1, R, V]``."""
    import torch
    from megatron.core.inference.text_generation_controllers.text_generation_controller import (
        TextGenerationController,
    )

    with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):  # CPU build
        from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext

        context = DynamicInferenceContext(
            params_dtype=torch.bfloat16, num_layers=1, kv_channels=16, num_attention_heads=2,
            max_sequence_length=256, buffer_size_gb=0.001, tensor_model_parallel_size=1,
            pipeline_model_parallel_size=1,
        )  # fmt: skip
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    logits = torch.randn(1, requests, vocab).to(dtype)
    unit = requests * vocab * logits.element_size()
    rows = list(range(requests))
    sampling = {}
    for name, temperature, top_k, top_p in SAMPLING:
        owner = types.SimpleNamespace(sampling_rng=torch.Generator().manual_seed(0))
        with _profile() as prof:
            TextGenerationController._torch_sampling_func(
                owner, logits.squeeze(0)[rows, :], temperature, top_k, top_p
            )
        sampling[name] = _peak_above(_memory_events(prof)) / unit
    tokens = torch.randint(0, vocab, (requests,))
    with _profile() as prof:
        DynamicInferenceContext.calculate_log_probs(
            context, logits, tokens, only_last_token_logits=True
        )
    element = logits.element_size()
    return LogitsMeasured(
        element_bytes=element,
        sampling={k: v * element for k, v in sampling.items()},
        log_probs=_peak_above(_memory_events(prof)) / unit * element,
    )


def measure_forward(tokens: int) -> dict[str, float]:
    """One layer's working set per token, in elements, in a fresh interpreter
    (megatron-core's parallel state is process-wide)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_forward", str(tokens)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring failed: {proc.stderr[-2000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def flash_like_attention() -> Any:
    """Stand-in for the engine's core attention, whose flash kernel runs on GPUs only:
    ``scaled_dot_product_attention`` (causal), whose CPU flash kernel keeps no ``[s, s]``
    scores either; megatron-core's ``DotProductAttention`` signature, context ``[s, b, h]``."""
    import torch
    import torch.nn.functional as F

    class FlashLikeAttention(torch.nn.Module):
        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any, **_: Any) -> Any:
            s, b = query.shape[:2]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return context.permute(2, 0, 1, 3).reshape(s, b, -1)

    return FlashLikeAttention()


def _forward_here(tokens: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F
    from harness.moe_cpu import install_moe_cpu_stand_ins
    from megatron.core import parallel_state
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.demo.tiny_gpt import FUSIONS_OFF, quiet_megatron_cpu_warnings

    torch.set_num_threads(1)
    quiet_megatron_cpu_warnings()
    _init_group()
    install_moe_cpu_stand_ins()
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1234)
    moe = dict(num_moe_experts=EXPERTS, moe_ffn_hidden_size=MOE_FFN, moe_router_topk=TOPK,
               moe_token_dispatcher_type="alltoall")  # fmt: skip
    out = {}
    cases: list[tuple[str, bool, int, dict[str, Any]]] = [
        ("gated", True, FFN, {}), ("plain", False, PLAIN_FFN, {}), ("moe", True, FFN, moe),
    ]  # fmt: skip
    for name, gated, ffn, extra in cases:
        config = TransformerConfig(
            num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=ffn,
            gated_linear_unit=gated, activation_func=F.silu if gated else F.gelu,
            add_bias_linear=False, params_dtype=torch.bfloat16, bf16=True,
            use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
            **FUSIONS_OFF, **extra,
        )  # fmt: skip
        spec = specs.get_gpt_layer_local_spec(num_experts=EXPERTS if extra else None)
        layer = build_module(spec, config=config, layer_number=1)
        layer.eval()
        layer.self_attention.core_attention = flash_like_attention()
        torch.manual_seed(0)
        x = torch.randn(tokens, 1, HIDDEN, dtype=torch.bfloat16)  # held by the caller
        # oneDNN's bf16 GEMMs allocate packing buffers per call; cuBLAS works in a
        # preallocated workspace, so the CPU's own GEMM runs here
        with torch.backends.mkldnn.flags(enabled=False), torch.inference_mode(), _profile() as prof:
            layer(x, attention_mask=None)
        out[name] = _peak_above(_memory_events(prof)) / (tokens * 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--_forward", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._forward:
        print(json.dumps(_forward_here(args._forward)))
        return 0
    for dtype in ("bfloat16", "float32"):
        m = measure_logits(args.requests, args.vocab, dtype)
        print(f"logits [1, {args.requests}, {args.vocab}] {dtype}: bytes per element above them")
        for name, value in m.sampling.items():
            print(f"  sampling {name:12s} {value:6.2f}")
        print(f"  log-probabilities     {m.log_probs:6.2f}")
    forward = measure_forward(args.tokens)
    print(
        f"one layer under inference_mode, h={HIDDEN} f={FFN} (plain: f={PLAIN_FFN}; experts: "
        f"{EXPERTS} x f={MOE_FFN}, top-{TOPK}), elements per token above its input:"
    )
    for name, value in forward.items():
        print(f"  {name:6s} {value:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
