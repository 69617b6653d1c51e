"""Megatron args -> the estimator's :class:`~memscope.analysis.static.config.TrainingSpec`.

Megatron's argument names are the lingua franca: a parsed Megatron-LM namespace, or a dict
with the same underscore keys (a FlagScale YAML's merged sections, a flattened MemScope JSON
config: :mod:`.config_files`). :func:`spec_from_megatron_args` reads the model (its
MoE/MLA/MTP fields in :mod:`.moe_args`), the parallel layout (:mod:`.parallel_args`), the
precision and optimizer, and the batch and memory-saving settings, each in its own function
(one argument is read and typed by :mod:`.args_access`); every problem is a one-line
``ValueError`` that names the field.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from memscope._version import package_version
from memscope.analysis.static.config import (
    UNSUPPORTED,
    ModelSpec,
    ParallelSpec,
    PrecisionSpec,
    TrainingSpec,
    padded_vocab_size,
)
from memscope.analysis.static.megatron_versions import (
    MUON_DISTRIBUTED_IS_LAYER_WISE,
    mtp_in_layout,
    release_at_least,
)
from memscope.analysis.static.pipeline_layout import with_mtp_on_last_chunk
from memscope.analysis.static.read_keys import NEGATED_FLAGS
from memscope.analysis.static.spec_checks import validate_spec
from memscope.analysis.static.validation import MAX_LAYERS, check_batch, show
from memscope.inputs.args_access import (
    get,
    get_flag,
    get_float,
    get_int,
    get_name,
    get_size,
    warn_all,
)
from memscope.inputs.distillation_args import distillation_from_args
from memscope.inputs.moe_args import expert_fields
from memscope.inputs.parallel_args import parallel_spec, stage_meshes
from memscope.inputs.quant_args import quant_from_args
from memscope.inputs.rl_args import rl_from_args
from memscope.inputs.values import as_int, as_str


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (
        isinstance(value, str) and value.strip().lstrip("+-").isdigit()
    )


#: Megatron-LM's tokenizer whose vocabulary is ``--vocab-size`` plus one end-of-document token
NULL_TOKENIZER = "NullTokenizer"


def _vocab(args: Any, tp: int, vocab_size: int | None) -> int:
    """The padded vocabulary: ``padded_vocab_size``, else ``vocab_size`` (or the caller's,
    for a tokenizer-defined vocabulary) padded as Megatron does. Megatron-LM's
    ``NullTokenizer`` adds its end-of-document token to ``vocab_size`` (its ``vocab_size``
    property is the given size + 1, ``megatron/training/tokenizer/tokenizer.py``), which the
    padding then starts from: ``--vocab-size 4096`` trains 4224 rows, not 4096."""
    padded = get_int(args, "padded_vocab_size", None, "model.padded_vocab_size")
    if padded is not None:
        return int(padded)
    raw = get(args, "vocab_size")
    if raw is not None and not isinstance(raw, str):
        raw = as_int(raw, "model.vocab_size")  # a string may be a tokenizer placeholder
    if raw is None or not _is_int(raw):
        if vocab_size is None:
            given = f" (the config has the placeholder {show(raw)})" if raw is not None else ""
            raise ValueError(
                f"model.vocab_size: not given{given}; the tokenizer defines it -- pass "
                "--vocab-size (vocab_size=) with the tokenizer's unpadded vocabulary size"
            )
        raw = as_int(vocab_size, "model.vocab_size")
    else:
        raw = as_int(raw, "model.vocab_size")
        if get(args, "tokenizer_type") == NULL_TOKENIZER:
            raw += 1  # its end-of-document token
    divisible = get_size(args, "make_vocab_size_divisible_by", 128)
    for stage_tp, _ in stage_meshes(args) or ():  # hetero: every stage's tp must divide it
        tp = math.lcm(tp, max(stage_tp, 1))
    return padded_vocab_size(raw, divisible, tp) if get_flag(args, "pad_vocab", True) else raw


def _position_embedding(args: Any) -> str:
    kind = get_name(args, "position_embedding_type", "learned_absolute")
    if get_flag(args, "use_rotary_position_embeddings") or kind in ("mrope", "yarn"):
        kind = "rope"  # rotary variants have no parameters
    if get_flag(args, "no_position_embedding") and kind == "learned_absolute":
        kind = "none"
    return kind


def spec_from_megatron_args(
    args: Any,
    vocab_size: int | None = None,
    world_size: int | None = None,
    megatron_core: str | None = None,
) -> TrainingSpec:
    """From a Megatron args namespace (or a dict with the same underscore keys).

    ``vocab_size`` (unpadded) is used when the source has none (tokenizer-defined vocab);
    ``world_size`` (from the launcher: ``--world-size``, nnodes x nproc_per_node, a hostfile)
    when given must agree with the config's own ``world_size``; ``megatron_core`` is the
    release that ran the args where it is not the one installed here (a published run's),
    which the spec follows and is checked against (``analysis/static/megatron_versions.py``).
    """
    args = _negated_flags(_with_launcher_world(args, world_size))
    _refuse_unsupported(args)
    tp = get_size(args, "tensor_model_parallel_size")
    vocab = _vocab(args, tp, vocab_size)
    num_layers, seq = _depth_and_length(args)
    dtype = _params_dtype(args)
    model = _model_spec(args, num_layers, seq, vocab)
    if megatron_core is not None:
        model = replace(model, megatron_core_version=megatron_core)
    parallel = parallel_spec(args, tp, num_layers)
    if parallel.layout is not None and not mtp_in_layout(model):
        layout = with_mtp_on_last_chunk(parallel.layout, model.mtp_num_layers)
        parallel = replace(parallel, layout=layout)
    precision = _precision_spec(args, dtype, model.megatron_core_version)
    spec = _training_spec(args, model, parallel, precision)

    def teacher(base: Any) -> TrainingSpec:  # the same args, the same release
        return spec_from_megatron_args(base, megatron_core=megatron_core)

    kd = distillation_from_args(args, spec, teacher)
    if kd is not None:
        spec = replace(spec, distillation=kd)
    rl = rl_from_args(args, spec.cuda_graph_impl)
    return validate_spec(replace(spec, rl=rl)) if rl is not None else spec


def _with_launcher_world(args: Any, world_size: int | None) -> Any:
    """``args`` with the launcher's world size, which must agree with the config's own."""
    if world_size is None:
        return args
    own = get_int(args, "world_size", None, "parallel.world_size (world_size)")
    if own is not None and own != world_size:
        raise ValueError(
            f"parallel.world_size (world_size) {own} in the config contradicts the "
            f"launcher's world size {world_size}"
        )
    return {**(args if isinstance(args, dict) else vars(args)), "world_size": world_size}


def _refuse_unsupported(args: Any) -> None:
    """A Megatron feature the estimator does not model at all (:data:`.config.UNSUPPORTED`)."""
    for name, what in UNSUPPORTED.items():
        if get(args, name):
            raise ValueError(f"{name}: {what} are not supported by the static estimator")


def _depth_and_length(args: Any) -> tuple[int, int]:
    """(``num_layers``, ``seq_length``): both required; the depth within what the estimator
    lists (checked before any per-layer list is built)."""
    num_layers = get_int(args, "num_layers", None, "model.num_layers")
    seq = get_int(args, "seq_length", None, "model.seq_length")
    for name, value in (("num_layers", num_layers), ("seq_length", seq)):
        if value is None:
            raise ValueError(f"model.{name} is required")
    if num_layers > MAX_LAYERS:
        raise ValueError(
            f"model.num_layers ({num_layers}) is beyond the {MAX_LAYERS} layers the static "
            "estimator lists"
        )
    return int(num_layers), int(seq)


def _params_dtype(args: Any) -> str:
    """The parameter dtype: ``bf16`` / ``fp16`` (not both), else float32."""
    bf16, fp16 = get_flag(args, "bf16"), get_flag(args, "fp16")
    if bf16 and fp16:
        raise ValueError("precision: bf16 and fp16 are both set")
    return "bfloat16" if bf16 else "float16" if fp16 else "float32"


def _model_spec(args: Any, num_layers: int, seq: int, vocab: int) -> ModelSpec:
    """The model's shape, features and fused kernels (megatron/training/arguments.py names)."""
    return ModelSpec(
        num_layers=num_layers,
        hidden_size=get_int(args, "hidden_size", 0, "model.hidden_size"),
        num_attention_heads=get_int(args, "num_attention_heads", 0, "model.num_attention_heads"),
        vocab_size=int(vocab),
        seq_length=seq,
        num_query_groups=_query_groups(args),
        ffn_hidden_size=get_int(args, "ffn_hidden_size", None, "model.ffn_hidden_size"),
        kv_channels=get_int(args, "kv_channels", None, "model.kv_channels"),
        max_position_embeddings=get_int(args, "max_position_embeddings"),
        gated_linear_unit=get_flag(args, "swiglu"),
        add_bias_linear=_bias_linear(args),
        add_qkv_bias=get_flag(args, "add_qkv_bias"),
        qk_layernorm=get_flag(args, "qk_layernorm"),
        normalization=get_name(args, "normalization", "LayerNorm"),
        position_embedding_type=_position_embedding(args),
        rotary_percent=get_float(args, "rotary_percent", 1.0, 0.0, 1.0),
        tie_embeddings=not get_flag(args, "untie_embeddings_and_output_weights"),
        hidden_dropout=get_float(args, "hidden_dropout", 0.1, 0.0, 1.0),
        bias_activation_fusion=_bias_activation_fusion(args),
        masked_softmax_fusion=get_flag(args, "masked_softmax_fusion", True),
        rope_fusion=get_flag(args, "apply_rope_fusion", True),
        # the release that builds the model where the spec is read in the run
        # (analysis/static/megatron_versions.py); None when absent
        megatron_core_version=package_version("megatron-core"),
        attention_softmax_in_fp32=get_flag(args, "attention_softmax_in_fp32")
        or get_flag(args, "apply_query_key_layer_scaling"),
        attention_dropout=get_float(args, "attention_dropout", 0.1, 0.0, 1.0),
        **expert_fields(args, num_layers),
    )


def _query_groups(args: Any) -> int | None:
    """``num_query_groups``, read only with ``group_query_attention`` (Megatron-LM ignores
    the groups otherwise; a dict source without the flag counts as on)."""
    if not get_flag(args, "group_query_attention", True):
        return None
    return get_int(args, "num_query_groups", None, "model.num_query_groups")


def _bias_linear(args: Any) -> bool:
    return not get_flag(args, "disable_bias_linear") and get_flag(args, "add_bias_linear", True)


def _bias_activation_fusion(args: Any) -> bool:
    """megatron/training/arguments.py: the fusions default on (``--no-*-fusion`` turns them
    off); ``bias_gelu_fusion`` is turned off with the biases."""
    if get_flag(args, "swiglu"):
        return get_flag(args, "bias_swiglu_fusion", True)
    return get_flag(args, "bias_gelu_fusion", True) and _bias_linear(args)


def _precision_spec(args: Any, dtype: str, version: str | None) -> PrecisionSpec:
    """Parameter dtype, gradient buffer, optimizer and its state (Megatron-LM names)."""
    savers = _optimizer_savers(args)
    optimizer, distributed = _optimizer(args, version)
    return PrecisionSpec(
        params_dtype=dtype,
        grads_in_fp32=_grads_in_fp32(args, dtype == "bfloat16", savers["main_grads_dtype"]),
        megatron_fsdp_main_grads_dtype=_fsdp_grads_dtype(args),
        **savers,
        optimizer=optimizer,
        distributed_optimizer=distributed,
        torch_optimizer=get_flag(args, "torch_optimizer"),
        distributed_optimizer_instances=get_size(args, "num_distributed_optimizer_instances"),
        sgd_momentum=get_float(args, "sgd_momentum", 0.9, 0.0) > 0,
    )


def _optimizer(args: Any, version: str | None) -> tuple[str, bool]:
    """The optimizer and whether the distributed optimizer shards it, as Megatron-LM's
    ``validate_args`` leaves them. Layer-wise distributed Muon is our ``dist_muon``: spelled so
    up to 0.18; a parsed namespace says ``use_layer_wise_distributed_optimizer``; from 0.19
    (:data:`~memscope.analysis.static.megatron_versions.MUON_DISTRIBUTED_IS_LAYER_WISE`) a
    command line says ``--optimizer muon --use-distributed-optimizer``, which megatron-core
    0.16 refuses (``analysis/static/muon.py`` ``validate_muon``)."""
    name = get_name(args, "optimizer", "adam")
    distributed = get_flag(args, "use_distributed_optimizer")
    if name == "muon":
        translated = distributed and release_at_least(version, MUON_DISTRIBUTED_IS_LAYER_WISE)
        if translated or get_flag(args, "use_layer_wise_distributed_optimizer"):
            return "dist_muon", False
    return name, distributed


def _training_spec(
    args: Any, model: ModelSpec, parallel: ParallelSpec, precision: PrecisionSpec
) -> TrainingSpec:
    """The whole spec: the batch, recompute, kernels and memory savers on top, validated."""
    mbs = get_int(args, "micro_batch_size", 1, "training.micro_batch_size")
    gbs = get_int(args, "global_batch_size", None, "training.global_batch_size")
    microbatches = check_batch(
        gbs, mbs, parallel.dp, get_int(args, "num_microbatches", None, "training.num_microbatches")
    )
    recompute, modules = _recompute(args)
    spec = TrainingSpec(
        model,
        parallel,
        precision,
        micro_batch_size=mbs,
        num_microbatches=microbatches,
        recompute=recompute,
        recompute_method=get_name(args, "recompute_method", "uniform"),
        recompute_num_layers=get_int(args, "recompute_num_layers", 1, "recompute_num_layers"),
        flash_attention=_flash_attention(args, model.transformer_impl),
        cross_entropy=_cross_entropy(args),
        dataloader_attention_mask=get_flag(args, "create_attention_mask_in_dataloader", True),
        defer_embedding_wgrad=get_flag(args, "defer_embedding_wgrad_compute"),
        wgrad_deferral_limit=get_int(args, "wgrad_deferral_limit", 0, "wgrad_deferral_limit"),
        gradient_accumulation_fusion=get_flag(args, "gradient_accumulation_fusion", True),
        tp_comm_overlap=get_flag(args, "tp_comm_overlap"),
        recompute_modules=modules,
        **_activation_offload(args),
        quant=quant_from_args(args, get),
        **_fsdp(args),
        **_fine_grained_offload(args),
        **_cuda_graphs(args),
    )
    return validate_spec(spec)


def _cross_entropy(args: Any) -> str:
    """``unfused``, or with ``cross_entropy_loss_fusion`` its ``cross_entropy_fusion_impl``."""
    if not get_flag(args, "cross_entropy_loss_fusion"):
        return "unfused"
    return get_name(args, "cross_entropy_fusion_impl", "native")


# --main-grads-dtype and friends as Megatron-LM's arguments.py maps them (a parsed namespace
# already holds torch dtypes)
_STATE_DTYPES = {
    "fp32": "fp32", "float32": "fp32", "torch.float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "torch.float16": "fp16",
    "fp8": "fp8", "uint8": "fp8", "torch.uint8": "fp8",
}  # fmt: skip


def _state_dtype(args: Any, name: str) -> str:
    value = get(args, name, "fp32")
    key = str(value).strip().lower()
    if key not in _STATE_DTYPES:
        raise ValueError(f"{name}: {show(value)} is not one of fp32, bf16, fp16, fp8")
    return _STATE_DTYPES[key]


def _optimizer_savers(args: Any) -> dict[str, Any]:
    """PrecisionSpec's precision-aware optimizer and optimizer CPU offload fields
    (megatron/core/optimizer/optimizer_config.py names; Megatron-LM's
    ``--optimizer-offload-fraction`` defaults to 1.0)."""
    return dict(
        precision_aware=get_flag(args, "use_precision_aware_optimizer"),
        muon_tp_mode=get_name(args, "muon_tp_mode", "blockwise"),
        main_grads_dtype=_state_dtype(args, "main_grads_dtype"),
        main_params_dtype=_state_dtype(args, "main_params_dtype"),
        exp_avg_dtype=_state_dtype(args, "exp_avg_dtype"),
        exp_avg_sq_dtype=_state_dtype(args, "exp_avg_sq_dtype"),
        store_param_remainders=get_flag(args, "store_param_remainders", True),
        optimizer_cpu_offload=get_flag(args, "optimizer_cpu_offload"),
        optimizer_offload_fraction=get_float(args, "optimizer_offload_fraction", 1.0, 0.0, 1.0),
        # megatron-core 0.18+ dist_muon (analysis/static/muon.py): Megatron-LM's default on
        layer_wise_param_layout=get_flag(args, "use_layer_wise_param_layout", True),
        overlap_grad_reduce=get_flag(args, "overlap_grad_reduce"),
        ddp_bucket_size=get_int(args, "ddp_bucket_size", None),
    )


def _fsdp_grads_dtype(args: Any) -> str | None:
    """``megatron_fsdp_main_grads_dtype`` (Megatron-LM 0.19 arguments.py): None for ``auto``."""
    value = get(args, "megatron_fsdp_main_grads_dtype")
    if value is None or str(value) == "auto":
        return None
    if str(value) not in ("fp32", "bf16", "fp16"):
        raise ValueError(
            f"megatron_fsdp_main_grads_dtype: one of fp32, bf16, fp16, auto; got {value!r}"
        )
    return str(value)


def _grads_in_fp32(args: Any, bf16: bool, main_grads_dtype: str) -> bool:
    """The DDP gradient buffer's dtype: Megatron-LM's arguments.py under bf16 turns
    ``accumulate_allreduce_grads_in_fp32`` on unless ``grad_reduce_in_bf16`` or
    ``main_grads_dtype`` bf16; training.py passes it to DDP as ``grad_reduce_in_fp32``
    (megatron/core/distributed/distributed_data_parallel.py: ``grad_dtype = torch.float if
    grad_reduce_in_fp32 else param.dtype``)."""
    if get_flag(args, "accumulate_allreduce_grads_in_fp32"):
        if main_grads_dtype != "fp32":
            raise ValueError(
                "main_grads_dtype can only be fp32 with accumulate_allreduce_grads_in_fp32"
            )
        return True
    return bf16 and main_grads_dtype == "fp32" and not get_flag(args, "grad_reduce_in_bf16")


def _recompute(args: Any) -> tuple[str | None, tuple[str, ...]]:
    """(recompute_granularity, recompute_modules): ``recompute_activations`` and
    ``moe_layer_recompute`` are Megatron's older spellings of selective recompute (of the
    default ``core_attn``, and adding ``moe``; megatron-core TransformerConfig)."""
    recompute = get(args, "recompute_granularity")
    if recompute is not None:
        recompute = as_str(recompute, "training.recompute_granularity")
    if recompute is None and get_flag(args, "recompute_activations"):
        recompute = "selective"
    raw = get(args, "recompute_modules")
    if raw is None:
        modules = ["core_attn"]
    elif isinstance(raw, (list, tuple)):
        modules = [as_str(v, "recompute_modules") for v in raw]
    else:
        modules = as_str(raw, "recompute_modules").replace(",", " ").split()
    if get_flag(args, "moe_layer_recompute"):
        if recompute == "full":
            raise ValueError("moe_layer_recompute cannot be combined with full recompute")
        recompute = "selective"
        modules += [] if "moe" in modules else ["moe"]
    return recompute, tuple(modules)


def _module_names(raw: Any, field: str) -> tuple[str, ...]:
    """A setting naming modules: a list, or a string of names separated by commas or spaces."""
    if isinstance(raw, str):
        raw = [m for m in raw.replace(",", " ").split() if m]
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"{field}: expected a list of module names, got {show(raw)}")
    return tuple(as_str(m, field) for m in raw)


