"""Checks of a training config before the estimator runs.

Three kinds of findings:

* a **refusal**: a ``ValueError`` whose one-line message names the field (wrong type, a size
  that is zero or negative, a contradiction Megatron itself would assert, a size beyond what
  the estimator can list in reasonable time);
* a **warning** (:class:`ConfigWarning`, through :mod:`warnings`): the config is estimated,
  but something in it is suspicious -- an absurd size, a key the estimator does not read (with
  the nearest key it does). ``memscope analyze-static`` prints each as one line;
* the value itself, converted: :func:`as_int`, :func:`as_float`, :func:`as_bool`,
  :func:`as_str` turn what a JSON/YAML file or a Megatron namespace holds into the type the
  spec needs, or refuse naming the field.
"""

from __future__ import annotations

import difflib
import functools
import math
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from memscope.analysis.static.distillation import KD_KEYS
from memscope.analysis.static.fp8 import QUANT_KEYS

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec

MAX_INT = 2**63 - 1  # what a Megatron (torch int64) size can hold
# Sizes the estimator can list in reasonable time (refused beyond): the report lists every
# global rank and every parameter tensor of every (tp, pp) position.
MAX_LAYERS = 4096  # about 20x the deepest published model
MAX_WORLD_SIZE = 1 << 20
MAX_PARAM_TENSORS = 2_000_000  # parameter tensors over all (tp, pp) positions
# Above these a size is legal but absurd for a real model (a warning, the estimate is made).
SANE_MAX = {
    "hidden_size": 1 << 18,
    "ffn_hidden_size": 1 << 21,
    "moe_ffn_hidden_size": 1 << 21,
    "num_attention_heads": 1 << 12,
    "kv_channels": 1 << 14,
    "seq_length": 1 << 24,
    "vocab_size": 1 << 23,
    "num_experts": 1 << 14,
    "micro_batch_size": 1 << 14,
}
SANE_PEAK_BYTES = 1 << 50  # 1 PiB on one rank: far beyond any accelerator

