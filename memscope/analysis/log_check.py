"""A past run's printed memory, explained by the static estimator (``memscope analyze-log``).

For one rank that printed ``report_memory``, :func:`check_rank` places it in Megatron's grid
(:func:`grid_position`), estimates the moment the line was printed at and compares. The
moment matters: Adam's ``exp_avg`` / ``exp_avg_sq`` (torch.optim / apex / TE ``FusedAdam``
create them in ``step()`` on first use, ``_init_group`` / ``state`` initialisation) exist only
after the first optimizer step that was not skipped by the loss scaler (Megatron's
``MixedPrecisionOptimizer.step`` returns before ``optimizer.step()`` on found inf). So a line
printed after 0 real steps never saw them, and after exactly 1 (the last iteration's) its
forward/backward high-water mark ran without them. :func:`check_oom` explains an
out-of-memory message and sizes the remedies against the failing rank's measured bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from memscope.analysis.static.config import STATE_DTYPE_BYTES, TrainingSpec
from memscope.analysis.static.estimator import RankEstimate, estimate_rank, position_of_rank
from memscope.analysis.static.params import RankPosition
from memscope.analysis.static.planner import ESTIMATE_UNCERTAINTY
from memscope.analysis.static.remedies import rank_remedies
from memscope.analysis.static.terms import adam_bytes_per_param
from memscope.analysis.unlogged_settings import UNLOGGED_SETTINGS, UnloggedSetting

MIB = 2**20
#: What explaining a run may raise: the readers' and estimator's one-line ValueError, and a
#: safety net for values no check foresaw (as inputs/megatron_args.py keeps one).
UNEXPLAINED = (ValueError, ArithmeticError, LookupError, TypeError)
#: megatron/core/parallel_state.py ``initialize_model_parallel(order=...)`` default.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def grid_position(spec: TrainingSpec, rank: int, order: str = DEFAULT_ORDER) -> dict[str, int]:
    """Global ``rank`` -> its tp/cp/dp/pp ranks and its ep rank, as megatron-core's
    ``RankGenerator`` numbers them: the first name of ``order`` varies fastest; the dense grid
    has ep = 1 and the expert grid (etp, ep, expert dp, pp) drops cp
    (parallel_state.py: ``decoder_rank_generator`` / ``expert_decoder_rank_generator``)."""
    p = spec.parallel
    if not 0 <= rank < p.world_size:
        raise ValueError(f"rank {rank} is outside the world size {p.world_size}")
    names = order.split("-")
    if p.stage_meshes is not None:  # FlagScale hetero meshes: stage blocks, tp fastest
        pos = position_of_rank(spec, rank)
        return {"tp": pos.tp_rank, "pp": pos.pp_rank}
    dense = {"tp": p.tp, "cp": p.cp, "ep": 1, "dp": p.dp, "pp": p.pp}
    out = _decompose(rank, names, dense)
    expert = {"tp": p.expert_tp, "cp": 1, "ep": p.ep, "dp": p.expert_dp, "pp": p.pp}
    out["ep"] = _decompose(rank, names, expert)["ep"]
    return out


def grid_text(grid: dict[str, int] | None) -> str:
    """A grid place in words, ``tp0 cp0 ep0 dp1 pp0`` (``unknown`` without one)."""
    return " ".join(f"{k}{v}" for k, v in grid.items()) if grid else "unknown"


def _decompose(rank: int, names: list[str], sizes: dict[str, int]) -> dict[str, int]:
    out = {}
    for name in names:
        out[name] = rank % sizes[name]
        rank //= sizes[name]
    return out


def lazy_optimizer_bytes(spec: TrainingSpec, est: RankEstimate) -> int:
    """The part of the rank's optimizer term created at the first real step: Adam's two
    moments (the fp32 main parameters are made when the optimizer is built:
    distrib_optimizer.py ``_build_model_and_main_param_groups``), or SGD's momentum buffer."""
    prec, total = spec.precision, est.persistent.optimizer_bytes
    if total <= 0:
        return 0
    if prec.optimizer == "adam":
        moments = STATE_DTYPE_BYTES[prec.exp_avg_dtype] + STATE_DTYPE_BYTES[prec.exp_avg_sq_dtype]
        if prec.optimizer_cpu_offload or not prec.precision_aware:
            moments = 8
        return total * moments // adam_bytes_per_param(prec)
    per_param = (4 if prec.sgd_momentum else 0) + (4 if prec.mixed_precision else 0)
    return total * 4 // per_param if prec.sgd_momentum and per_param else 0


@dataclass(frozen=True)
class Moment:
    """What existed when the line was printed."""

    optimizer_steps: int  # real (not skipped) optimizer steps up to the line
    label: str
    peak_bytes: int  # the estimator's max allocated up to that moment
    allocated_bytes: int  # and what stays allocated after that iteration
    missing: dict[str, int]  # terms not yet allocated, bytes


