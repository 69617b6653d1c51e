"""A tiny *real* megatron-core ``GPTModel`` trained on CPU (gloo) with megatron's own schedules.

Used by ``memscope demo``, the test suite and the benchmark to drive a memory tracer through
real Megatron training: real ``GPTModel`` (local spec), real tensor-parallel layers, real
``get_forward_backward_func()`` schedule (no pipelining / 1F1B / interleaved 1F1B), real p2p.
The few CUDA-only calls are redirected by :mod:`memscope.demo.megatron_cpu_shims`.

Public API (data and the training step are in :mod:`memscope.demo.tiny_gpt_training`, the
process launcher in :mod:`memscope.demo.launcher`)
----------
``TinyGPTConfig``
    Dataclass describing the model / parallelism / training (see its fields); methods
    ``validate(world_size=None)``, ``dp(world_size) -> int``, ``to_dict()``.
``init_process(rank, world_size, port, cfg) -> None`` / ``destroy_process() -> None``
    Gloo process group, CPU shims, ``parallel_state.initialize_model_parallel``, seeding /
    the reverse.
``build_model(cfg) -> list[torch.nn.Module]``
    One ``GPTModel`` per virtual pipeline stage held by this rank (``len == cfg.vpp or 1``).
``build_optimizer(chunks, cfg) -> torch.optim.Optimizer``
    ``torch.optim.Adam`` or ``SGD`` over all chunks' parameters.
``quiet_megatron_cpu_warnings()``, ``SequenceParallelTorchLayerNorm``
    Silencer for megatron's "Apex/TE not installed" warnings; the SP-capable torch LayerNorm
    used in place of megatron's CPU norm when sequence_parallel.

Typical use::

    cfg = TinyGPTConfig(pp=2, num_microbatches=4)
    losses_per_rank = spawn(2, run_training, free_port(), cfg, 3)   # launcher, training

Megatron-core is imported lazily (inside the functions) so that importing this module is cheap.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

__all__ = [
    "FUSIONS_OFF",
    "SequenceParallelTorchLayerNorm",
    "TinyGPTConfig",
    "build_model",
    "build_optimizer",
    "destroy_process",
    "init_process",
    "quiet_megatron_cpu_warnings",
]


@dataclasses.dataclass
class TinyGPTConfig:
    """Tiny GPT + parallelism + training settings (``world_size == tp * pp * dp``)."""

    num_layers: int = 2  # divisible by pp * (vpp or 1)
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_query_groups: int | None = None  # GQA when set (divisible by tp)
    ffn_hidden_size: int | None = None  # default 4 * hidden_size
    vocab_size: int = 128  # divisible by tp
    seq_length: int = 32  # divisible by tp with sequence_parallel
    micro_batch_size: int = 2
    num_microbatches: int = 4
    tp: int = 1
    pp: int = 1
    vpp: int | None = None  # virtual pipeline (interleaved 1F1B) chunks per rank; needs pp > 1
    swiglu: bool = False
    recompute: str | None = None  # "selective" | "full" | None
    sequence_parallel: bool = False  # ignored when tp == 1 (as Megatron does)
    seed: int = 1234
    lr: float = 1e-3
    optimizer: str = "adam"  # "adam" | "sgd"
    dropout: float = 0.0  # hidden + attention dropout (Megatron's default would be 0.1)
    # None = tie word embeddings and output layer only when pp == 1 (see build_model).
    share_embeddings: bool | None = None
    deallocate_pipeline_outputs: bool = True  # as Megatron training sets it
    # Keep every ``.grad`` allocated and zero it in place each step, as Megatron's DDP keeps
    # its persistent gradient buffer (False: ``set_to_none``, grads appear during backward).
    grad_buffer: bool = True
    # megatron-core's pipeline_model_parallel_layout (e.g. "Et|tttL"): per virtual stage its
    # layers, embedding (E) and loss (L); vpp must match its stages per rank
    pipeline_layout: str | None = None

    def validate(self, world_size: int | None = None) -> None:
        """Raise ``ValueError`` for inconsistent settings."""
        chunks = self.vpp or 1
        if self.pipeline_layout is None and self.num_layers % (self.pp * chunks):
            raise ValueError("num_layers must be divisible by pp * (vpp or 1)")
        if self.vpp is not None and (self.pp < 2 or self.vpp < 1):
            raise ValueError("vpp needs pp > 1 and vpp >= 1")
        if self.vpp is not None and self.num_microbatches % self.pp:
            raise ValueError("interleaved schedule needs num_microbatches divisible by pp")
        if self.num_attention_heads % self.tp or self.vocab_size % self.tp:
            raise ValueError("num_attention_heads and vocab_size must be divisible by tp")
        if self.num_query_groups is not None and (
            self.num_query_groups % self.tp or self.num_attention_heads % self.num_query_groups
        ):
            raise ValueError("num_query_groups must divide heads and be divisible by tp")
        if self.sequence_parallel and self.tp > 1 and self.seq_length % self.tp:
            raise ValueError("seq_length must be divisible by tp with sequence_parallel")
        if self.recompute not in (None, "selective", "full"):
            raise ValueError("recompute must be 'selective', 'full' or None")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError("optimizer must be 'adam' or 'sgd'")
        if world_size is not None and world_size % (self.tp * self.pp):
            raise ValueError(f"world_size {world_size} not divisible by tp*pp")

    def dp(self, world_size: int) -> int:
        """Data-parallel size for ``world_size`` processes."""
        return world_size // (self.tp * self.pp)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields."""
        return dataclasses.asdict(self)


