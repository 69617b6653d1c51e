"""Typed, validated inputs of the static estimator and their sources.

One :class:`TrainingSpec` (model + parallelism + precision/optimizer + batch) is built from a
Megatron args namespace, a FlagScale training YAML (``system``/``model``/``data`` merged as
the FlagScale runner does) or the original MemScope JSON config. Contradictory or missing
fields raise ``ValueError`` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a Megatron GPT model (before parallel sharding)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int  # already padded as the model sees it
    seq_length: int
    num_query_groups: int | None = None  # None: multi-head attention
    ffn_hidden_size: int | None = None  # None: 4 * hidden_size
    kv_channels: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int | None = None  # None: seq_length
    gated_linear_unit: bool = False  # SwiGLU
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    normalization: str = "LayerNorm"
    position_embedding_type: str = "learned_absolute"
    tie_embeddings: bool = True

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class ParallelSpec:
    """Parallel sizes of the job."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int | None = None
    sequence_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


@dataclass(frozen=True)
class PrecisionSpec:
    """Parameter dtype, gradient accumulation dtype and optimizer."""

    params_dtype: str = "float32"
    grads_in_fp32: bool = False  # Megatron's DDP buffer in fp32 (bf16 training default)
    optimizer: str = "adam"
    distributed_optimizer: bool = False
    sgd_momentum: bool = True
    torch_optimizer: bool = False  # torch.optim (keeps a 4-byte step tensor per param tensor)

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.params_dtype]

    @property
    def mixed_precision(self) -> bool:
        return self.param_bytes < 4


@dataclass(frozen=True)
class TrainingSpec:
    """Everything the estimator reads."""

    model: ModelSpec
    parallel: ParallelSpec
    precision: PrecisionSpec
    micro_batch_size: int = 1
    num_microbatches: int = 1

    def validate(self) -> TrainingSpec:
        m, p, prec = self.model, self.parallel, self.precision
        for name in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "vocab_size",
            "seq_length",
        ):
            if getattr(m, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(m, name)}")
        if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
            raise ValueError(
                f"model.num_attention_heads ({m.num_attention_heads}) must divide "
                f"model.hidden_size ({m.hidden_size})"
            )
        if m.num_attention_heads % m.query_groups:
            raise ValueError(
                f"model.num_query_groups ({m.query_groups}) must divide "
                f"model.num_attention_heads ({m.num_attention_heads})"
            )
        for name in ("tp", "pp", "dp", "cp", "ep"):
            if getattr(p, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1, got {getattr(p, name)}")
        if m.num_attention_heads % p.tp:
            raise ValueError(
                f"parallel.tp ({p.tp}) must divide model.num_attention_heads "
                f"({m.num_attention_heads})"
            )
        if m.query_groups % p.tp:
            raise ValueError(
                f"parallel.tp ({p.tp}) must divide model.num_query_groups ({m.query_groups})"
            )
        if m.vocab_size % p.tp:
            raise ValueError(f"parallel.tp ({p.tp}) must divide model.vocab_size ({m.vocab_size})")
        chunks = p.pp * (p.vpp or 1)
        if m.num_layers % chunks:
            raise ValueError(
                f"parallel.pp x vpp ({chunks}) must divide model.num_layers ({m.num_layers})"
            )
        if p.vpp is not None and p.pp < 2:
            raise ValueError("parallel.vpp needs parallel.pp >= 2")
        if prec.params_dtype not in DTYPE_BYTES:
            raise ValueError(
                f"precision.params_dtype {prec.params_dtype!r} is unknown; use one of "
                f"{sorted(set(DTYPE_BYTES))}"
            )
        if prec.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"precision.optimizer must be one of {OPTIMIZERS}, got {prec.optimizer!r}"
            )
        if m.normalization not in NORMALIZATIONS:
            raise ValueError(f"model.normalization must be one of {NORMALIZATIONS}")
        if m.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ValueError(f"model.position_embedding_type must be one of {POSITION_EMBEDDINGS}")
        return self


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding: up to a multiple of ``divisible_by * tp``."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def _get(src: Any, name: str, default: Any = None) -> Any:
    value = src.get(name, default) if isinstance(src, dict) else getattr(src, name, default)
    return default if value is None else value