def moment_estimate(spec: TrainingSpec, est: RankEstimate, steps: int) -> Moment:
    """The estimate for a line printed after ``steps`` real optimizer steps."""
    lazy = lazy_optimizer_bytes(spec, est)
    ws = est.workspace_bytes
    steady = est.steady_bytes
    if steps >= 2 or lazy == 0:
        return Moment(steps, "steady state", est.peak_memory_bytes, steady, {})
    before = est.persistent.total_bytes - lazy + ws  # persistent without the moments
    fwd_bwd = before + est.activations.total_bytes
    if steps == 1:  # the moments appear at the last iteration's step, after its backward
        step = est.persistent.total_bytes + ws + est.activations.buffer_bytes
        step += est.optimizer_step_bytes + est.post_step_bytes
        return Moment(1, "first real optimizer step: forward/backward before the moments "
                      "existed", max(fwd_bwd, step), steady, {})  # fmt: skip
    step = before + est.activations.buffer_bytes + est.post_step_bytes
    return Moment(0, "no real optimizer step yet: the optimizer moments do not exist",
                  max(fwd_bwd, step), steady - lazy, {"optimizer_moments": lazy})  # fmt: skip


def optimizer_steps(iteration: int, iterations: list[tuple[int, int]]) -> tuple[int, str]:
    """Real optimizer steps up to ``iteration``: minus the skipped counts of the iteration
    lines (each counts its own log interval) printed up to it."""
    covered = [(i, s) for i, s in iterations if i <= iteration]
    if not covered:
        return iteration, "no iteration line up to it: no skipped iteration assumed"
    skipped = sum(s for _, s in covered)
    note = "" if covered[-1][0] == iteration else (
        f"iteration lines only up to {covered[-1][0]}: later skips unknown")  # fmt: skip
    return max(0, iteration - skipped), note


def _terms(est: RankEstimate) -> dict[str, int]:
    return {
        "weights": est.persistent.weight_bytes,
        "gradients": est.persistent.grad_bytes,
        "optimizer_state": est.persistent.optimizer_bytes,
        "activations": est.activations.total_bytes,
        "global_buffer": est.activations.buffer_bytes,
        "optimizer_step_temporaries": est.optimizer_step_bytes,
        "fp32_grad_copies": est.post_step_bytes,
        "workspaces": est.workspace_bytes,
    }


class Status(str, Enum):
    """Where a measurement falls against the estimate."""

    WITHIN_BAND = "within_band"
    ABOVE = "above"
    BELOW = "below"


@dataclass(frozen=True)
class Verdict:
    """A measurement against its estimate: within the estimator's band, or above/below by
    ``error_bytes``; the single terms too small to account for the gap (``cannot_explain``)
    and those that could (``could_explain``)."""

    status: Status
    error_bytes: int
    error_ratio: float | None
    could_explain: tuple[str, ...]
    cannot_explain: tuple[str, ...]
    band: float = ESTIMATE_UNCERTAINTY

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "band": self.band,
            "error_bytes": self.error_bytes,
            "error_ratio": self.error_ratio,
            "could_explain": list(self.could_explain),
            "cannot_explain": list(self.cannot_explain),
        }


def verdict(measured: int, predicted: int, terms: dict[str, int]) -> Verdict:
    """``measured`` against ``predicted``, the gap weighed against each term of ``terms``."""
    gap = measured - predicted
    ratio = gap / predicted if predicted else None
    if ratio is not None and abs(ratio) <= ESTIMATE_UNCERTAINTY:
        return Verdict(Status.WITHIN_BAND, gap, ratio, (), ())
    big = tuple(sorted(k for k, v in terms.items() if v >= abs(gap)))
    small = tuple(sorted(k for k in terms if k not in big))
    return Verdict(Status.ABOVE if gap > 0 else Status.BELOW, gap, ratio, big, small)


def explained_if(
    spec: TrainingSpec,
    position: RankPosition,
    steps: int,
    measured: int,
    unlogged: tuple[UnloggedSetting, ...] = (),
) -> list[dict[str, Any]]:
    """The settings the log cannot show (:data:`.unlogged_settings.UNLOGGED_SETTINGS` and this
    run's ``unlogged``: each older release its arguments block dates it to whose terms
    differ) under which ``measured`` falls within the estimator's band, each with its
    estimate. An alternative the estimator cannot estimate is left out."""
    out = []
    for setting in (*UNLOGGED_SETTINGS, *unlogged):
        changed = setting.apply(spec)
        if changed is None:
            continue
        try:
            est = estimate_rank(changed, position)
        except UNEXPLAINED:
            continue
        predicted = moment_estimate(changed, est, steps).peak_bytes
        judged = verdict(measured, predicted, _terms(est))
        if judged.status is Status.WITHIN_BAND:
            out.append(
                {
                    "setting": setting.name,
                    "why": setting.why,
                    "max_allocated_bytes": predicted,
                    "error_ratio": judged.error_ratio,
                }
            )
    return out


