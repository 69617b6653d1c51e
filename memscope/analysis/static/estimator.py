"""Per-rank static memory estimate: exact persistent terms plus modelled activations.

``estimate_rank`` combines the exact parameter inventory (:mod:`.params`), the persistent
terms (:mod:`.terms`) and the activation model (:mod:`.activations`). The peak is the largest
of the forward/backward high-water mark (persistent + in-flight saved tensors + backward
working set + Megatron's global buffer), the optimizer step (persistent + buffer + step
temporaries) and, in the RL loop, the rollout (:mod:`.rl_rollout`). What no formula sees on a
GPU (CUDA context, NCCL buffers, allocator rounding and fragmentation) is a separate
allowance (:mod:`.allowance`), never added here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memscope._version import __version__
from memscope.analysis.static.activations import (
    ActivationEstimate,
    activation_estimate,
    optimizer_step_bytes,
    retained_inputs_bytes,
)
from memscope.analysis.static.config import TrainingSpec, stage_spec
from memscope.analysis.static.cuda_graphs import CudaGraphTerms, cuda_graph_terms
from memscope.analysis.static.distillation import teacher_terms
from memscope.analysis.static.dummy_wgrads import dummy_wgrad_terms
from memscope.analysis.static.fp8 import quantized_weight_terms
from memscope.analysis.static.fsdp import in_flight
from memscope.analysis.static.muon import is_muon, muon_step_bytes
from memscope.analysis.static.params import (
    ParamTensor,
    RankPosition,
    layers_per_chunk,
    rank_params,
)
from memscope.analysis.static.rl import rl_buffer_terms, rl_weight_terms
from memscope.analysis.static.rl_rollout import RolloutTerms, rollout_terms
from memscope.analysis.static.terms import (
    PersistentTerms,
    adam_moment_bytes,
    fp32_grad_copies,
    persistent_terms,
)
from memscope.analysis.static.workspaces import compute_major, workspace_terms

SOURCE = f"memscope static estimator {__version__}"


@dataclass(frozen=True)
class RankEstimate:
    """The estimate for one (tp_rank, pp_rank) position; DP/CP peers are identical."""

    position: RankPosition
    params: list[ParamTensor]
    persistent: PersistentTerms
    activations: ActivationEstimate
    optimizer_step_bytes: int  # optimizer-step temporaries
    # fixed GPU buffers held for the run (cuBLAS and Transformer Engine workspaces, Transformer
    # Engine's placeholder gradients, the RL engine's buffers), by source
    workspaces: dict[str, int]
    post_step_bytes: int = 0  # what the optimizer step leaves until the next zero_grad
    # the last received pipeline input (and its gradient) each model chunk keeps until the
    # next step's forward (activations.retained_inputs_bytes)
    retained_input_bytes: int = 0
    # persistent terms of FP8/FP4 (fp8.py) and distillation (distillation.py), by name; they
    # are already in ``persistent.weight_bytes``
    weight_terms: dict[str, int] = field(default_factory=dict)
    # Megatron-FSDP's parameter all-gather for the next forward, issued after the optimizer
    # step (fsdp.in_flight ``after_step``): between steps only, not at the step's peak
    prefetched_bytes: int = 0
    # Transformer Engine CUDA graphs (cuda_graphs.py): static buffers, the capture, replay
    cuda_graphs: CudaGraphTerms | None = None
    # the RL loop's rollout (rl_rollout.py): the engine's step beside the trainer's state
    rollout: RolloutTerms | None = None

    @property
    def workspace_bytes(self) -> int:
        return sum(self.workspaces.values())

    @property
    def steady_bytes(self) -> int:
        """What stays allocated between steps: persistent terms, fixed workspaces and
        megatron's global buffer (what ``torch.cuda.memory_allocated()`` shows after a step)."""
        return (
            self.persistent.total_bytes
            + self.workspace_bytes
            + self.activations.buffer_bytes
            + self.post_step_bytes
            + self.retained_input_bytes
            + self.prefetched_bytes
            + (self.cuda_graphs.static_bytes if self.cuda_graphs else 0)
        )

    @property
    def _step_transient_bytes(self) -> int:
        """Non-persistent bytes at the optimizer step (buffer, temporaries, grad copies, the
        pipeline inputs the schedule left referenced)."""
        return (
            self.activations.buffer_bytes
            + self.optimizer_step_bytes
            + self.post_step_bytes
            + self.retained_input_bytes
        )

    def _transient_moments(self) -> dict[str, int]:
        """Non-persistent bytes at each candidate high-water mark, by stage name. With CUDA
        graphs (:mod:`.cuda_graphs`): the eager iterations only where they run before the
        capture; the capture (what is not allocated yet counted negative); the replayed
        steps, whose graphed tensors are in the private pool, with the static buffers."""
        moments = self._training_moments()
        if self.rollout is not None:
            # the steady state's own non-persistent bytes stay through the rollout
            between_steps = self.steady_bytes - self.persistent.total_bytes - self.workspace_bytes
            moments["rl_rollout"] = between_steps + self.rollout.transient_bytes
        return moments

    def _training_moments(self) -> dict[str, int]:
        step, forward_backward = self._step_transient_bytes, self.activations.total_bytes
        graphs = self.cuda_graphs
        if graphs is None:
            return {"forward_backward": forward_backward, "optimizer_step": step}
        moments = {
            "forward_backward": forward_backward - graphs.replay_removed_bytes
            + graphs.static_bytes,
            "optimizer_step": step + graphs.static_bytes,
            "cuda_graph_capture": graphs.capture_bytes - graphs.capture_lazy_bytes,
        }  # fmt: skip
        if graphs.eager_warmup:
            moments["forward_backward"] = max(moments["forward_backward"], forward_backward)
            moments["optimizer_step"] = max(moments["optimizer_step"], step)
        return moments

    @property
    def peak_stage(self) -> str:
        """``forward_backward``, ``optimizer_step``, (CUDA graphs) ``cuda_graph_capture`` or
        (the RL loop) ``rl_rollout``: where the high-water mark is (ties: the
        forward/backward)."""
        moments = self._transient_moments()
        return max(moments, key=lambda name: (moments[name], name == "forward_backward"))

    @property
    def transient_bytes(self) -> int:
        """Non-persistent bytes at the peak (activations, working sets, buffers)."""
        return max(self._transient_moments().values())

    @property
    def peak_memory_bytes(self) -> int:
        return self.persistent.total_bytes + self.workspace_bytes + self.transient_bytes

    def components(self) -> dict[str, int]:
        """Bytes per MemScope category at the peak (``compare_with_static`` names)."""
        lazy = 0  # optimizer state a capture before the first step runs without
        if self.cuda_graphs is not None and self.peak_stage == "cuda_graph_capture":
            lazy = self.cuda_graphs.capture_lazy_bytes
        host_grads = kv = 0  # the rollout: what it keeps on the host, the KV buffer it adds
        if self.rollout is not None and self.peak_stage == "rl_rollout":
            lazy = self.rollout.offloaded_optimizer_bytes
            host_grads = self.rollout.offloaded_grad_bytes
            kv = self.rollout.kv_cache_bytes
        return {
            "parameters": self.persistent.weight_bytes,
            "gradients": self.persistent.grad_bytes - host_grads,
            "optimizer_state": self.persistent.optimizer_bytes - lazy,
            "activations": self.transient_bytes + lazy + host_grads - kv,
            "other": self.workspace_bytes + kv,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain summary (no per-tensor list)."""
        return {
            "tp_rank": self.position.tp_rank,
            "pp_rank": self.position.pp_rank,
            "param_count": self.persistent.param_count,
            "param_tensors": len(self.params),
            "components": self.components(),
            "activation_detail": {
                **asdict(self.activations),
                "saved_bytes": self.activations.saved_bytes,
            },
            "optimizer_step_bytes": self.optimizer_step_bytes,
            "workspaces": dict(self.workspaces),
            "steady_bytes": self.steady_bytes,
            "post_step_bytes": self.post_step_bytes,
            "retained_input_bytes": self.retained_input_bytes,
            "prefetched_bytes": self.prefetched_bytes,
            "weight_terms": dict(self.weight_terms),
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_stage": self.peak_stage,
            "cuda_graphs": asdict(self.cuda_graphs) if self.cuda_graphs else None,
            "rl_rollout": asdict(self.rollout) if self.rollout else None,
        }


def estimate_rank(spec: TrainingSpec, position: RankPosition) -> RankEstimate:
    """Estimate one rank (``position`` picks its TP shard and pipeline stage)."""
    if not 0 <= position.pp_rank < spec.parallel.pp:
        raise ValueError(
            f"rank position {position} is outside tp={spec.parallel.tp} x pp={spec.parallel.pp}"
        )
    spec = stage_spec(spec, position.pp_rank)  # its own tp and dp on hetero meshes
    p = spec.parallel
    if not 0 <= position.tp_rank < p.tp:
        raise ValueError(f"rank position {position} is outside tp={p.tp} x pp={p.pp}")
    params = rank_params(spec, position)
    per_chunk = layers_per_chunk(spec, position.pp_rank)
    extra = weight_terms(spec, params, position)
    persistent = persistent_terms(spec, params, position.pp_rank)
    persistent = replace(persistent, weight_bytes=persistent.weight_bytes + sum(extra.values()))
    fsdp = in_flight(spec, params)  # FSDP's all-gathered units by moment (fsdp.py)
    activations = activation_estimate(spec, position.pp_rank, per_chunk, fsdp)
    graphs = cuda_graph_terms(
        spec,
        position.pp_rank,
        per_chunk,
        activations.in_flight_per_chunk,
        adam_moment_bytes(spec, persistent),
    )
    if fsdp.layers or fsdp.loss:
        moment = activations.peak_moment.split()[-1]
        unsharded = fsdp.loss  # the loss's moments (cross entropy, KD loss, wgrad drain)
        if moment in ("attention_backward", "mlp_backward"):
            unsharded = fsdp.layers
        elif moment == "output_layer_backward":
            unsharded = fsdp.output_layer
        activations = replace(
            activations, detail={**activations.detail, "fsdp_unsharded": unsharded}
        )
    return RankEstimate(
        position=position,
        params=params,
        persistent=persistent,
        activations=activations,
        optimizer_step_bytes=max(
            optimizer_step_bytes(spec, params),
            muon_step_bytes(spec, params, spec.precision.muon_tp_mode) if is_muon(spec) else 0,
        ),
        workspaces={
            **workspace_terms(spec),
            **dummy_wgrad_terms(spec, params, position.pp_rank),
            **rl_buffer_terms(spec, position),
        },
        post_step_bytes=fp32_grad_copies(spec, params),
        retained_input_bytes=retained_inputs_bytes(spec, position.pp_rank, len(per_chunk)),
        weight_terms=extra,
        prefetched_bytes=fsdp.after_step,
        cuda_graphs=graphs,
        rollout=rollout_terms(spec, position, persistent, params),
    )


def weight_terms(
    spec: TrainingSpec, params: list[ParamTensor], position: RankPosition
) -> dict[str, int]:
    """Persistent bytes beside the trained weights: FP8/FP4 quantized weights, their copies
    and scaling state (:mod:`.fp8`) and a distillation teacher's frozen weights
    (:mod:`.distillation`)."""
    out: dict[str, int] = {}
    major = compute_major(spec.gpu) if spec.device == "cuda" else 9
    if spec.quant is not None:
        out.update(quantized_weight_terms(spec, params, major).detail())
    out.update(teacher_terms(spec, position, major))
    out.update(rl_weight_terms(spec, position))
    return out


def estimate_all_ranks(spec: TrainingSpec) -> list[RankEstimate]:
    """One estimate per distinct (pp_rank, tp_rank), pipeline-major."""
    p = spec.parallel
    return [
        estimate_rank(spec, RankPosition(tp_rank=t, pp_rank=s))
        for s in range(p.pp)
        for t in range(p.stage_sizes(s)[0])
    ]


def _stage_blocks(spec: TrainingSpec) -> Iterator[tuple[int, int, int, int]]:
    """(stage, its tp, its first global rank, its rank count), stage after stage: Megatron's
    default order (tp fastest, then cp, dp, pp); on FlagScale's hetero meshes, mesh after
    mesh, each in that order."""
    p, first = spec.parallel, 0
    for stage in range(p.pp):
        tp, dp = p.stage_sizes(stage)
        yield stage, tp, first, tp * p.cp * dp
        first += tp * p.cp * dp


def position_of_rank(spec: TrainingSpec, rank: int) -> RankPosition:
    """The (tp_rank, pp_rank) position of global ``rank``."""
    if not 0 <= rank < spec.parallel.world_size:
        raise ValueError(f"rank {rank} is outside the world size {spec.parallel.world_size}")
    for stage, tp, first, size in _stage_blocks(spec):
        if rank < first + size:
            return RankPosition(tp_rank=(rank - first) % tp, pp_rank=stage)
    raise AssertionError("unreachable: rank < world_size")


def ranks_by_position(spec: TrainingSpec) -> dict[RankPosition, list[int]]:
    """The global ranks holding each position (its data- and context-parallel peers)."""
    out: dict[RankPosition, list[int]] = {}
    for stage, tp, first, size in _stage_blocks(spec):
        for local in range(size):
            out.setdefault(RankPosition(local % tp, stage), []).append(first + local)
    return out