def _fine_grained_offload(args: Any) -> dict[str, Any]:
    """TrainingSpec's fine-grained activation offloading fields (megatron-core
    ``TransformerConfig`` names; ``offload_modules`` a list or a comma-separated string)."""
    return {
        "fine_grained_offloading": get_flag(args, "fine_grained_activation_offloading"),
        "offload_modules": _module_names(get(args, "offload_modules") or (), "offload_modules"),
        "min_offloaded_tensor_size": get_int(args, "min_offloaded_tensor_size", 1024 * 1024),
    }


def _cuda_graphs(args: Any) -> dict[str, Any]:
    """TrainingSpec's CUDA-graph fields: ``cuda_graph_impl`` (megatron-core 0.16 on; before,
    ``external_cuda_graph`` meant Transformer Engine's graphs and ``enable_cuda_graph``
    Megatron's own, which ``TransformerConfig.__post_init__`` still maps so), the graphed
    modules (``cuda_graph_modules``, 0.20, or ``cuda_graph_scope``: ``full`` or a string of
    them, 0.15, or a list; ``full``/empty: the whole layer) and ``cuda_graph_warmup_steps``."""
    impl = get_name(args, "cuda_graph_impl", "none")
    if impl == "none" and get_flag(args, "external_cuda_graph"):
        impl = "transformer_engine"
    elif impl == "none" and get_flag(args, "enable_cuda_graph"):
        impl = "local"
    raw = get(args, "cuda_graph_modules") or get(args, "cuda_graph_scope") or ()
    # (a YAML's "[attn mlp]" reaches argparse's nargs='+' as "[attn" and "mlp]")
    modules = [m.strip("[]'\" ") for m in _module_names(raw, "cuda_graph_modules")]
    return {
        "cuda_graph_impl": impl,
        "cuda_graph_modules": tuple(m for m in modules if m and m != "full"),
        "cuda_graph_warmup_steps": get_int(args, "cuda_graph_warmup_steps", 3),
    }


