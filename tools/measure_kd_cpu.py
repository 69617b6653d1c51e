"""Measure ModelOpt knowledge distillation on CPU against the static estimator's KD terms.

    PYTHONPATH=<nvidia-modelopt and its dependencies> python tools/measure_kd_cpu.py

**A whole training step.** The tiny real megatron-core ``GPTModel`` of ``memscope demo``
(local spec, fp32, one gloo process) as the student and a larger one as the teacher, joined by
ModelOpt as Megatron-LM's ``megatron/post_training/model_provider.py`` does
(``mtd.convert(model, mode=[("kd_loss", ...)])`` with ``setup_distillation_config``'s default
logits KD, then ``adjust_distillation_model_for_mcore``), trained for three steps with
megatron's own schedule and ``torch.optim.Adam`` over the student, the loss as
``megatron/post_training/loss_func.py`` computes it (``compute_kd_loss``), without and with
two pipeline stages (ModelOpt's ``get_tensor_shapes_adjust_fn_for_distillation`` widens the
p2p tensors by the teacher's hidden size, as Megatron-LM's training loop passes it). The
exact ``storage`` backend measures each rank's peak of the last step; the same student trained
without a teacher is the reference. Printed: measured and estimated peak with and without KD,
and the teacher's weights (measured: the bytes of its parameters). ``build_model`` gives every
parameter a ``.grad`` as a stand-in for megatron's gradient buffer; the frozen teacher's are
dropped, since megatron allocates none for parameters without ``requires_grad``.

**The loss alone.** Runs the real ``LogitsKLLoss`` of
``modelopt.torch.distill.plugins.megatron`` (the loss Megatron-LM's post-training distillation
uses) forward and backward on bf16 ``[s, b, V/t]``
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
import sys


def _kd_terms(seq: int, mbs: int, vocab: int, tp: int) -> tuple[int, int, int]:
    """(one 16-bit logits tensor, saved bytes, moment bytes above saved and both logits) from
    the estimator's code for a matching spec."""
    from memscope.analysis.static.activations import dims
    from memscope.analysis.static.distillation import distillation_extras, distillation_moments
    from memscope.inputs.megatron_args import spec_from_megatron_args

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


def step_worker(rank: int, world: int, port: int, kd: bool, cfg, teacher_cfg) -> tuple:
    """One rank of the tiny GPT trained three steps with or without a teacher: (pp_rank, peak
    bytes of the last step, teacher parameter bytes), measured by the storage backend."""
    from functools import partial

    import modelopt.torch.distill as mtd
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from modelopt.torch.distill.plugins import megatron as mp

    from memscope.capture.backends.storage import StorageLedgerBackend
    from memscope.demo.tiny_gpt import build_model, destroy_process, init_process
    from memscope.demo.tiny_gpt_training import make_data_iterators

    init_process(rank, world, port, cfg)
    last = parallel_state.is_pipeline_last_stage()
    ledger = StorageLedgerBackend("cpu")
    ledger.start()
    try:
        student = build_model(cfg)[0]
        model, teacher_bytes, adjust = student, 0, None
        if kd:
            teacher = build_model(teacher_cfg)[0]
            for param in teacher.parameters():
                # build_model gives every parameter a .grad (the harness' stand-in for
                # megatron's gradient buffer); a frozen teacher has none in megatron
                param.grad = None
            teacher_bytes = sum(p.numel() * p.element_size() for p in teacher.parameters())
            dcfg = mp.setup_distillation_config(None, student.config, teacher.config)
            kd_config = {"teacher_model": teacher, "criterion": dcfg.criterion,
                         "loss_balancer": dcfg.loss_balancer}  # fmt: skip
            model = mtd.convert(student, mode=[("kd_loss", kd_config)])
            mp.adjust_distillation_model_for_mcore(model, dcfg)
            adjust = mp.get_tensor_shapes_adjust_fn_for_distillation(
                model, seq_length=cfg.seq_length, micro_batch_size=cfg.micro_batch_size,
                decoder_seq_length=None,
            )  # fmt: skip
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad])

        def masked(output, mask):
            # megatron/post_training/loss_func.py _mask_loss (one rank: no all-reduce)
            if isinstance(output, tuple):  # a KD loss: (loss, tp_reduce, is_sequence_parallel)
                output = output[0]
            return torch.sum(output.view(-1).float() * mask) / mask.sum()

        def loss_func(loss_mask, output):
            # megatron/post_training/loss_func.py: the masked LM loss, then compute_kd_loss
            mask = loss_mask.reshape(-1).float()
            loss = masked(output, mask)
            if kd:
                loss = model.compute_kd_loss(
                    student_loss=loss, loss_reduction_fn=lambda x: masked(x, mask)
                )["kd_loss"]
            return loss, {"loss": loss.detach().view(1)}

        def forward_step(iterator, chunk):
            batch = next(iterator)
            out = chunk(batch["tokens"], batch["position_ids"], batch["attention_mask"],
                        labels=batch["labels"] if last else None)  # fmt: skip
            return out, partial(loss_func, batch["loss_mask"])

        iterators = make_data_iterators(cfg)
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            ledger.reset_peak()
            get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iterators, model=[model],
                num_microbatches=cfg.num_microbatches, seq_length=cfg.seq_length,
                micro_batch_size=cfg.micro_batch_size, forward_only=False,
                adjust_tensor_shapes_fn=adjust,
            )  # fmt: skip
            optimizer.step()
        peak = ledger.sample().peak_allocated
        stage = parallel_state.get_pipeline_model_parallel_rank()
    finally:
        ledger.stop()
        destroy_process()
    return stage, peak, teacher_bytes