# TransformerConfig settings that keep megatron-core off its CUDA-kernel fusions (their
# jit / torch.compile'd helpers are not reached this way); shared with the tests.
FUSIONS_OFF: dict[str, bool] = dict(
    bias_activation_fusion=False,
    bias_dropout_fusion=False,
    masked_softmax_fusion=False,
    persist_layer_norm=False,
    apply_rope_fusion=False,
    gradient_accumulation_fusion=False,
)


def quiet_megatron_cpu_warnings() -> None:
    """Silence megatron-core's import-time "Apex / Transformer Engine not installed" notices."""
    import warnings

    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).*not installed")
    warnings.filterwarnings("ignore", message=r"full scope is deprecated")


def init_process(rank: int, world_size: int, port: int, cfg: TinyGPTConfig) -> None:
    """Join the gloo group, apply CPU shims, set up megatron parallel state and seed RNGs.

    Also sets ``torch.set_num_threads(1)`` (no oversubscription, thread-count-independent
    bit-identical results).  An already initialised default process group is reused.
    """
    cfg.validate(world_size)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    torch.set_num_threads(1)
    quiet_megatron_cpu_warnings()

    import torch.distributed as dist

    from memscope.demo.megatron_cpu_shims import apply_cpu_shims

    if not dist.is_initialized():
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(minutes=5),
        )
    apply_cpu_shims()

    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.tp,
        pipeline_model_parallel_size=cfg.pp,
        virtual_pipeline_model_parallel_size=cfg.vpp,
        create_gloo_process_groups=False,  # the default backend already is gloo
    )
    # Megatron's _set_random_seed: offset by pipeline rank; identical across TP ranks so the
    # full-size CPU-initialised master weights (use_cpu_initialization) agree before splitting.
    seed = cfg.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(seed)
    # CPU-safe: (re)installs megatron's inference RNG tracker (no-op add, null fork), so this
    # touches no CUDA generator state; the CPU generator above drives init and dropout.
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)


def destroy_process() -> None:
    """Tear down megatron parallel state and the process group (safe to call twice)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# model / optimizer / data


def _transformer_config(cfg: TinyGPTConfig) -> Any:
    """The megatron ``TransformerConfig`` for ``cfg`` (CPU-friendly, no fusions)."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs: dict[str, Any] = {}
    if cfg.recompute == "full":
        kwargs.update(recompute_method="uniform", recompute_num_layers=1)
    if cfg.swiglu:
        kwargs.update(gated_linear_unit=True, activation_func=F.silu)
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups,
        ffn_hidden_size=cfg.ffn_hidden_size,
        tensor_model_parallel_size=cfg.tp,
        pipeline_model_parallel_size=cfg.pp,
        virtual_pipeline_model_parallel_size=cfg.vpp,
        sequence_parallel=cfg.sequence_parallel and cfg.tp > 1,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
        perform_initialization=True,
        hidden_dropout=cfg.dropout,
        attention_dropout=cfg.dropout,
        **FUSIONS_OFF,
        deallocate_pipeline_outputs=cfg.deallocate_pipeline_outputs,
        recompute_granularity=cfg.recompute,
        pipeline_model_parallel_layout=cfg.pipeline_layout,
        **kwargs,
    )