def spec_from_megatron_args(args: Any) -> TrainingSpec:
    """From a Megatron args namespace (or a dict with the same underscore keys)."""
    tp = int(_get(args, "tensor_model_parallel_size", 1))
    vocab = _get(args, "padded_vocab_size")
    if vocab is None:
        raw = _get(args, "vocab_size")
        if raw is None:
            raise ValueError("model.vocab_size (or padded_vocab_size) is required")
        divisible = int(_get(args, "make_vocab_size_divisible_by", 128))
        vocab = padded_vocab_size(int(raw), divisible, tp) if _get(args, "pad_vocab", True) else raw
    seq = _get(args, "seq_length")
    if seq is None:
        raise ValueError("model.seq_length is required")
    bf16, fp16 = bool(_get(args, "bf16", False)), bool(_get(args, "fp16", False))
    dtype = "bfloat16" if bf16 else "float16" if fp16 else "float32"
    groups = _get(args, "num_query_groups") if _get(args, "group_query_attention", True) else None
    model = ModelSpec(
        num_layers=int(_get(args, "num_layers", 0)),
        hidden_size=int(_get(args, "hidden_size", 0)),
        num_attention_heads=int(_get(args, "num_attention_heads", 0)),
        vocab_size=int(vocab),
        seq_length=int(seq),
        num_query_groups=groups,
        ffn_hidden_size=_get(args, "ffn_hidden_size"),
        kv_channels=_get(args, "kv_channels"),
        max_position_embeddings=_get(args, "max_position_embeddings"),
        gated_linear_unit=bool(_get(args, "swiglu", False)),
        add_bias_linear=not bool(_get(args, "disable_bias_linear", False))
        and bool(_get(args, "add_bias_linear", True)),
        add_qkv_bias=bool(_get(args, "add_qkv_bias", False)),
        qk_layernorm=bool(_get(args, "qk_layernorm", False)),
        normalization=str(_get(args, "normalization", "LayerNorm")),
        position_embedding_type=str(_get(args, "position_embedding_type", "learned_absolute")),
        tie_embeddings=not bool(_get(args, "untie_embeddings_and_output_weights", False)),
    )
    pp = int(_get(args, "pipeline_model_parallel_size", 1))
    cp = int(_get(args, "context_parallel_size", 1))
    world = _get(args, "world_size")
    dp = _get(args, "data_parallel_size") or (int(world) // (tp * pp * cp) if world else 1)
    parallel = ParallelSpec(
        tp=tp,
        pp=pp,
        dp=int(dp),
        cp=cp,
        ep=int(_get(args, "expert_model_parallel_size", 1)),
        vpp=_get(args, "virtual_pipeline_model_parallel_size"),
        sequence_parallel=bool(_get(args, "sequence_parallel", False)) and tp > 1,
    )
    precision = PrecisionSpec(
        params_dtype=dtype,
        grads_in_fp32=bf16 or bool(_get(args, "accumulate_allreduce_grads_in_fp32", False)),
        optimizer=str(_get(args, "optimizer", "adam")),
        distributed_optimizer=bool(_get(args, "use_distributed_optimizer", False)),
        torch_optimizer=bool(_get(args, "torch_optimizer", False)),
    )
    mbs = int(_get(args, "micro_batch_size", 1))
    gbs = _get(args, "global_batch_size")
    microbatches = (
        int(gbs) // (mbs * parallel.dp) if gbs else int(_get(args, "num_microbatches", 1))
    )
    return TrainingSpec(model, parallel, precision, mbs, max(1, microbatches)).validate()


def spec_from_flagscale_yaml(config: dict[str, Any]) -> TrainingSpec:
    """From a FlagScale training YAML (its ``system``/``model``/``data`` sections merged)."""
    merged: dict[str, Any] = {}
    for section in ("system", "model", "data"):
        part = config.get(section) or {}
        if not isinstance(part, dict):
            raise ValueError(f"{section} must be a mapping in a FlagScale training YAML")
        for key, value in _flatten(part).items():
            merged[key.replace("-", "_")] = value
    if not merged:
        raise ValueError("no system/model/data sections: not a FlagScale training YAML")
    return spec_from_megatron_args(merged)


def _flatten(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value))
        else:
            out[key] = value
    return out
