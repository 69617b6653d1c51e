"""The in-run static estimate: the run's model and args -> spec -> estimate of this rank.

The tracer's ``StaticEstimateProvider`` (``compare_with_static``): the inputs are merged
(:mod:`.inrun`), read into a spec (:mod:`.megatron_args`), and the estimator and the OOM
remedies of :mod:`memscope.analysis.static` work on that spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.estimator import SOURCE, estimate_rank
from memscope.analysis.static.params import RankPosition, layers_per_chunk
from memscope.analysis.static.remedies import rank_remedies
from memscope.inputs.inrun import Disagreement, ModelFacts, chunk_disagreements, inrun_inputs
from memscope.inputs.megatron_args import spec_from_megatron_args


def estimate_for_runtime(
    args: Any,
    parallel: Any,
    device: str = "cuda",
    model: ModelFacts | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``StaticEstimateProvider`` for the runtime tracer (``compare_with_static`` input).

    ``parallel`` is the rank's :class:`~memscope.capture.parallel.ParallelInfo`; its data-
    parallel size overrides the one in ``args``. ``device`` is where the run's tensors live.
    ``model`` (what the attached model says) wins over ``args`` key by key, ``settings`` (a
    trainer's batch sizes and optimizer) fill in what neither gives (:mod:`.inrun`); the
    result says where each input came from and where the model and the args disagree.
    Raises ``ValueError`` when the inputs describe a model the estimator does not support.
    """
    inputs = inrun_inputs(model, args, settings)
    spec = _rank_spec(inputs.values, parallel, device)
    position = RankPosition(
        tp_rank=int(getattr(parallel, "tp_rank", None) or 0),
        pp_rank=int(getattr(parallel, "pp_rank", None) or 0),
    )
    if model is not None:
        extra = _chunk_disagreements(model, spec, position.pp_rank)
        inputs = replace(inputs, disagreements=inputs.disagreements + extra)
    return {**_estimate_section(spec, position), **inputs.to_dict()}


def _rank_spec(values: dict[str, Any], parallel: Any, device: str) -> TrainingSpec:
    """The merged inputs as a spec, with the rank's own data-parallel size and device, and
    the Transformer Engine release installed here (the run's)."""
    spec = spec_from_megatron_args(values)
    dp = max(1, int(getattr(parallel, "dp_size", spec.parallel.dp) or 1))
    return replace(
        spec,
        parallel=replace(spec.parallel, dp=dp),
        device=device,
        transformer_engine_version=installed_transformer_engine(),
    )


def installed_transformer_engine() -> str:
    """The installed Transformer Engine's release (its distribution metadata: nothing is
    imported), or ``TE_NOT_INSTALLED``."""
    from importlib import metadata

    from memscope.analysis.static.workspaces import TE_NOT_INSTALLED

    for name in ("transformer_engine", "transformer_engine_torch"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return TE_NOT_INSTALLED


def _chunk_disagreements(
    model: ModelFacts, spec: TrainingSpec, stage: int
) -> tuple[Disagreement, ...]:
    """Where the model's chunks on this stage differ from the estimator's layer split."""
    expected = tuple(layers_per_chunk(spec, stage))
    return chunk_disagreements(model, expected, stage == 0, stage == spec.parallel.pp - 1)


def _estimate_section(spec: TrainingSpec, position: RankPosition) -> dict[str, Any]:
    """This rank's estimate as the report's static comparison reads it."""
    est = estimate_rank(spec, position)
    return {
        "peak_memory_bytes": est.peak_memory_bytes,
        "components": est.components(),
        "source": SOURCE,
        "peak_stage": est.peak_stage,
        "peak_moment": est.activations.peak_moment,
        # the pipeline schedule's arithmetic (activations.py): (chunk-)microbatches whose
        # saved tensors coexist at the peak, and per virtual chunk
        "in_flight_microbatches": est.activations.in_flight,
        "in_flight_per_chunk": list(est.activations.in_flight_per_chunk),
        # megatron's global memory buffer (activations.py buffer_bytes), inside "activations"
        "buffer_bytes": est.activations.buffer_bytes,
        "remedies": [r.to_dict() for r in rank_remedies(spec, position)],
    }