# Megatron's store_false flags (megatron/training/arguments.py): the YAML/JSON key a user
# writes (``no_masked_softmax_fusion: true``) -> the argument it clears
NEGATED_FLAGS = {
    "no_masked_softmax_fusion": "masked_softmax_fusion",
    "no_bias_gelu_fusion": "bias_gelu_fusion",
    "no_bias_swiglu_fusion": "bias_swiglu_fusion",
    "no_gradient_accumulation_fusion": "gradient_accumulation_fusion",
    "no_rope_fusion": "apply_rope_fusion",
}
# Megatron argument names (and the JSON config's own) that the estimator reads.
READ_KEYS = frozenset(NEGATED_FLAGS) | frozenset(
    [
        "account_for_embedding_in_pipeline_split",
        "cpu_offloading",
        "cpu_offloading_activations",
        "cpu_offloading_num_layers",
        "cpu_offloading_weights",
        "exp_avg_dtype",
        "exp_avg_sq_dtype",
        "grad_reduce_in_bf16",
        "main_grads_dtype",
        "megatron_fsdp_main_grads_dtype",
        "main_params_dtype",
        "moe_layer_recompute",
        "muon_tp_mode",
        "data_parallel_sharding_strategy",
        "use_custom_fsdp",
        "use_megatron_fsdp",
        "use_torch_fsdp2",
        "fine_grained_activation_offloading",
        "offload_modules",
        "min_offloaded_tensor_size",
        "optimizer_cpu_offload",
        "optimizer_offload_fraction",
        "recompute_activations",
        "recompute_modules",
        "store_param_remainders",
        "use_precision_aware_optimizer",
        "account_for_loss_in_pipeline_split",
        "accumulate_allreduce_grads_in_fp32",
        "add_bias_linear",
        "add_qkv_bias",
        "apply_rope_fusion",
        "apply_query_key_layer_scaling",
        "attention_backend",
        "attention_dropout",
        "attention_softmax_in_fp32",
        "bf16",
        "bias_gelu_fusion",
        "bias_swiglu_fusion",
        "context_parallel_size",
        "cp_comm_type",
        "cross_entropy_fusion_impl",
        "cross_entropy_loss_fusion",
        "data_parallel_size",
        "decoder_first_pipeline_num_layers",
        "decoder_last_pipeline_num_layers",
        "defer_embedding_wgrad_compute",
        "disable_bias_linear",
        "enable_hetero",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "expert_tensor_parallel_size_per_process_mesh",
        "ffn_hidden_size",
        "fp16",
        "global_batch_size",
        "gradient_accumulation_fusion",
        "group_query_attention",
        "hetero_pipeline_layer_split",
        "hetero_process_meshes",
        "hidden_dim_multiplier",
        "hidden_dropout",
        "hidden_size",
        "kv_channels",
        "kv_lora_rank",
        "make_vocab_size_divisible_by",
        "masked_softmax_fusion",
        "max_position_embeddings",
        "micro_batch_size",
        "microbatch_group_size_per_vp_stage",
        "moe_aux_loss_coeff",
        "moe_expert_capacity_factor",
        "moe_ffn_hidden_size",
        "moe_grouped_gemm",
        "moe_layer_freq",
        "moe_pad_expert_input_to_capacity",
        "moe_permute_fusion",
        "moe_router_dtype",
        "moe_router_load_balancing_type",
        "moe_router_score_function",
        "moe_router_enable_expert_bias",
        "moe_router_topk",
        "moe_token_dispatcher_type",
        "moe_token_imbalance",
        "moe_z_loss_coeff",
        "moe_shared_expert_intermediate_size",
        "moe_shared_expert_overlap",
        "moe_use_legacy_grouped_gemm",
        "mtp_num_layers",
        "multi_latent_attention",
        "multiple_of",
        "overlap_moe_expert_parallel_comm",
        "no_position_embedding",
        "normalization",
        "num_attention_heads",
        "num_distributed_optimizer_instances",
        "num_experts",
        "num_layers",
        "num_layers_per_virtual_pipeline_stage",
        "num_virtual_stages_per_pipeline_rank",
        "num_microbatches",
        "num_query_groups",
        "optimizer",
        "pad_vocab",
        "padded_vocab_size",
        "pipeline_model_parallel_layout",
        "pipeline_model_parallel_size",
        "position_embedding_type",
        "q_lora_rank",
        "qk_head_dim",
        "qk_layernorm",
        "qk_pos_emb_head_dim",
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "seq_length",
        "sequence_parallel",
        "sgd_momentum",
        "swiglu",
        "tensor_model_parallel_size",
        "torch_optimizer",
        "transformer_impl",
        "untie_embeddings_and_output_weights",
        "use_distributed_optimizer",
        "use_flash_attn",
        "use_rotary_position_embeddings",
        "v_head_dim",
        "virtual_pipeline_model_parallel_size",
        "vocab_size",
        "wgrad_deferral_limit",
        "world_size",
    ]
)
READ_KEYS |= QUANT_KEYS | KD_KEYS  # fp8.py, distillation.py
# Real Megatron-LM / FlagScale 0.8.0 arguments (megatron/training/arguments.py,
# flagscale/train/arguments.py) that look like a key above: never reported as misspelled.
MEGATRON_LOOKALIKES = frozenset(
    [
        "add_position_embedding",
        "model_parallel_size",
        "moe_router_group_topk",
        "moe_z_loss_coeff",
        "vocab_file",
    ]
)
YAML_TYPO_CUTOFF = 0.85  # FlagScale YAMLs hold hundreds of Megatron keys we do not read

# Megatron argument -> the field as the spec and the docs call it (for messages).
LABELS = {
    "tensor_model_parallel_size": "parallel.tp",
    "pipeline_model_parallel_size": "parallel.pp",
    "data_parallel_size": "parallel.dp",
    "context_parallel_size": "parallel.cp",
    "expert_model_parallel_size": "parallel.ep",
    "expert_tensor_parallel_size": "parallel.etp",
    "virtual_pipeline_model_parallel_size": "parallel.vpp",
}


class ConfigWarning(UserWarning):
    """Something in the config is suspicious; the estimate is still made."""


def warn(message: str) -> None:
    """Emit one :class:`ConfigWarning` (one line)."""
    warnings.warn(ConfigWarning(message), stacklevel=3)


def label(name: str) -> str:
    """``parallel.tp (tensor_model_parallel_size)`` for a Megatron name that has a spec
    field, the name itself otherwise."""
    return f"{LABELS[name]} ({name})" if name in LABELS else name


