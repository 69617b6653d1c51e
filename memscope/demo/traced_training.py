"""A traced worker: the tiny real megatron-core GPT trained with MemScope wired in.

This is the training loop of ``memscope demo`` (and, through an observer, of the tests and
benchmarks). It wires the runtime exactly as the FlagScale / Megatron-LM patches do
(``from_megatron_args`` → ``attach_model`` → ``start`` → step callbacks → ``finalize``;
``on_exception`` when training raises).

An optional :class:`TrainingObserver` sees the model, optimizer and runtime at fixed points of
the run without changing it; the test suite's instrumentation (digests, hook counts, injected
faults) lives in the repository's ``tests/harness/``, not in this package.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from memscope.config import RuntimeConfig
from memscope.demo.tiny_gpt import (
    FUSIONS_OFF,
    TinyGPTConfig,
    build_model,
    build_optimizer,
    destroy_process,
    init_process,
)
from memscope.demo.tiny_gpt_training import make_data_iterators, train_step
from memscope.integrations.megatron.args import add_memscope_args
from memscope.integrations.megatron.runtime import MemScopeMegatronRuntime
from memscope.integrations.torch.runtime import MemScopeTorchRuntime


@dataclass
class WorkerResult:
    """What one rank reports back to the launcher."""

    rank: int
    losses: list[float | None]
    step_times: list[float] = field(default_factory=list)
    report_path: str | None = None


class TrainingObserver(Protocol):
    """Watches one :func:`traced_worker` run; called in the worker process, in this order.

    ``model_built`` once the model chunks and optimizer exist, before MemScope touches them;
    ``attached`` (traced runs only) once the runtime is attached to them but not yet started;
    ``started`` once MemScope runs (``runtime`` is ``None`` for an untraced run), just before
    the first step; ``trained`` after each step, with Megatron's iteration (the step + 1) and
    the step's loss, where Megatron-LM's ``training_log`` logs to TensorBoard and W&B;
    ``finished`` after the last step and MemScope's ``finalize`` (report
    written, hooks removed). Not called when training raises. An observer handed to
    :func:`memscope.demo.launcher.spawn` must be picklable; a subclass inherits no-op methods.
    """

    def model_built(self, chunks: list[torch.nn.Module], optimizer: torch.optim.Optimizer) -> None:
        """The model and optimizer are built; nothing is traced yet."""

    def attached(
        self,
        runtime: MemScopeMegatronRuntime,
        chunks: list[torch.nn.Module],
        optimizer: torch.optim.Optimizer,
    ) -> None:
        """MemScope is attached to the model and optimizer; ``start`` comes next."""

    def started(
        self,
        runtime: MemScopeMegatronRuntime | None,
        chunks: list[torch.nn.Module],
        optimizer: torch.optim.Optimizer,
    ) -> None:
        """MemScope is started (``None``: untraced); no step has run."""

    def trained(self, iteration: int, loss: float | None) -> None:
        """A step ended; ``iteration`` counts the steps done (Megatron's logged iteration)."""

    def finished(
        self,
        result: WorkerResult,
        chunks: list[torch.nn.Module],
        optimizer: torch.optim.Optimizer,
    ) -> None:
        """Every step ran and MemScope is finalized; ``result`` is about to be returned."""


def megatron_like_args(cfg: TinyGPTConfig, memscope_argv: list[str]) -> argparse.Namespace:
    """A namespace shaped like Megatron's parsed args, with MemScope's flags parsed in."""
    parser = add_memscope_args(argparse.ArgumentParser(allow_abbrev=False))
    args = parser.parse_args(memscope_argv)
    args.tensor_model_parallel_size = cfg.tp
    args.pipeline_model_parallel_size = cfg.pp
    args.virtual_pipeline_model_parallel_size = cfg.vpp
    args.pipeline_model_parallel_layout = cfg.pipeline_layout
    args.context_parallel_size = 1
    args.expert_model_parallel_size = 1
    args.params_dtype = torch.float32
    args.bf16 = args.fp16 = False
    args.num_layers = cfg.num_layers
    args.hidden_size = cfg.hidden_size
    args.num_attention_heads = cfg.num_attention_heads
    args.seq_length = cfg.seq_length
    args.micro_batch_size = cfg.micro_batch_size
    # What the static estimator reads (Megatron's names for the harness' settings).
    args.padded_vocab_size = cfg.vocab_size
    args.num_query_groups = cfg.num_query_groups
    args.group_query_attention = cfg.num_query_groups is not None
    args.ffn_hidden_size = cfg.ffn_hidden_size
    args.swiglu = cfg.swiglu
    args.sequence_parallel = cfg.sequence_parallel and cfg.tp > 1
    args.recompute_granularity = cfg.recompute
    args.recompute_method = "uniform" if cfg.recompute == "full" else None
    args.recompute_num_layers = 1 if cfg.recompute == "full" else None
    args.hidden_dropout = args.attention_dropout = cfg.dropout
    args.num_microbatches = cfg.num_microbatches
    args.untie_embeddings_and_output_weights = not (
        cfg.share_embeddings if cfg.share_embeddings is not None else cfg.pp == 1
    )
    args.optimizer = cfg.optimizer
    args.sgd_momentum = 0.0  # build_optimizer's plain SGD
    args.torch_optimizer = True  # torch.optim keeps a float32 ``step`` tensor per parameter
    args.transformer_impl = "local"
    # the run builds its TransformerConfig with FUSIONS_OFF: say so in Megatron's names
    args.bias_swiglu_fusion = args.bias_gelu_fusion = FUSIONS_OFF["bias_activation_fusion"]
    args.masked_softmax_fusion = FUSIONS_OFF["masked_softmax_fusion"]
    args.gradient_accumulation_fusion = FUSIONS_OFF["gradient_accumulation_fusion"]
    args.apply_rope_fusion = FUSIONS_OFF["apply_rope_fusion"]
    args.overlap_p2p_comm = False  # the model's TransformerConfig default (megatron-core's)
    # the harness's batches carry one [1, 1, s, s] causal mask each (tiny_gpt_training.py),
    # not GPTDataset's [b, 1, s, s] one
    args.create_attention_mask_in_dataloader = False
    return args


#: The Megatron-LM arguments a minimal args namespace lacks (``megatron_args="minimal"``):
#: the fusions and ``transformer_impl``, whose command-line defaults (on, Transformer Engine)
#: are the opposite of megatron-core's TransformerConfig defaults and of this model.
MINIMAL_ARGS_DROP = (
    "bias_swiglu_fusion", "bias_gelu_fusion", "masked_softmax_fusion",
    "gradient_accumulation_fusion", "apply_rope_fusion", "transformer_impl",
)  # fmt: skip
ARGS_MODES = ("full", "minimal", "none")


class TorchRuntimeCallbacks:
    """The training step's Megatron-style callbacks onto :class:`MemScopeTorchRuntime`'s
    ``step`` / ``optimizer_step`` blocks: a megatron-core model driven by a plain loop."""

    def __init__(self, runtime: MemScopeTorchRuntime) -> None:
        self.runtime = runtime
        self._step = contextlib.ExitStack()
        self._optimizer = contextlib.ExitStack()

    def start(self) -> None:
        self.runtime.start()

    def on_train_step_start(self, step: int, **_: Any) -> None:
        self._step.enter_context(self.runtime.step(step))

    def on_optimizer_step_start(self) -> None:
        self._optimizer.enter_context(self.runtime.optimizer_step())

    def on_optimizer_step_end(self) -> None:
        self._optimizer.close()

    def on_train_step_end(self, **_: Any) -> None:
        self._step.close()

    def on_exception(self, exc: BaseException) -> None:
        self.runtime.session.record_exception(exc)

    def finalize(self) -> None:
        self.runtime.finalize()

    @property
    def report_path(self) -> str | None:
        return self.runtime.report_path


def _runtime(
    cfg: TinyGPTConfig,
    memscope_argv: list[str],
    chunks: list[torch.nn.Module],
    optimizer: torch.optim.Optimizer,
    megatron_args: str,
) -> Any:
    """The traced run's runtime: Megatron's with full or minimal args, or (``none``) the
    plain-PyTorch adapter told the batch sizes as another trainer would."""
    args = megatron_like_args(cfg, memscope_argv)
    if megatron_args == "none":
        training = dict(
            seq_length=cfg.seq_length,
            micro_batch_size=cfg.micro_batch_size,
            num_microbatches=cfg.num_microbatches,
        )
        config = RuntimeConfig.from_megatron_args(args)
        return TorchRuntimeCallbacks(
            MemScopeTorchRuntime(chunks, optimizer, config=config, training=training)
        )
    if megatron_args == "minimal":
        for name in MINIMAL_ARGS_DROP:
            delattr(args, name)
    runtime = MemScopeMegatronRuntime.from_megatron_args(args)
    runtime.attach_model(chunks)
    runtime.attach_optimizer(optimizer)
    return runtime


def traced_worker(
    rank: int,
    world_size: int,
    port: int,
    cfg: TinyGPTConfig,
    steps: int,
    memscope_argv: list[str] | None,
    observer: TrainingObserver | None = None,
    megatron_args: str = "full",
) -> WorkerResult:
    """Train ``steps`` steps; with ``memscope_argv`` (e.g. ``["--memscope", ...]``) traced.

    ``observer`` (see :class:`TrainingObserver`) is told about the run at fixed points
    (``attached`` only with Megatron's runtime). ``megatron_args`` (one of
    :data:`ARGS_MODES`): the runtime gets full Megatron args, args lacking
    :data:`MINIMAL_ARGS_DROP`, or none (the plain-PyTorch adapter).
    """
    if megatron_args not in ARGS_MODES:
        raise ValueError(f"megatron_args must be one of {ARGS_MODES}, got {megatron_args!r}")
    torch.set_num_threads(1)
    init_process(rank, world_size, port, cfg)
    runtime: Any = None
    try:
        chunks = build_model(cfg)
        optimizer = build_optimizer(chunks, cfg)
        if observer is not None:
            observer.model_built(chunks, optimizer)
        if memscope_argv is not None:
            runtime = _runtime(cfg, memscope_argv, chunks, optimizer, megatron_args)
            if observer is not None and megatron_args != "none":
                observer.attached(runtime, chunks, optimizer)
            runtime.start()
        if observer is not None:
            observer.started(runtime, chunks, optimizer)
        iterators = make_data_iterators(cfg)
        losses: list[float | None] = []
        times: list[float] = []
        try:
            for step in range(steps):
                t = time.perf_counter()
                losses.append(train_step(chunks, optimizer, cfg, step, iterators, runtime))
                times.append(time.perf_counter() - t)
                if observer is not None:
                    observer.trained(step + 1, losses[-1])
        except BaseException as exc:
            if runtime is not None:
                runtime.on_exception(exc)
            raise
        result = WorkerResult(rank=rank, losses=losses, step_times=times)
        if runtime is not None:
            runtime.finalize()
            result.report_path = runtime.report_path
        if observer is not None:
            observer.finished(result, chunks, optimizer)
        return result
    finally:
        if runtime is not None:
            runtime.finalize()
        destroy_process()
