"""The unfused attention's backward on bf16 scores with an fp32 softmax, measured on CPU.

Every bf16 run without flash or fused attention takes this path (megatron-core's local spec,
Transformer Engine's unfused backend). Its backward holds three fp32 score-sized tensors at
the softmax: the saved output, the gradient the cast back to bf16 hands on, and the result
(``activations.torch_softmax_backward``). The CPU accuracy matrix trains in fp32 and never
takes this path; the first GPU pass found the 4096-token case 12% over the estimate.

Here real megatron-core GPTs train in bf16 on the CPU (``Float16Module``, Megatron's DDP
with fp32 gradient buffers, ``get_megatron_optimizer``; the DDP and optimizer CUDA calls
redirected by ``tests/harness/megatron_ddp_cpu.py``) under the exact ``storage`` backend,
and the report's in-run estimate must match the measured peak.
"""

from __future__ import annotations

import os
import sys

import pytest

from memscope.demo.launcher import free_port, spawn

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")

# (name, GpuCase overrides): score-dominated shapes (s = 1024, 4 heads of 16)
CASES = [
    ("dropout", dict(dropout=0.1)),
    ("no dropout", dict(dropout=0.0)),
    ("selective recompute", dict(dropout=0.1, recompute="selective")),
    ("full recompute", dict(dropout=0.1, recompute="full")),
]


def _measure(rank: int, world_size: int, port: int, outdir: str) -> list[tuple]:
    del rank, world_size
    os.environ["MASTER_PORT"] = str(port)
    sys.path.insert(0, TOOLS)
    import gpu_megatron_check as g

    from memscope.demo.tiny_gpt import quiet_megatron_cpu_warnings

    quiet_megatron_cpu_warnings()
    device = g.Device(cpu_smoke=True)
    g.init_process(device)
    rows = []
    for name, overrides in CASES:
        case = g.GpuCase(
            name, num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=1024,
            micro_batch_size=1, num_microbatches=1, vocab_size=128, **overrides,
        )  # fmt: skip
        where = os.path.join(outdir, name.replace(" ", "_"))
        result = g.run(
            case, device, 2, ["--memscope-backend", "storage", "--memscope-outdir", where]
        )
        assert result.report is not None and result.args is not None
        estimate = g.args_estimate(result.args)
        rows.append((
            name,
            result.report["peak"]["memory_bytes"],
            result.report["peak"]["phase"],
            result.report["comparisons"]["static_peak_memory_bytes"],
            estimate.activations.peak_moment,
        ))  # fmt: skip
    return rows


def test_bf16_attention_backward_peak_is_what_megatron_core_allocates(tmp_path):
    (rows,) = spawn(1, _measure, free_port(), str(tmp_path))
    for name, measured, phase, estimated, moment in rows:
        assert phase == "backward", name
        assert "attention_backward" in moment, (name, moment)
        # within 16 KiB of ~60-100 MB: the hidden-sized tensors around the attention core
        assert abs(estimated - measured) < 16 * 1024, (name, measured, estimated)