def show(value: Any) -> str:
    """A short, one-line, always-printable description of ``value``."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**30 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple, set)):
        return "a list"
    if isinstance(value, float):
        return repr(value)
    try:
        text = repr(value)
    except Exception:  # any object: describe its type instead
        return type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def as_int(value: Any, field: str, minimum: int | None = None) -> int:
    """``value`` as an integer (ints and digit strings; not bools, floats or containers)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{field}: expected an integer, got {show(value)}")
    if isinstance(value, int):
        number = value
    else:
        try:
            number = int(value.strip())
        except ValueError:
            hint = ""
            if "${" in value:
                hint = (
                    " (an OmegaConf interpolation the experiment config resolves: give the value)"
                )
            raise ValueError(f"{field}: expected an integer, got {show(value)}{hint}") from None
    if abs(number) > MAX_INT:
        raise ValueError(f"{field}: {show(number)} does not fit a 64-bit integer")
    if minimum is not None and number < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {number}")
    return number


def as_float(value: Any, field: str, low: float | None = None, high: float | None = None) -> float:
    """``value`` as a finite float in ``[low, high]`` (numbers and numeric strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field}: expected a number, got {show(value)}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{field}: expected a number, got {show(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{field}: expected a finite number, got {show(value)}")
    if (low is not None and number < low) or (high is not None and number > high):
        span = f"[{low:g}, {high:g}]" if low is not None and high is not None else (
            f">= {low:g}" if low is not None else f"<= {high:g}")  # fmt: skip
        raise ValueError(f"{field} must be in {span}, got {number:g}")
    return number


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def as_bool(value: Any, field: str) -> bool:
    """``value`` as a flag: a bool, 0/1, or ``true``/``false`` spelled out."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{field}: expected true or false, got {show(value)}")


def as_str(value: Any, field: str) -> str:
    """``value`` as a name (a string, or an enum member such as Megatron's AttnBackend)."""
    if isinstance(value, (bool, int, float, list, tuple, dict, set)) or value is None:
        raise ValueError(f"{field}: expected a name (a string), got {show(value)}")
    return str(value)


