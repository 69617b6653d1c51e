"""Placeholder weight gradients that Transformer Engine caches for the whole run.

With ``gradient_accumulation_fusion`` a linear layer's backward writes its weight gradient
straight into the parameter's ``main_grad`` and hands autograd a placeholder instead, so that
the gradient hooks still fire. Megatron's DDP (and Megatron-FSDP) give every parameter the
``grad_added_to_main_grad`` attribute that selects this path (megatron/core/distributed/
distributed_data_parallel.py, megatron_fsdp/megatron_fsdp.py). The placeholder comes from
Transformer Engine's ``get_dummy_wgrad`` (transformer_engine/pytorch/module/base.py), which
keeps one ``torch.empty(shape, dtype)`` per ``(shape, dtype)`` in the module-global
``_dummy_wgrads`` and never frees it (NVIDIA/TransformerEngine#1651, ba5dc5dde, first in
v2.3 and cherry-picked into v2.2.1; before, each backward allocated a fresh one that the DDP
hook's ``param.grad = None`` freed). So from the first backward on, one tensor per distinct
weight shape stays allocated:

- **Transformer Engine's linear layers** (``Linear``, ``LayerNormLinear``: module/linear.py,
  layernorm_linear.py; ``GroupedLinear``, each per expert weight, only from v2.10,
  NVIDIA/TransformerEngine#2305, before which it allocated a fresh one): with
  ``transformer_impl`` ``transformer_engine`` every linear of the layers, the MLA
  projections, shared experts, grouped experts (``TEGroupedMLP``) and MTP's ``eh_proj``;
  keyed by the weight's shape and dtype.
- **Megatron's own linear layers** (megatron/core/tensor_parallel/layers.py
  ``LinearWithGradAccumulationAndAsyncCommunication.backward``: ``get_dummy_wgrad(
  list(weight.main_grad.shape), input.dtype)`` whenever Transformer Engine imports, from
  Megatron-LM e7c55de99e, first in core_v0.14.0rc4, :data:`.megatron_versions.
  MEGATRON_DUMMY_WGRAD`): the output layer always (also its tied use of the word embedding),
  and with the local spec every linear of the layers (``SequentialMLP`` experts per expert;
  the legacy ``GroupedMLP`` runs its own grouped GEMM and has no placeholder). Keyed by the
  shape and the activations' dtype, the parameters' under mixed precision: the same entries
  as Transformer Engine's when shapes agree.

The router's gating GEMM, the embeddings, norms and biases take ordinary gradients. Assumed,
as elsewhere in these estimates: Transformer Engine is installed (Megatron-LM's containers
pin it) at :data:`.workspaces.ASSUMED_TE` unless the spec names the release, or says none
is installed (:data:`.workspaces.TE_NOT_INSTALLED`: then Megatron allocates a fresh
placeholder each time). Not checked on CPU: Transformer Engine needs CUDA.

Known limitations: the placeholders are counted from the start of the run, although each
appears at the first backward of its shape (the first step's forward does not hold them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memscope.analysis.static.config import chunk_layer_counts, chunk_roles
from memscope.analysis.static.megatron_versions import (
    MEGATRON_DUMMY_WGRAD,
    at_least,
    legacy_grouped_mlp,
)
from memscope.analysis.static.workspaces import te_release_at_least

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec
    from memscope.analysis.static.params import ParamTensor

# NVIDIA/TransformerEngine#1651 (ba5dc5dde, 2025-04-08): the placeholder cache, first in v2.3
# and cherry-picked into v2.2.1 (d0c452ccf)
TE_DUMMY_WGRAD_CACHE = (2, 2, 1)
# NVIDIA/TransformerEngine#2305 (d2945c6a57): GroupedLinear takes it too, first in v2.10
TE_GROUPED_DUMMY_WGRAD = (2, 10)
_GROUPED_EXPERTS = (".experts.weight1", ".experts.weight2")


def _through_megatron(spec: TrainingSpec, t: ParamTensor) -> bool:
    """Whether Megatron's own linear layer computes ``t``'s weight gradient (else one of
    Transformer Engine's)."""
    return t.name.rsplit(".", 2)[-2] == "output_layer" or spec.model.transformer_impl == "local"


def dummy_wgrad_bytes(spec: TrainingSpec, params: list[ParamTensor], pp_rank: int) -> int:
    """Bytes of the placeholder weight gradients Transformer Engine caches on the rank of
    pipeline stage ``pp_rank`` holding ``params`` (:func:`.params.rank_params`): one per
    distinct ``(shape, dtype)`` among the weights whose linear layers take that path."""
    if spec.device != "cuda" or not spec.gradient_accumulation_fusion:
        return 0
    if not te_release_at_least(spec.transformer_engine_version, TE_DUMMY_WGRAD_CACHE):
        return 0
    m, p = spec.model, spec.parallel
    megatron_placeholders = at_least(m, MEGATRON_DUMMY_WGRAD)
    # TEGroupedMLP's GroupedLinear (the legacy GroupedMLP runs its own grouped GEMM: none)
    grouped = not legacy_grouped_mlp(m) and te_release_at_least(
        spec.transformer_engine_version, TE_GROUPED_DUMMY_WGRAD
    )
    shapes: set[tuple[int, int]] = set()
    for t in params:
        if t.linear is None:
            continue
        if t.name.endswith(_GROUPED_EXPERTS) and not grouped:
            continue
        if _through_megatron(spec, t) and not megatron_placeholders:
            continue
        shapes.add(t.linear)
    # a tied output layer on the embedding's stage runs on the word embedding's weight
    if m.tie_embeddings and megatron_placeholders:
        for chunk in range(len(chunk_layer_counts(m, p, pp_rank))):
            roles = chunk_roles(m, p, pp_rank, chunk)
            if roles.loss and roles.first:
                shapes.add((m.vocab_size // p.tp, m.hidden_size))
    return sum(rows * cols for rows, cols in shapes) * spec.precision.param_bytes


def dummy_wgrad_terms(
    spec: TrainingSpec, params: list[ParamTensor], pp_rank: int
) -> dict[str, int]:
    """The placeholder gradients as a fixed term (empty when there are none)."""
    nbytes = dummy_wgrad_bytes(spec, params, pp_rank)
    return {"te_dummy_wgrads": nbytes} if nbytes else {}