def check_rank(
    spec: TrainingSpec,
    rank: int,
    measured_mb: dict[str, float],
    iteration: int,
    steps: int,
    order: str = DEFAULT_ORDER,
    unlogged: tuple[UnloggedSetting, ...] = (),
) -> dict[str, Any]:
    """One memory line explained: grid place, measured, estimate by term, verdict (with the
    run's own ``unlogged`` alternatives besides the general ones, :func:`explained_if`)."""
    grid = grid_position(spec, rank, order)
    position = RankPosition(tp_rank=grid["tp"], pp_rank=grid["pp"])
    est = estimate_rank(spec, position)
    moment = moment_estimate(spec, est, steps)
    measured = {k: round(v * MIB) for k, v in measured_mb.items()}
    terms = _terms(est)
    terms.update({k: -v for k, v in moment.missing.items()})
    return {
        "rank": rank,
        "grid": grid,
        "place": grid_text(grid),
        "iteration": iteration,
        "optimizer_steps": steps,
        "moment": moment.label,
        "measured": measured,
        "estimate": {
            "max_allocated_bytes": moment.peak_bytes,
            "allocated_bytes": moment.allocated_bytes,
            "steady_peak_bytes": est.peak_memory_bytes,
            "peak_stage": est.peak_stage,
            "terms": terms,
            "not_yet_allocated": dict(moment.missing),
        },
        "verdict": _judged(spec, position, steps, measured["max_allocated"], moment, est, unlogged),
        "allocated_verdict": verdict(
            measured["allocated"], moment.allocated_bytes, _terms(est)
        ).to_dict(),
    }


def _judged(
    spec: TrainingSpec,
    position: RankPosition,
    steps: int,
    measured: int,
    moment: Moment,
    est: RankEstimate,
    unlogged: tuple[UnloggedSetting, ...],
) -> dict[str, Any]:
    """The max-allocated verdict, with the unlogged settings that would explain a miss."""
    judged = verdict(measured, moment.peak_bytes, _terms(est))
    out = judged.to_dict()
    if judged.status is not Status.WITHIN_BAND:
        out["explained_if"] = explained_if(spec, position, steps, measured, unlogged)
    return out


def check_oom(
    spec: TrainingSpec,
    rank: int | None,
    sizes: dict[str, int | None],
    steps: int,
    order: str = DEFAULT_ORDER,
) -> dict[str, Any]:
    """An out-of-memory message explained: the failing rank's estimate, its fragmentation
    and the planner's remedies, each judged against what that rank measured."""
    if rank is not None:
        grid: dict[str, int] | None = grid_position(spec, rank, order)
        assert grid is not None
        position = RankPosition(tp_rank=grid["tp"], pp_rank=grid["pp"])
    else:  # a message without the rank: the estimator's worst position
        grid = None
        position = max(
            (RankPosition(t, s) for s in range(spec.parallel.pp)
             for t in range(spec.parallel.stage_sizes(s)[0])),
            key=lambda pos: estimate_rank(spec, pos).peak_memory_bytes,
        )  # fmt: skip
    est = estimate_rank(spec, position)
    moment = moment_estimate(spec, est, steps)  # ``steps`` real optimizer steps before it
    requested, free = sizes.get("requested"), sizes.get("free")
    allocated, cached = sizes.get("allocated"), sizes.get("reserved_unallocated")
    capacity = None  # what PyTorch could have held: its own bytes plus the device's free
    if allocated is not None and free is not None:
        capacity = allocated + (cached or 0) + free
    need = max(moment.peak_bytes, (allocated or 0) + (requested or 0))
    fragmented = cached is not None and requested is not None and cached >= requested
    remedies = []
    for remedy in rank_remedies(spec, position):
        row = remedy.to_dict()
        row["projected_need_bytes"] = need - remedy.saving_bytes
        row["fits"] = capacity is not None and need - remedy.saving_bytes <= capacity
        remedies.append(row)
    return {
        "rank": rank,
        "grid": grid,
        "position": {"tp_rank": position.tp_rank, "pp_rank": position.pp_rank},
        "sizes": dict(sizes),
        "fragmentation": {
            "reserved_unallocated_bytes": cached,
            "could_have_served_the_request": fragmented,
            "advice": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the cached "
            "segments serve it"
            if fragmented
            else "",
        },
        "optimizer_steps": steps,
        "moment": moment.label,
        "estimate": {
            "peak_bytes": moment.peak_bytes,
            "steady_peak_bytes": est.peak_memory_bytes,
            "terms": _terms(est),
            "not_yet_allocated": dict(moment.missing),
        },
        "need_bytes": need,
        "capacity_bytes": capacity,
        "remedies": remedies,
    }
