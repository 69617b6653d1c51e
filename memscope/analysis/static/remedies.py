"""What to change so that a rank fits: candidate settings, each estimated for this rank.

Every remedy is a change of the training settings that Megatron supports, estimated by the
same per-rank estimator as the run itself (:func:`.estimate_rank`), so its predicted peak
follows the terms Megatron allocates (selective recompute drops the attention core's saved
tensors, full recompute keeps one input per layer, the distributed optimizer shards the
optimizer state over data-parallel ranks, a smaller micro-batch scales activations, one
more pipeline stage moves layers away). Remedies that change the parallel layout are
judged by the worst rank of the new layout, since a rank's position moves with it.
Those that save nothing are left out; the rest are ranked by the planner's step-time model
(:class:`.CostModel`), cheapest first, then by predicted saving. Which of them fit the memory
that ran out is decided where that capacity is known (:func:`fitting_remedies`, used by the
OOM report), allowing for the estimator's band (:data:`.ESTIMATE_UNCERTAINTY`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.estimator import estimate_all_ranks, estimate_rank
from memscope.analysis.static.params import RankPosition
from memscope.analysis.static.planner import ESTIMATE_UNCERTAINTY, CostModel
from memscope.analysis.static.spec_checks import validate_spec


@dataclass(frozen=True)
class Remedy:
    """One change of settings and what the estimator predicts for it."""

    name: str
    flags: str  # Megatron-LM command-line flags
    args: dict[str, Any]  # the same as Megatron args (FlagScale's YAML keys)
    predicted_peak_bytes: int
    saving_bytes: int
    note: str = ""
    step_time: float | None = None  # the planner's step-time factor with this change

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "flags": self.flags,
            "args": dict(self.args),
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "saving_bytes": self.saving_bytes,
            "note": self.note,
            "step_time": self.step_time,
        }


#: (name, flags, args, the changed spec, whether the parallel layout changes).
Candidate = tuple[str, str, dict[str, Any], TrainingSpec, bool]


def _candidates(spec: TrainingSpec) -> Iterator[Candidate]:
    p, r = spec.parallel, dataclasses.replace
    if spec.recompute is None:
        yield (
            "selective recompute of the attention core",
            "--recompute-granularity selective",
            {"recompute_granularity": "selective"},
            r(spec, recompute="selective"),
            False,
        )
    if spec.recompute != "full":
        yield (
            "full recompute, one layer per checkpoint",
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
            {"recompute_granularity": "full", "recompute_method": "uniform",
             "recompute_num_layers": 1},
            r(spec, recompute="full", recompute_method="uniform", recompute_num_layers=1),
            False,
        )  # fmt: skip
    if p.dp > 1 and not spec.precision.distributed_optimizer:
        yield ("distributed optimizer", "--use-distributed-optimizer",
               {"use_distributed_optimizer": True},
               r(spec, precision=r(spec.precision, distributed_optimizer=True)), False)  # fmt: skip
    if spec.micro_batch_size > 1:
        half = spec.micro_batch_size // 2
        yield (f"micro-batch size {half}", f"--micro-batch-size {half}",
               {"micro_batch_size": half},
               r(spec, micro_batch_size=half, num_microbatches=spec.num_microbatches * 2),
               False)  # fmt: skip
    if p.tp > 1 and not p.sequence_parallel:
        yield ("sequence parallelism", "--sequence-parallel", {"sequence_parallel": True},
               r(spec, parallel=r(p, sequence_parallel=True)), False)  # fmt: skip
    stages = p.pp + 1
    if (
        p.dp % stages == 0
        and spec.model.num_layers % (stages * (p.vpp or 1)) == 0
        and not (p.stage_layers or p.first_stage_layers or p.last_stage_layers or p.layout)
    ):
        yield (f"{stages} pipeline stages", f"--pipeline-model-parallel-size {stages}",
               {"pipeline_model_parallel_size": stages},
               r(spec, parallel=r(p, pp=stages, dp=p.dp * p.pp // stages)), True)  # fmt: skip


def rank_remedies(
    spec: TrainingSpec,
    position: RankPosition,
    estimate: Callable[[TrainingSpec, RankPosition], int] | None = None,
) -> list[Remedy]:
    """The remedies for the rank at ``position`` that lower its predicted peak, cheapest
    by the planner's step-time model first (then the largest saving)."""
    peak = _peak if estimate is None else estimate
    now = peak(spec, position)
    cost = CostModel()
    out = []
    for name, flags, args, changed, relayout in _candidates(spec):
        try:
            after = _worst(changed) if relayout else peak(changed, position)
            step_time = round(cost.breakdown(validate_spec(changed))["total"], 6)
        except ValueError:
            continue  # a combination the estimator does not support
        if after < now:
            note = "worst rank of the new layout" if relayout else ""
            out.append(Remedy(name, flags, args, after, now - after, note, step_time))
    return sorted(out, key=lambda r: (r.step_time, -r.saving_bytes))


def fitting_remedies(
    remedies: list[dict[str, Any]], capacity: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kept, dropped): the remedies (as :meth:`Remedy.to_dict` gives them) whose predicted
    peak, raised by the estimator's band, fits ``capacity`` (the memory that ran out), in
    their order; all of them kept when the capacity is unknown."""
    if capacity is None:
        return list(remedies), []
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for r in remedies:
        peak = r.get("predicted_peak_bytes")
        fits = isinstance(peak, int) and peak * (1 + ESTIMATE_UNCERTAINTY) <= capacity
        (kept if fits else dropped).append(r)
    return kept, dropped


def _peak(spec: TrainingSpec, position: RankPosition) -> int:
    return estimate_rank(spec, position).peak_memory_bytes


def _worst(spec: TrainingSpec) -> int:
    return max(e.peak_memory_bytes for e in estimate_all_ranks(spec))
