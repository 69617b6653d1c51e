"""Measure ModelOpt's logits KD loss on CPU against the static estimator's KD terms.

    PYTHONPATH=<nvidia-modelopt and its dependencies> python tools/measure_kd_loss_cpu.py

Runs the real ``LogitsKLLoss`` of ``modelopt.torch.distill.plugins.megatron`` (the loss
Megatron-LM's post-training distillation uses) forward and backward on bf16 ``[s, b, V/t]``
student and teacher logits, under MemScope's exact ``storage`` backend, in one gloo process:
with ``tensor_model_parallel_size`` 1 (``log_softmax`` path) and 2 (the vocab-parallel path:
its all-reduces run over a group of one, so the per-rank shapes are those of a TP-2 rank).
For each it prints what the forward leaves saved for backward and the forward's high-water
mark above those saved tensors and the two logits, next to the estimator's
``distillation_extras`` / ``distillation_moments`` for the same shapes.

ModelOpt is not a MemScope dependency and its wheel pulls in many packages, so this script is
not run by the test suite; without ModelOpt it says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile


def _kd_terms(seq: int, mbs: int, vocab: int, tp: int) -> tuple[int, int, int]:
    """(one 16-bit logits tensor, saved bytes, moment bytes above saved and both logits) from
    the estimator's code for a matching spec."""
    from memscope.analysis.static.activations import dims
    from memscope.analysis.static.distillation import distillation_extras, distillation_moments
    from memscope.analysis.static.sources import spec_from_megatron_args

    args = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=seq,
                padded_vocab_size=vocab * tp, micro_batch_size=mbs, global_batch_size=mbs,
                bf16=True, tensor_model_parallel_size=tp, world_size=tp,
                export_kd_teacher_load="/none", kd_teacher_num_layers=2,
                kd_teacher_hidden_size=64, kd_teacher_ffn_hidden_size=256,
                kd_teacher_num_attention_heads=4)  # fmt: skip
    spec = spec_from_megatron_args(args)
    x = dims(spec)
    extras: dict[str, int] = {}
    distillation_extras(spec, x, first=True, last=True, extras=extras)
    moments: dict[str, int] = {}
    distillation_moments(spec, x, moments)
    return x.logits, extras["kd_loss_saved"], moments["kd_loss"] - 2 * x.logits


def _measure(seq: int, mbs: int, vocab: int, tp: int) -> tuple[int, int]:
    """(saved bytes after forward, forward peak above saved and both logits), measured."""
    import torch
    from megatron.core.transformer import TransformerConfig
    from modelopt.torch.distill.plugins.megatron import LogitsKLLoss

    from memscope.capture.backends.storage import StorageLedgerBackend

    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, tensor_model_parallel_size=tp
    )
    loss_fn = LogitsKLLoss(config)
    ledger = StorageLedgerBackend("cpu")
    ledger.start()
    try:
        student = torch.randn(seq, mbs, vocab, dtype=torch.bfloat16, requires_grad=True)
        teacher = torch.randn(seq, mbs, vocab, dtype=torch.bfloat16)
        base = ledger.sample().allocated
        ledger.reset_peak()
        loss, _, _ = loss_fn(student, teacher)
        after = ledger.sample()
        saved = after.allocated - base - loss.numel() * loss.element_size()
        peak_above = after.peak_allocated - base - saved
        loss.sum().backward()
    finally:
        ledger.stop()
    return saved, peak_above


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--mbs", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary per TP rank")
    opts = parser.parse_args()
    try:
        import modelopt.torch.distill.plugins.megatron  # noqa: F401
    except ImportError as exc:
        print(f"ModelOpt's Megatron distillation plugin is not importable: {exc}")
        return 2
    import torch
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    init = f"file://{tempfile.mkdtemp()}/rendezvous"
    torch.distributed.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    mib = 1 << 20
    print(f"LogitsKLLoss, bf16 logits [s={opts.seq}, b={opts.mbs}, V/t={opts.vocab}] (MiB)")
    print(f"{'tp':>3} {'logits':>8} {'saved':>8} {'est':>8} {'moment':>8} {'est':>8}")
    for tp in (1, 2):
        logits, est_saved, est_moment = _kd_terms(opts.seq, opts.mbs, opts.vocab, tp)
        saved, moment = _measure(opts.seq, opts.mbs, opts.vocab, tp)
        print(
            f"{tp:>3} {logits / mib:8.2f} {saved / mib:8.2f} {est_saved / mib:8.2f} "
            f"{moment / mib:8.2f} {est_moment / mib:8.2f}"
        )
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