def _finalize_model_grads(
    model: list[torch.nn.Module],
    num_tokens: torch.Tensor | None = None,
    pg_collection: Any = None,
    force_all_reduce: bool | None = False,
) -> None:
    """``config.finalize_model_grads_func`` for plain (non-DDP) modules.

    Does what megatron's ``finalize_model_grads`` + DDP would do for this harness: all-reduce
    sequence-parallel (layernorm) grads over TP, then average all grads over data parallel.
    Embeddings are untied across pipeline stages, so no embedding-group all-reduce is needed.
    """
    del num_tokens, force_all_reduce
    import torch.distributed as dist
    from megatron.core import parallel_state

    params = [p for chunk in model for p in chunk.parameters()]
    grads = [(p, p.grad) for p in params if p.grad is not None]
    tp_group = parallel_state.get_tensor_model_parallel_group()
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        for param, grad in grads:
            if getattr(param, "sequence_parallel", False):
                dist.all_reduce(grad, group=tp_group)
    dp_group = parallel_state.get_data_parallel_group()
    dp_size = parallel_state.get_data_parallel_world_size()
    if dp_size > 1:
        for _, grad in grads:
            dist.all_reduce(grad, group=dp_group)
            grad.div_(dp_size)
    del pg_collection


class SequenceParallelTorchLayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` usable with sequence parallelism (harness-side, not a shim).

    megatron's CPU fallback norm (``WrappedTorchNorm``) refuses ``sequence_parallel`` and the
    SP-capable norms need Apex / Transformer Engine.  LayerNorm is per-token, so it is exact on
    sequence shards; like megatron's ``FusedLayerNorm`` it tags its parameters with
    ``sequence_parallel`` so their grads get all-reduced over TP (see ``_finalize_model_grads``).
    """

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> None:
        del kwargs
        super().__init__(hidden_size, eps=eps)
        for param in self.parameters():
            param.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]


def _layer_spec(cfg: TinyGPTConfig, config: Any, vp_stage: int | None) -> Any:
    """``get_gpt_layer_local_spec()``; with sequence parallelism its norms are swapped for
    :class:`SequenceParallelTorchLayerNorm` (as a block spec, so the final norm is too)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec()
    if not config.sequence_parallel:
        return spec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    norm = SequenceParallelTorchLayerNorm
    submodules = dataclasses.replace(spec.submodules, input_layernorm=norm, pre_mlp_layernorm=norm)
    layer = dataclasses.replace(spec, submodules=submodules)
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=norm)


def build_model(cfg: TinyGPTConfig) -> list[torch.nn.Module]:
    """Build this rank's ``GPTModel`` chunks (one per virtual pipeline stage).

    Needs :func:`init_process` first.  Word embeddings and the output layer are tied only when
    ``pp == 1``: with pipelining megatron keeps a duplicate on the last stage and syncs it at
    init with ``weight.data.cuda()`` + all-reduce over the embedding group and later needs an
    embedding-grad all-reduce (DDP ``finalize_model_grads``); untying avoids both on CPU.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    config = _transformer_config(cfg)
    # Non-DDP modules: no async grad sync; our own finalize does the needed grad all-reduces.
    config.no_sync_func = None
    config.grad_sync_func = None
    config.param_sync_func = None
    config.finalize_model_grads_func = _finalize_model_grads
    share = cfg.share_embeddings if cfg.share_embeddings is not None else cfg.pp == 1
    if share and cfg.pp > 1:
        raise ValueError("tied embeddings with pp > 1 need CUDA in megatron-core; untie them")
    chunks: list[torch.nn.Module] = []
    for i in range(cfg.vpp or 1):
        vp_stage = i if cfg.vpp is not None else None
        model = GPTModel(
            config=config,
            transformer_layer_spec=_layer_spec(cfg, config, vp_stage),
            vocab_size=cfg.vocab_size,
            max_sequence_length=cfg.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(
                ignore_virtual=False, vp_stage=vp_stage
            ),
            post_process=parallel_state.is_pipeline_last_stage(
                ignore_virtual=False, vp_stage=vp_stage
            ),
            share_embeddings_and_output_weights=share,
            position_embedding_type="learned_absolute",
            vp_stage=vp_stage,
        )
        if cfg.grad_buffer:
            for param in model.parameters():
                param.grad = torch.zeros_like(param)
        chunks.append(model)
    return chunks


def build_optimizer(chunks: Sequence[torch.nn.Module], cfg: TinyGPTConfig) -> torch.optim.Optimizer:
    """Plain torch optimizer over all chunks (Megatron's DDP / DistributedOptimizer need CUDA)."""
    params = [p for chunk in chunks for p in chunk.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.Adam(params, lr=cfg.lr)
