"""What Megatron-LM refuses for Megatron-FSDP and torch FSDP2 (megatron/training/arguments.py
``validate_args``), raised as ``ValueError`` naming the setting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memscope.analysis.static.fsdp import FSDP_STRATEGIES

if TYPE_CHECKING:
    from memscope.analysis.static.config import TrainingSpec


def validate_fsdp(spec: TrainingSpec) -> None:
    p, prec, m = spec.parallel, spec.precision, spec.model
    if spec.fsdp is not None and spec.fsdp not in FSDP_STRATEGIES:
        raise ValueError(
            f"data_parallel_sharding_strategy must be one of {', '.join(FSDP_STRATEGIES)}, "
            f"got {spec.fsdp!r}"
        )
    if spec.fsdp is not None and spec.torch_fsdp2:
        raise ValueError("use_megatron_fsdp and use_torch_fsdp2 are exclusive")
    if spec.fsdp is not None and prec.optimizer not in ("adam", "sgd"):
        raise ValueError(f"Megatron-FSDP does not support the {prec.optimizer} optimizer")
    if not spec.torch_fsdp2:
        return
    refused = {
        "pipeline parallelism (pp > 1)": p.pp > 1,
        "expert parallelism (ep > 1)": p.ep > 1,
        "use_distributed_optimizer": prec.distributed_optimizer,
        "gradient_accumulation_fusion": spec.gradient_accumulation_fusion,
        "tied embeddings (set untie_embeddings_and_output_weights)": m.tie_embeddings,
        "fp16": prec.params_dtype in ("float16", "fp16"),
    }
    for what, bad in refused.items():
        if bad:
            raise ValueError(f"use_torch_fsdp2 does not support {what} (Megatron-LM arguments.py)")
