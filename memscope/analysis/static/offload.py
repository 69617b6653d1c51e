"""Fine-grained activation offloading (``fine_grained_activation_offloading``,
``offload_modules``, ``min_offloaded_tensor_size``): which saved tensors of a layer leave the
GPU, from megatron-core 0.16.1.

Each selected module runs inside ``FineGrainedActivationOffloadingInterface``
(megatron/core/pipeline_parallel/fine_grained_activation_offload.py): every tensor autograd
saves during that module's forward (``on_save_for_backward``) joins the module's group, and
at the group's commit (``bulk_offload_group``) those of at least ``min_offloaded_tensor_size``
elements (``tensor_need_offloading_checker``) are copied to pinned host memory and released;
in the backward the next group is reloaded one ahead (``bulk_reload``). Which groups stay on
the GPU: ``should_bulk_offload`` keeps the last group of each module name of a chunk whose
backward is the next one (``front_backward_chunk``: on the last stage, the chunk whose forward
its backward follows), and ``post_warmup_callback`` marks one group per module name (the last
of the first chunk to run backward) never offloaded. Either way, only the chunk whose backward
runs next holds its last layer's groups; every other in-flight chunk-microbatch has all its
layers on the host (``activations.activation_estimate``), and a chunk at its backward has its
last layer back on the GPU (kept, or reloaded before its first backward layer: in 0.20 the
previous backward's first layer pre-reloads it, ``pre_reload_last_layer``, so under the plain
pipeline schedules it is back through the forward that runs before its backward:
``activations.prereload_forward_steps``). Where the
modules sit: ``attn_norm`` / ``mlp_norm`` (transformer_layer.py: the norms' inputs),
``qkv_linear`` / ``core_attn`` / ``attn_proj`` (attention.py), ``expert_fc1`` / ``moe_act``
(moe/experts.py: :func:`.moe.expert_offload_bytes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec

# transformer_config.py __post_init__'s allowed offload_modules
OFFLOAD_MODULES = (
    "attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"
)  # fmt: skip
# Per module: the items of :func:`.activations.layer_saved` its forward saves, each with the
# number of equally sized tensors in it (for the size threshold); the norms' statistics are
# small and never pass the threshold.
_SAVED_BY: dict[str, tuple[tuple[str, int, float], ...]] = {
    # (item, tensors in the item, share of the item this module saves)
    "attn_norm": (("layer_output", 1, 1.0),),  # the layer's input, the previous output
    "qkv_linear": (("norm_outputs", 2, 0.5),),  # linear_qkv's input
    "core_attn": (
        ("attention_qkv", 3, 1.0),
        ("attention_scores", 1, 1.0),
        ("attention_dropout", 2, 1.0),
        ("attention_softmax_lse", 1, 1.0),
    ),
    "attn_proj": (("attention_context", 1, 1.0),),  # linear_proj's input
    "mlp_norm": (("attention_residual", 1, 1.0),),  # the pre-MLP norm's input
}


def fine_grained_moved(spec: TrainingSpec, items: dict[str, int], element_bytes: int) -> int:
    """Bytes of one layer's saved tensors (``items``, per microbatch) that the selected
    ``offload_modules`` move to the host."""
    moved = 0.0
    for module in spec.offload_modules:
        for item, tensors, share in _SAVED_BY.get(module, ()):
            size = items.get(item, 0) * share
            if size / tensors / element_bytes >= spec.min_offloaded_tensor_size:
                moved += size
    return int(moved)


def reloaded_duplicate(spec: TrainingSpec, saved_twice: int, element_bytes: int) -> int:
    """Bytes a reloaded ``core_attn`` group holds twice at its layer's attention backward.

    ``saved_twice``: one tensor the core attention's forward saves for two autograd nodes
    (the softmax output, kept by the softmax's backward and by the context ``bmm``: see
    :func:`.activations.softmax_output_saved_twice`). Each save reaches
    ``on_save_for_backward`` separately and ``ChunkOffloadHandler.tensor_push`` gives it its
    own tag; ``bulk_offload_group`` copies every tag to its own host buffer and
    ``bulk_reload_group`` / ``reload`` allocate a fresh GPU tensor per tag (megatron-core
    0.16.1 fine_grained_activation_offload.py, and 0.20 at Megatron-LM d98e8a64, whose warmup
    statistics, ``_set_duplicate_storage_info``, count repeated storages without merging
    them: nothing deduplicates). So an
    offloaded layer's backward gets two copies where the forward had one; the ``bmm``'s is
    freed after its backward, the softmax's after the softmax backward, so both are alive
    at the score gradient's high-water mark. A layer whose groups stayed on the GPU keeps the
    single tensor."""
    if not spec.fine_grained_offloading or "core_attn" not in spec.offload_modules:
        return 0
    if saved_twice // element_bytes < spec.min_offloaded_tensor_size:
        return 0  # tensor_need_offloading_checker: stays on the GPU, one tensor
    return saved_twice


def validate_offload(spec: TrainingSpec) -> None:
    """What megatron-core 0.16.1 ``TransformerConfig.__post_init__`` asserts."""
    if not spec.fine_grained_offloading:
        return
    if spec.cpu_offloading:
        raise ValueError("fine_grained_activation_offloading cannot be enabled with cpu_offloading")
    unknown = sorted(set(spec.offload_modules) - set(OFFLOAD_MODULES))
    if not spec.offload_modules or unknown:
        raise ValueError(
            f"offload_modules must name some of {', '.join(OFFLOAD_MODULES)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    if "attn_proj" in spec.offload_modules and "core_attn" not in spec.offload_modules:
        raise ValueError("offload_modules: attn_proj needs core_attn (megatron-core)")
    if spec.min_offloaded_tensor_size < 0:
        raise ValueError("min_offloaded_tensor_size must be >= 0")