def _fsdp(args: Any) -> dict[str, Any]:
    """TrainingSpec's ``fsdp`` / ``torch_fsdp2`` (Megatron-LM ``--use-megatron-fsdp`` (formerly
    ``--use-custom-fsdp``) with ``--data-parallel-sharding-strategy``, default ``no_shard``;
    ``--use-torch-fsdp2``)."""
    megatron = get_flag(args, "use_megatron_fsdp") or get_flag(args, "use_custom_fsdp")
    strategy = get_name(args, "data_parallel_sharding_strategy", "no_shard") if megatron else None
    return {
        "fsdp": strategy,
        "torch_fsdp2": get_flag(args, "use_torch_fsdp2"),
        "fsdp_overlap_param_gather": get_flag(args, "overlap_param_gather"),
    }


def _activation_offload(args: Any) -> dict[str, Any]:
    """TrainingSpec's ``cpu_offloading*`` fields (megatron/core/model_parallel_config.py).
    Megatron-LM's parser (core_v0.16.1 ``megatron/training/arguments.py``) has no
    ``--cpu-offloading`` flag: ``--cpu-offloading-num-layers N`` with N > 0 turns it on."""
    layers = get_int(args, "cpu_offloading_num_layers", 0)
    return dict(
        cpu_offloading=get_flag(args, "cpu_offloading") or layers > 0,
        cpu_offloading_num_layers=layers,
        cpu_offloading_activations=get_flag(args, "cpu_offloading_activations", True),
        cpu_offloading_weights=get_flag(args, "cpu_offloading_weights"),
    )


