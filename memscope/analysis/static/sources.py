"""Where a :class:`~.config.TrainingSpec` comes from: Megatron args, FlagScale YAML, JSON.

Megatron's argument names are the lingua franca: a FlagScale training YAML is its
``system``/``model``/``data`` sections merged (as the FlagScale runner does before turning
them into ``--flags``), and the original MemScope JSON config is flattened through a few
aliases. Every problem is a ``ValueError`` that names the field.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from memscope.analysis.static.config import (
    DTYPE_BYTES,
    UNSUPPORTED,
    ModelSpec,
    ParallelSpec,
    PrecisionSpec,
    TrainingSpec,
    padded_vocab_size,
)
from memscope.analysis.static.flagscale_checks import (
    apply_hetero,
    entrypoint_refusal,
    eval_layer_pattern,
    megatron_defaults,
    refuse_non_gpt,
)


def _get(src: Any, name: str, default: Any = None) -> Any:
    value = src.get(name, default) if isinstance(src, dict) else getattr(src, name, default)
    return default if value is None else value


def _int(src: Any, name: str, default: Any = None, field: str | None = None) -> Any:
    """``src.name`` as an int (``default`` when absent); a placeholder raises naming it."""
    value = _get(src, name, default)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    try:
        return int(str(value))
    except ValueError:
        hint = ""
        if "${" in str(value):
            hint = " (an OmegaConf interpolation the experiment config resolves: give the value)"
        raise ValueError(f"{field or name}: expected an integer, got {value!r}{hint}") from None


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or str(value).strip().lstrip("-").isdigit()


def _vocab(args: Any, tp: int, vocab_size: int | None) -> int:
    """The padded vocabulary: ``padded_vocab_size``, else ``vocab_size`` (or the caller's,
    for a tokenizer-defined vocabulary) padded as Megatron does."""
    padded = _int(args, "padded_vocab_size")
    if padded is not None:
        return int(padded)
    raw = _get(args, "vocab_size")
    if raw is None or not _is_int(raw):
        if vocab_size is None:
            given = f" (the config has the placeholder {raw!r})" if raw is not None else ""
            raise ValueError(
                f"model.vocab_size: not given{given}; the tokenizer defines it -- pass "
                "--vocab-size (vocab_size=) with the tokenizer's unpadded vocabulary size"
            )
        raw = vocab_size
    divisible = _int(args, "make_vocab_size_divisible_by", 128)
    for stage_tp, _ in _stage_meshes(args) or ():  # hetero: every stage's tp must divide it
        tp = math.lcm(tp, stage_tp)
    return padded_vocab_size(int(raw), divisible, tp) if _get(args, "pad_vocab", True) else int(raw)


def _moe_pattern(args: Any, num_layers: int) -> tuple[int, ...] | None:
    """Megatron's ``moe_layer_freq``: N (one MoE layer every N, from layer 0), ``"N"``, or a
    list / list expression with one 0 (dense) or 1 (MoE) per layer."""
    if not _get(args, "num_experts"):
        return None
    freq = _get(args, "moe_layer_freq", 1)
    if isinstance(freq, str) and "[" in freq:
        freq = eval_layer_pattern(freq)
    if isinstance(freq, (list, tuple)):
        return tuple(int(x) for x in freq)
    n = _int({"moe_layer_freq": freq}, "moe_layer_freq")
    if n < 1:
        raise ValueError(f"moe_layer_freq: must be >= 1, got {n}")
    return tuple(1 if i % n == 0 else 0 for i in range(num_layers))


def _expert_fields(args: Any, num_layers: int) -> dict[str, Any]:
    """ModelSpec's MoE, MLA and MTP fields from Megatron's argument names."""
    out: dict[str, Any] = dict(
        num_experts=_int(args, "num_experts"),
        moe_ffn_hidden_size=_int(args, "moe_ffn_hidden_size"),
        moe_shared_expert_intermediate_size=_int(args, "moe_shared_expert_intermediate_size"),
        moe_layer_pattern=_moe_pattern(args, num_layers),
        moe_router_topk=_int(args, "moe_router_topk", 2),
        moe_grouped_gemm=bool(_get(args, "moe_grouped_gemm", False)),
        moe_router_enable_expert_bias=bool(_get(args, "moe_router_enable_expert_bias", False)),
        multi_latent_attention=bool(_get(args, "multi_latent_attention", False)),
        q_lora_rank=_int(args, "q_lora_rank"),
        kv_lora_rank=_int(args, "kv_lora_rank", 32),
        qk_head_dim=_int(args, "qk_head_dim", 128),
        qk_pos_emb_head_dim=_int(args, "qk_pos_emb_head_dim", 64),
        v_head_dim=_int(args, "v_head_dim", 128),
        mtp_num_layers=_int(args, "mtp_num_layers") or None,
        transformer_impl=str(_get(args, "transformer_impl", "local")),
    )
    if not out["num_experts"]:
        out.update(num_experts=None, moe_ffn_hidden_size=None)
        out["moe_shared_expert_intermediate_size"] = None
    return out


def _data_parallel(args: Any, tp: int, pp: int, cp: int, ep: int, etp: int) -> int:
    """``data_parallel_size``, else world / (tp pp cp); else the least that EP allows
    (tp x cp x dp must be a multiple of etp x ep), 1 without experts."""
    dp = _int(args, "data_parallel_size")
    if dp:
        return int(dp)
    world = _int(args, "world_size")
    if world:
        return int(world) // (tp * pp * cp)
    dp = 1
    while (tp * cp * dp) % (etp * ep):
        dp += 1
    return dp


def _position_embedding(args: Any) -> str:
    kind = str(_get(args, "position_embedding_type", "learned_absolute"))
    if _get(args, "use_rotary_position_embeddings", False) or kind in ("mrope", "yarn"):
        kind = "rope"  # rotary variants have no parameters
    if _get(args, "no_position_embedding", False) and kind == "learned_absolute":
        kind = "none"
    return kind


def spec_from_megatron_args(args: Any, vocab_size: int | None = None) -> TrainingSpec:
    """From a Megatron args namespace (or a dict with the same underscore keys).

    ``vocab_size`` (unpadded) is used when the source has none (tokenizer-defined vocab).
    """
    for name, what in UNSUPPORTED.items():
        if _get(args, name):
            raise ValueError(f"{name}: {what} are not supported by the static estimator")
    tp = _int(args, "tensor_model_parallel_size", 1)
    vocab = _vocab(args, tp, vocab_size)
    num_layers = _int(args, "num_layers", 0, "model.num_layers")
    seq = _int(args, "seq_length", None, "model.seq_length")
    if seq is None:
        raise ValueError("model.seq_length is required")
    bf16, fp16 = bool(_get(args, "bf16", False)), bool(_get(args, "fp16", False))
    if bf16 and fp16:
        raise ValueError("precision: bf16 and fp16 are both set")
    dtype = "bfloat16" if bf16 else "float16" if fp16 else "float32"
    groups = _int(args, "num_query_groups") if _get(args, "group_query_attention", True) else None
    model = ModelSpec(
        num_layers=num_layers,
        hidden_size=_int(args, "hidden_size", 0, "model.hidden_size"),
        num_attention_heads=_int(args, "num_attention_heads", 0, "model.num_attention_heads"),
        vocab_size=int(vocab),
        seq_length=int(seq),
        num_query_groups=groups,
        ffn_hidden_size=_int(args, "ffn_hidden_size"),
        kv_channels=_int(args, "kv_channels"),
        max_position_embeddings=_int(args, "max_position_embeddings"),
        gated_linear_unit=bool(_get(args, "swiglu", False)),
        add_bias_linear=not bool(_get(args, "disable_bias_linear", False))
        and bool(_get(args, "add_bias_linear", True)),
        add_qkv_bias=bool(_get(args, "add_qkv_bias", False)),
        qk_layernorm=bool(_get(args, "qk_layernorm", False)),
        normalization=str(_get(args, "normalization", "LayerNorm")),
        position_embedding_type=_position_embedding(args),
        tie_embeddings=not bool(_get(args, "untie_embeddings_and_output_weights", False)),
        hidden_dropout=float(_get(args, "hidden_dropout", 0.1)),
        attention_dropout=float(_get(args, "attention_dropout", 0.1)),
        **_expert_fields(args, num_layers),
    )
    pp = _int(args, "pipeline_model_parallel_size", 1)
    cp = _int(args, "context_parallel_size", 1)
    ep = _int(args, "expert_model_parallel_size", 1)
    etp = _int(args, "expert_tensor_parallel_size")
    dp = _data_parallel(args, tp, pp, cp, ep, etp or tp)
    vpp = _int(args, "virtual_pipeline_model_parallel_size")
    per_vstage = _int(args, "num_layers_per_virtual_pipeline_stage")
    if vpp is None and per_vstage:
        vpp = model.num_layers // (pp * per_vstage)
    parallel = ParallelSpec(
        tp=tp,
        pp=pp,
        dp=int(dp),
        cp=cp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        sequence_parallel=bool(_get(args, "sequence_parallel", False)) and tp > 1,
        first_stage_layers=_int(args, "decoder_first_pipeline_num_layers"),
        last_stage_layers=_int(args, "decoder_last_pipeline_num_layers"),
        stage_layers=_int_tuple(args, "hetero_stage_layers"),
        stage_meshes=_stage_meshes(args),
    )
    precision = PrecisionSpec(
        params_dtype=dtype,
        grads_in_fp32=bf16 or bool(_get(args, "accumulate_allreduce_grads_in_fp32", False)),
        optimizer=str(_get(args, "optimizer", "adam")),
        distributed_optimizer=bool(_get(args, "use_distributed_optimizer", False)),
        torch_optimizer=bool(_get(args, "torch_optimizer", False)),
        sgd_momentum=float(_get(args, "sgd_momentum", 0.9)) > 0,
    )
    mbs = _int(args, "micro_batch_size", 1)
    gbs = _int(args, "global_batch_size")
    microbatches = gbs // (mbs * parallel.dp) if gbs else _int(args, "num_microbatches", 1)
    recompute = _get(args, "recompute_granularity")
    method = str(_get(args, "recompute_method", "uniform"))
    recompute_layers = _int(args, "recompute_num_layers", 1)
    backend = str(_get(args, "attention_backend", "auto")).split(".")[-1]
    flash = bool(_get(args, "use_flash_attn", False)) or backend in ("flash", "fused")
    if _get(args, "transformer_impl") == "transformer_engine" and backend == "auto":
        flash = True  # Transformer Engine picks a fused kernel
    return TrainingSpec(
        model,
        parallel,
        precision,
        micro_batch_size=mbs,
        num_microbatches=max(1, microbatches),
        recompute=recompute,
        recompute_method=method,
        recompute_num_layers=recompute_layers,
        flash_attention=flash,
    ).validate()


def spec_from_flagscale_yaml(config: dict[str, Any], vocab_size: int | None = None) -> TrainingSpec:
    """From a FlagScale training YAML (its ``system``/``model``/``data`` sections merged).

    The merged keys get Megatron's argument defaults (:func:`.megatron_defaults`); a YAML for
    a model other than ``GPTModel`` is refused, heterogeneous meshes are resolved."""
    merged: dict[str, Any] = {}
    for section in ("system", "model", "data"):
        part = config.get(section) or {}
        if not isinstance(part, dict):
            raise ValueError(f"{section} must be a mapping in a FlagScale training YAML")
        for key, value in _flatten(part).items():
            merged[key.replace("-", "_")] = value
    if not merged:
        raise ValueError("no system/model/data sections: not a FlagScale training YAML")
    refuse_non_gpt(merged)
    megatron_defaults(merged)
    apply_hetero(merged)
    return spec_from_megatron_args(merged, vocab_size)


# The original MemScope JSON config's names (and common synonyms) -> Megatron arg names.
JSON_ALIASES = {
    "num_heads": "num_attention_heads",
    "n_heads": "num_attention_heads",
    "num_kv_heads": "num_query_groups",
    "n_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "seq_len": "seq_length",
    "sequence_length": "seq_length",
    "batch_size": "micro_batch_size",
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "dp": "data_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
}


def spec_from_json_config(config: dict[str, Any], vocab_size: int | None = None) -> TrainingSpec:
    """From the original MemScope JSON config: sections flattened, aliases and ``dtype``."""
    flat = {JSON_ALIASES.get(k, k): v for k, v in _flatten(config).items()}
    dtype = flat.pop("dtype", None)
    if dtype is not None:
        name = str(dtype).lower()
        if name not in DTYPE_BYTES:
            raise ValueError(f"dtype {dtype!r} is unknown; use one of {sorted(set(DTYPE_BYTES))}")
        want = {"bf16": name in ("bf16", "bfloat16"), "fp16": name in ("fp16", "float16")}
        for flag, value in want.items():
            if flat.get(flag) is not None and bool(flat[flag]) != value:
                raise ValueError(f"dtype {dtype!r} contradicts {flag}={flat[flag]!r}")
            flat[flag] = value
    if "model_type" in flat and str(flat["model_type"]).lower() in ("llama", "qwen", "mistral"):
        flat.setdefault("swiglu", True)
        flat.setdefault("normalization", "RMSNorm")
        flat.setdefault("position_embedding_type", "rope")
        flat.setdefault("disable_bias_linear", True)
        flat.setdefault("untie_embeddings_and_output_weights", True)
        flat.setdefault("hidden_dropout", 0.0)  # LLaMA recipes train without dropout
        flat.setdefault("attention_dropout", 0.0)
    return spec_from_megatron_args(flat, vocab_size)


def load_config_file(path: str, vocab_size: int | None = None) -> TrainingSpec:
    """A JSON (original MemScope) or YAML (FlagScale training) config file -> spec."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from None
    if os.path.splitext(path)[1].lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON ({exc.msg}, line {exc.lineno})") from None
        loader = spec_from_json_config
    else:
        import yaml

        refusal = entrypoint_refusal(path)
        if refusal:
            raise ValueError(refusal)

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: invalid YAML ({type(exc).__name__})") from None
        loader = spec_from_flagscale_yaml
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a mapping at the top level")
    return loader(data, vocab_size)


def _flatten(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value))
        else:
            out[key] = value
    return out


def _int_tuple(args: Any, name: str) -> tuple[int, ...] | None:
    value = _get(args, name)
    return None if value is None else tuple(int(v) for v in value)


def _stage_meshes(args: Any) -> tuple[tuple[int, int], ...] | None:
    value = _get(args, "hetero_stage_meshes")
    return None if value is None else tuple((int(tp), int(dp)) for tp, dp in value)
