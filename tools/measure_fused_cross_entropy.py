"""What megatron-core's ``native`` fused cross entropy allocates, compiled and eager, on CPU.

``--cross-entropy-loss-fusion --cross-entropy-fusion-impl native`` makes megatron-core's
``GPTModel`` call ``fused_vocab_parallel_cross_entropy`` (megatron/core/fusions/
fused_cross_entropy.py), whose four helpers are decorated with ``jit_fuser``: ``torch.compile``
on torch >= 2.2 (megatron/core/jit.py). This script runs that function, forward and backward,
on bf16 ``[s, b, V]`` logits in a one-process gloo group, once as megatron-core ships it
(compiled by Inductor) and once with ``TORCHDYNAMO_DISABLE=1`` (the helpers run eagerly), each
in a fresh interpreter, and
records every CPU allocation in ``torch.profiler``'s memory timeline (which sees the
buffers Inductor's generated code allocates too, which a dispatch mode would not). Printed,
in units of the fp32 logits size ``s * b * V * 4``:

- ``forward peak``: the most bytes allocated at once during the forward, above the logits;
- ``kept``: what the forward leaves allocated (the saved softmax and the per-token tensors);
- ``backward peak``: the most at once during the backward, above what the forward kept.

    python tools/measure_fused_cross_entropy.py [--seq 512] [--batch 2] [--vocab 8192]

The static estimator's cross-entropy terms (``memscope/analysis/static/activations.py``:
``cross_entropy_saved``, ``loss_moments``) are checked against these figures by
``tests/test_fused_cross_entropy_measured.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measured:
    """Bytes of one run: the forward's peak above its input, what it keeps, the backward's
    peak above what the forward kept."""

    forward_peak: int
    kept: int
    backward_peak: int


def _peak_above(events: list[tuple[int, int]]) -> int:
    """Running maximum of the summed allocation deltas (time-ordered)."""
    live = best = 0
    for _, delta in sorted(events):
        live += delta
        best = max(best, live)
    return best


def _memory_events(prof: Any) -> list[tuple[int, int]]:
    """(time, bytes) of every allocation (+) and free (-) the profiler saw, in order: its
    memory timeline (``torch.profiler``'s memory profile, the one ``export_memory_timeline``
    draws), storages that existed before the profile left out."""
    from torch.profiler._memory_profiler import Action

    sign = {Action.CREATE: 1, Action.DESTROY: -1}
    return [
        (t, sign[action] * size)
        for t, action, _, size in prof._memory_profile().timeline
        if action in sign and t >= 0
    ]


def _init_group() -> Any:
    import torch.distributed as dist

    if not dist.is_initialized():
        store = os.path.join(tempfile.mkdtemp(prefix="memscope-ce-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    return dist.new_group([0])


def measure(seq: int, batch: int, vocab: int, compiled: bool) -> Measured:
    """One run in a fresh interpreter (TorchDynamo keeps per-code decisions for the life of a
    process, so the two modes never share one): ``TORCHDYNAMO_DISABLE=1`` for eager."""
    env = dict(os.environ, TORCHDYNAMO_DISABLE="0" if compiled else "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--_one", str(seq), str(batch), str(vocab)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring failed: {proc.stderr[-2000:]}")
    return Measured(**json.loads(proc.stdout.strip().splitlines()[-1]))


def _measure_here(seq: int, batch: int, vocab: int) -> Measured:
    """Run megatron-core's fused cross entropy twice (the first compiles) and measure the
    second run."""
    import torch
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
    from torch.profiler import ProfilerActivity, profile

    group = _init_group()
    options: dict[str, Any] = dict(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    )
    torch.manual_seed(0)
    target = torch.randint(0, vocab, (seq, batch))
    # the first run compiles, outside the profiler (compiling under it is several times
    # slower, and what compiling allocates is not the loss's)
    logits = torch.randn(seq, batch, vocab, dtype=torch.bfloat16, requires_grad=True)
    loss = fused_vocab_parallel_cross_entropy(logits, target, group)
    loss.backward(torch.ones_like(loss))
    del logits, loss
    logits = torch.randn(seq, batch, vocab, dtype=torch.bfloat16, requires_grad=True)
    with profile(**options) as fwd:
        loss = fused_vocab_parallel_cross_entropy(logits, target, group)
    forward = _memory_events(fwd)
    grad = torch.ones_like(loss)
    with profile(**options) as bwd:
        loss.backward(grad)
    kept = sum(delta for _, delta in forward)
    return Measured(_peak_above(forward), kept, _peak_above(_memory_events(bwd)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--_one", nargs=3, type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts._one:
        with contextlib.redirect_stdout(io.StringIO()):
            measured = _measure_here(*opts._one)
        print(json.dumps(dataclasses.asdict(measured)))
        return 0
    import torch

    unit = opts.seq * opts.batch * opts.vocab * 4
    print(
        f"megatron-core fused_vocab_parallel_cross_entropy, bf16 logits [{opts.seq}, "
        f"{opts.batch}, {opts.vocab}], torch {torch.__version__}, CPU; "
        "units of the fp32 logits size"
    )
    for compiled in (True, False):
        m = measure(opts.seq, opts.batch, opts.vocab, compiled)
        label = "torch.compile (as shipped)" if compiled else "eager (TORCHDYNAMO_DISABLE)"
        print(
            f"{label:<28} forward peak {m.forward_peak / unit:5.2f}  kept {m.kept / unit:5.2f}  "
            f"backward peak {m.backward_peak / unit:5.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