def as_int_list(value: Any, field: str) -> list[int]:
    """A list of integers (``[2, 1, 1]``)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{field}: expected a list of integers, got {show(value)}")
    if len(value) > MAX_LAYERS * 5:
        raise ValueError(f"{field}: {len(value)} entries, more than any real job has")
    return [as_int(v, field) for v in value]


# ---------------------------------------------------------------------------------------------
# Unknown keys


@functools.cache
def memscope_keys() -> frozenset[str]:
    """MemScope's own settings as a training config spells them (``memscope`` and
    ``memscope_<setting>``, :mod:`memscope.config`): the tracer reads them, the estimator
    has no use for them, so they are neither unused nor unknown."""
    from memscope.config import runtime_settings

    return frozenset({"memscope", *(s.dest for s in runtime_settings())})


def memscope_key_warnings(keys: Iterable[str]) -> list[str]:
    """One warning per ``memscope*`` key that is no MemScope setting (a typo the tracer
    would also not know), with the nearest setting."""
    known = sorted(memscope_keys())
    out = []
    for key in keys:
        if key.startswith("memscope") and key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            out.append(f"config key {key!r} is not a MemScope setting (ignored){hint}")
    return out


def unknown_key_warnings(keys: Iterable[str], known: Iterable[str], yaml: bool) -> list[str]:
    """One warning per key the estimator does not read.

    JSON (``yaml=False``): every unknown key, with the nearest known key when one is close.
    FlagScale YAML: only a key that is very close to a memory-relevant key we read and is no
    Megatron argument we know of (most YAML keys are Megatron's and simply not ours)."""
    known = sorted(set(known) | memscope_keys())
    out = memscope_key_warnings(keys)
    for key in keys:
        if key in known or key.startswith("memscope"):
            continue
        if yaml:
            if key in MEGATRON_LOOKALIKES:
                continue
            near = difflib.get_close_matches(key, known, n=1, cutoff=YAML_TYPO_CUTOFF)
            if near:
                out.append(
                    f"config key {key!r} is not a Megatron argument the estimator reads; did "
                    f"you mean {near[0]!r}? (ignored)"
                )
            continue
        near = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        out.append(f"config key {key!r} is not read by the static estimator (ignored){hint}")
    return out


# ---------------------------------------------------------------------------------------------
# The spec as a whole


def check_sizes(spec: TrainingSpec) -> None:
    """Sizes that must be positive (those ``validate`` does not already check), dropout
    probabilities, the layer count the estimator lists."""
    m, p = spec.model, spec.parallel
    for name in ("num_query_groups", "ffn_hidden_size", "kv_channels", "max_position_embeddings"):
        value = getattr(m, name)
        if value is not None and value < 1:
            raise ValueError(f"model.{name} must be positive, got {value}")
    if m.num_layers > MAX_LAYERS:
        raise ValueError(
            f"model.num_layers ({m.num_layers}) is beyond the {MAX_LAYERS} layers the static "
            "estimator lists"
        )
    for name in ("hidden_dropout", "attention_dropout"):
        value = getattr(m, name)
        if not 0.0 <= value <= 1.0:  # also false for nan
            raise ValueError(f"model.{name} must be in [0, 1], got {value}")
    if p.vpp is not None and p.vpp < 1:
        raise ValueError(f"parallel.vpp must be >= 1, got {p.vpp}")
    for tp, dp in p.stage_meshes or ():
        if tp < 1 or dp < 1:
            raise ValueError(f"parallel.stage_meshes: tp and dp must be >= 1, got ({tp}, {dp})")


def check_sharding(spec: TrainingSpec) -> None:
    """Widths Megatron's parallel linear layers and context parallelism split (megatron-core
    ``tensor_parallel.layers`` divides a sharded width by tp; Megatron's ``validate_args``
    wants the sequence split in 2 x cp chunks)."""
    m, p = spec.model, spec.parallel
    for tp in sorted({p.tp} | {tp for tp, _ in p.stage_meshes or ()}):
        if m.ffn % tp:
            raise ValueError(
                f"parallel.tp ({tp}) must divide model.ffn_hidden_size ({m.ffn}) "
                "(megatron-core shards the MLP over tp)"
            )
        if p.sequence_parallel and m.seq_length % tp:
            raise ValueError(
                f"parallel.tp ({tp}) must divide model.seq_length ({m.seq_length}) with "
                "sequence parallelism"
            )
    if p.cp > 1 and m.seq_length % (2 * p.cp):
        raise ValueError(
            f"model.seq_length ({m.seq_length}) must be a multiple of 2 x parallel.cp "
            f"({2 * p.cp}) (Megatron's load-balanced context parallelism)"
        )


def check_scale(spec: TrainingSpec) -> None:
    """Refuse what the estimator cannot list in reasonable time; warn about absurd sizes."""
    m, p = spec.model, spec.parallel
    world = p.world_size
    if world > MAX_WORLD_SIZE:
        raise ValueError(
            f"parallel: world size {world} (tp x pp x cp x dp) is beyond the {MAX_WORLD_SIZE} "
            "ranks the static report lists"
        )
    local_experts = (m.num_experts or 0) // max(p.ep, 1)
    per_layer = 16 + 3 * (0 if m.moe_grouped_gemm else local_experts)
    tensors = sum(p.stage_sizes(s)[0] for s in range(p.pp)) * (
        -(-m.num_layers // p.pp) * per_layer + 16
    )
    if tensors > MAX_PARAM_TENSORS:
        raise ValueError(
            f"model.num_layers x num_experts / parallel.ep x tp x pp: about {tensors:,} parameter "
            f"tensors to list, beyond the static estimator's {MAX_PARAM_TENSORS:,}"
        )
    values = {
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn,
        "num_attention_heads": m.num_attention_heads,
        "kv_channels": m.head_dim,
        "seq_length": m.seq_length,
        "vocab_size": m.vocab_size,
        "num_experts": m.num_experts or 0,
        "moe_ffn_hidden_size": m.moe_ffn if m.num_experts else 0,
        "micro_batch_size": spec.micro_batch_size,
    }
    for name, value in values.items():
        if value > SANE_MAX[name]:
            where = "training" if name == "micro_batch_size" else "model"
            warn(
                f"{where}.{name} ({value:,}) is larger than any real model's "
                f"(> {SANE_MAX[name]:,}); check the config"
            )


def peak_warnings(peak_bytes: int, rank: int) -> list[str]:
    """A warning when one rank's estimated peak is beyond any device's memory."""
    if peak_bytes <= SANE_PEAK_BYTES:
        return []
    pib = peak_bytes / SANE_PEAK_BYTES if peak_bytes < 1 << 1000 else math.inf
    return [
        f"the estimated peak of rank {rank} is {pib:,.3g} PiB, beyond any accelerator's "
        "memory: check the model sizes and the parallel layout"
    ]


def check_batch(gbs: int | None, mbs: int, dp: int, microbatches: int | None) -> int:
    """The number of microbatches: ``global_batch_size / (micro_batch_size x dp)``, which
    Megatron requires to be a whole number >= 1 (megatron-core
    ``num_microbatches_calculator.ConstantNumMicroBatchesCalculator``), else
    ``num_microbatches``."""
    if mbs < 1:
        raise ValueError(f"training.micro_batch_size must be >= 1, got {mbs}")
    if gbs is None:
        count = 1 if microbatches is None else microbatches
        if count < 1:
            raise ValueError(f"training.num_microbatches must be >= 1, got {count}")
        return count
    if gbs < 1:
        raise ValueError(f"training.global_batch_size must be >= 1, got {gbs}")
    if gbs % (mbs * dp):
        raise ValueError(
            f"training.global_batch_size ({gbs}) must be a multiple of micro_batch_size x "
            f"parallel.dp ({mbs} x {dp})"
        )
    return gbs // (mbs * dp)


# ---------------------------------------------------------------------------------------------
# Reading a config file: bounded size, regular files only, YAML without alias bombs

MAX_CONFIG_BYTES = 4 << 20  # a training config is a few KiB
MAX_NESTING = 16  # mapping levels in a config
MAX_YAML_ALIASES = 32  # FlagScale's training YAMLs use none
MAX_YAML_NODES = 100_000  # after alias expansion


def read_config_text(path: str) -> str:
    """The UTF-8 text of ``path``: a regular file of at most :data:`MAX_CONFIG_BYTES`
    (a FIFO, a device such as ``/dev/zero`` or a directory is refused before reading)."""
    from memscope.events.bounded_input import InputRefused, read_regular

    try:
        data = read_regular(path, MAX_CONFIG_BYTES)
    except InputRefused as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None


class YamlRefusal(ValueError):
    """A YAML document the reader refuses (alias bomb, non-string key)."""


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with limits: at most :data:`MAX_YAML_ALIASES` aliases and
    :data:`MAX_YAML_NODES` nodes once they are expanded, no recursive aliases, string keys
    only. Raises :class:`YamlRefusal` or ``yaml.YAMLError``."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    line = self.peek_event().start_mark.line + 1
                    raise YamlRefusal(
                        f"YAML line {line}: more than {MAX_YAML_ALIASES} aliases (*name); "
                        "write the values out"
                    )
            return super().compose_node(parent, index)

        def compose_document(self) -> Any:
            node = super().compose_document()
            _expanded_size(node, {}, set())
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            mapping = super().construct_mapping(node, deep=deep)
            for key in mapping:
                if not isinstance(key, str):
                    raise YamlRefusal(
                        f"YAML line {node.start_mark.line + 1}: key {show(key)} is not a "
                        "string (quote it)"
                    )
            return mapping

    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _expanded_size(node: Any, sizes: dict[int, int], active: set[int]) -> int:
    """Nodes of ``node`` with every alias expanded; refuses past :data:`MAX_YAML_NODES` and
    recursive aliases (memoised: a shared node is counted once per use, computed once)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in active:
        raise YamlRefusal(f"YAML line {node.start_mark.line + 1}: a recursive alias")
    active.add(key)
    total = 1
    if isinstance(node.value, list):
        for item in node.value:
            for child in item if isinstance(item, tuple) else (item,):
                total += _expanded_size(child, sizes, active)
                if total > MAX_YAML_NODES:
                    raise YamlRefusal(
                        f"YAML line {node.start_mark.line + 1}: more than {MAX_YAML_NODES:,} "
                        "values once its aliases are expanded"
                    )
    active.discard(key)
    sizes[key] = total
    return total
