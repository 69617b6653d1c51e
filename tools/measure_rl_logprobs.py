"""What the RL loop's loss allocates around its log-probabilities, forward and backward, on CPU.

Megatron-LM's ``train_rl.py`` ``forward_step`` takes its loss from ``get_logprobs``
(megatron/rl/rl_utils.py at 4e85d74ae9): the model's full-vocabulary logits ``[b, s, V]``
(gathered over the tensor ranks, returned as a fresh copy), then, row by row of the batch,
``log_softmax`` over ``[s - 1, V]`` and the next token's entry. This script runs that sequence
of torch operations forward and backward and records every CPU allocation in
``torch.profiler``'s memory timeline. It runs at fp32: for 16-bit inputs the CPU
``log_softmax`` backward allocates an fp32 conversion buffer that the CUDA kernel does not,
and the autograd structure (what is saved, what each backward node allocates) does not
depend on the dtype. Printed, in units of the logits ``b * s * V * 4``:

- ``forward peak``: the most allocated at once during the forward, above the model output;
- ``kept``: what the forward leaves allocated (the ``log_softmax`` outputs autograd saves);
- ``backward peak``: the most at once during the backward, above what the forward kept.

    python tools/measure_rl_logprobs.py [--batch 1] [--seq 256] [--vocab 4096]

The static estimator's RL loss terms (``memscope/analysis/static/rl_loss.py``) are checked
against these figures by ``tests/test_rl_logprobs_measured.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from measure_fused_cross_entropy import Measured, _memory_events, _peak_above  # noqa: E402


def _row_log_probs(logits: Any, tokens: Any) -> Any:
    """Row by row of the batch: ``log_softmax`` over the vocabulary of every position but
    the last, and the entry of the token that follows."""
    import torch

    picked = []
    for row, nxt in zip(logits[:, :-1, :], tokens[:, 1:], strict=True):
        log_probs = torch.nn.functional.log_softmax(row, dim=-1)
        picked.append(log_probs.gather(dim=-1, index=nxt.unsqueeze(-1)).squeeze(-1))
    return torch.stack(picked)


def measure(batch: int, seq: int, vocab: int) -> Measured:
    """One forward and backward of the loss's log-probabilities on ``[batch, seq, vocab]``
    fp32 logits that an autograd op made from a leaf (as the model's output is)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    options: dict[str, Any] = dict(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    )
    torch.manual_seed(0)
    leaf = torch.randn(batch, seq, vocab, requires_grad=True)
    tokens = torch.randint(0, vocab, (batch, seq))
    with profile(**options) as fwd:
        logits = leaf * 1.0  # a fresh output tensor, freed once the loss has used it
        log_probs = _row_log_probs(logits, tokens)
        del logits
    forward = _memory_events(fwd)
    loss = log_probs.sum()
    with profile(**options) as bwd:
        loss.backward()
    kept = sum(delta for _, delta in forward)
    return Measured(_peak_above(forward), kept, _peak_above(_memory_events(bwd)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args(argv)
    m = measure(args.batch, args.seq, args.vocab)
    unit = args.batch * args.seq * args.vocab * 4
    print(f"logits [b={args.batch}, s={args.seq}, V={args.vocab}] fp32: {unit} bytes")
    figures = (
        ("forward peak", m.forward_peak, "logits"),
        ("kept", m.kept, "logits"),
        ("backward peak", m.backward_peak, "logits above what the forward kept"),
    )
    for label, size, what in figures:
        print(f"{label:<14}{size / unit:.3f} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