def _negated_flags(args: Any) -> Any:
    """``args`` with every ``no_<flag>: true`` turned into ``<flag>: false`` (a dict source;
    a parsed namespace already holds the destinations)."""
    if not isinstance(args, dict) or not any(k in args for k in NEGATED_FLAGS):
        return args
    out = dict(args)
    for key, dest in NEGATED_FLAGS.items():
        if key in out and get_flag(out, key):
            if dest in out and get_flag(out, dest):
                raise ValueError(f"{key} contradicts {dest}: true")
            out[dest] = False
    return out


def _flash_attention(args: Any, impl: str) -> bool:
    """Whether attention runs a flash/fused kernel, as megatron-core picks it.

    Transformer Engine (``TEDotProductAttention``) with ``attention_backend`` ``auto``,
    ``flash`` or ``fused`` runs a fused kernel; ``unfused`` runs TE's unfused path. The local
    spec's ``DotProductAttention`` (megatron/core/transformer/dot_product_attention.py) has
    no flash path: ``use_flash_attn`` does not change it (warned)."""
    backend = get_name(args, "attention_backend", "auto").split(".")[-1]
    if impl == "transformer_engine":
        return backend in ("auto", "flash", "fused")
    if get_flag(args, "use_flash_attn") or backend in ("flash", "fused"):
        warn_all(
            [
                "use_flash_attn / attention_backend flash|fused with transformer_impl local: "
                "megatron-core's local DotProductAttention has no flash path, so attention is "
                "modelled unfused (as it runs)"
            ]
        )
    return False