def _step_estimate(kd: bool, cfg, teacher_cfg, pp_rank: int) -> tuple[int, int]:
    """(estimated peak, estimated teacher weights) of stage ``pp_rank`` of the same run."""
    import dataclasses

    from memscope.analysis.static.estimator import estimate_rank
    from memscope.analysis.static.params import RankPosition
    from memscope.demo.traced_training import megatron_like_args
    from memscope.inputs.megatron_args import spec_from_megatron_args

    args = vars(megatron_like_args(cfg, []))
    args["world_size"] = cfg.pp
    if kd:
        args.update(
            export_kd_teacher_load="/none", kd_teacher_num_layers=teacher_cfg.num_layers,
            kd_teacher_hidden_size=teacher_cfg.hidden_size,
            kd_teacher_ffn_hidden_size=4 * teacher_cfg.hidden_size,
            kd_teacher_num_attention_heads=teacher_cfg.num_attention_heads,
        )  # fmt: skip
    spec = dataclasses.replace(spec_from_megatron_args(args), device="cpu")
    est = estimate_rank(spec, RankPosition(0, pp_rank))
    return est.peak_memory_bytes, est.weight_terms.get("teacher_weights", 0)


def whole_step(vocab: int) -> None:
    """Print the whole-step comparison (see the module doc), without and with pipelining."""
    import dataclasses

    from memscope.demo.launcher import free_port, spawn
    from memscope.demo.tiny_gpt import TinyGPTConfig

    mib = 1 << 20
    print(f"tiny GPT steps (student 4x64, teacher 4x128, vocab {vocab}, fp32) (MiB)")
    print(f"{'run':>8} {'stage':>5} {'peak':>8} {'est':>8} {'error':>7} {'teacher':>8} {'est':>8}")
    for pp in (1, 2):
        cfg = TinyGPTConfig(num_layers=4, hidden_size=64, num_attention_heads=4,
                            seq_length=128, micro_batch_size=2, num_microbatches=4,
                            vocab_size=vocab, pp=pp)  # fmt: skip
        teacher_cfg = dataclasses.replace(cfg, hidden_size=128)
        for kd in (False, True):
            for stage, peak, teacher in spawn(pp, step_worker, free_port(), kd, cfg, teacher_cfg):
                est, est_teacher = _step_estimate(kd, cfg, teacher_cfg, stage)
                name = f"{'kd' if kd else 'plain'} pp{pp}"
                print(
                    f"{name:>8} {stage:>5} {peak / mib:8.2f} {est / mib:8.2f} "
                    f"{(est - peak) / peak:+7.1%} {teacher / mib:8.2f} {est_teacher / mib:8.2f}"
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--mbs", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary per TP rank")
    parser.add_argument("--step-vocab", type=int, default=4096, help="the tiny GPT's vocabulary")
    opts = parser.parse_args()
    try:
        import modelopt.torch.distill.plugins.megatron  # noqa: F401
    except ImportError as exc:
        print(f"ModelOpt's Megatron distillation plugin is not importable: {exc}")
        return 2
    whole_step(opts.step_vocab)
    from memscope.demo.launcher import free_port, spawn

    mib = 1 << 20
    print(f"LogitsKLLoss, bf16 logits [s={opts.seq}, b={opts.mbs}, V/t={opts.vocab}] (MiB)")
    print(f"{'tp':>3} {'logits':>8} {'saved':>8} {'est':>8} {'moment':>8} {'est':>8}")
    rows = spawn(1, loss_worker, free_port(), opts.seq, opts.mbs, opts.vocab)[0]
    for tp, (saved, moment) in rows:
        logits, est_saved, est_moment = _kd_terms(opts.seq, opts.mbs, opts.vocab, tp)
        print(
            f"{tp:>3} {logits / mib:8.2f} {saved / mib:8.2f} {est_saved / mib:8.2f} "
            f"{moment / mib:8.2f} {est_moment / mib:8.2f}"
        )
    return 0


def loss_worker(rank: int, world: int, port: int, seq: int, mbs: int, vocab: int) -> list:
    """The loss alone in one gloo process: [(tp, (saved, moment))] for TP 1 and 2."""
    from memscope.demo.tiny_gpt import TinyGPTConfig, destroy_process, init_process

    init_process(rank, world, port, TinyGPTConfig())
    try:
        return [(tp, _measure(seq, mbs, vocab, tp)) for tp in (1, 2)]
    finally:
        destroy_process()


if __name__ == "__main__":
    sys.exit(main())
