"""The ``log_report.json`` document: each run of a log, its ranks and its out-of-memory
messages explained by :mod:`memscope.analysis.log_check`."""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import asdict
from typing import Any

from memscope.analysis.log_check import (
    DEFAULT_ORDER,
    UNEXPLAINED,
    check_oom,
    check_rank,
    optimizer_steps,
)
from memscope.analysis.log_sections import add_section_values, sections_index
from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.analysis.static.workspaces import gpu_words, te_words
from memscope.events.sections import INDEX_KEY
from memscope.inputs.log_spec import NO_OPTIONS, LogOptions, RunSpec, run_args, run_spec
from memscope.inputs.training_log import LogRun, MemoryLine, OomMessage, log_files

MIB = 2**20
#: How far Megatron's own parameter count may be from the configuration's before the log is
#: said not to describe the run (its formula leaves out biases, norms and position
#: embeddings: a few percent; a configuration other than the one that ran is off by far more).
SHARD_PARAMS_TOLERANCE = 0.10


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValueError):
        return str(exc)
    return f"an unexpected value in the log's configuration ({type(exc).__name__}: {exc})"


def missing_memory_lines(run: LogRun) -> str:
    """What a run without memory lines lacks, and what to turn on."""
    interval = None
    with contextlib.suppress(ValueError):
        interval = run_args(run)[0].get("log_interval")
    last = run.last_iteration
    reached = f"its last iteration line is {last}" if last is not None else "no iteration line"
    return (
        "no '[Rank N] (after K iterations) memory (MB)' line: Megatron prints it once, at the "
        f"first log interval (log_interval {interval if interval is not None else 'unknown'}; "
        f"{reached}); run past log_interval iterations (or lower --log-interval), keep the "
        "data-parallel rank 0 of every (tensor, pipeline) position in the log, or add "
        "--log-memory-to-tensorboard to get the same figures in TensorBoard"
    )


def _order(args: dict[str, Any]) -> str:
    """Megatron-LM's rank order: ``--use-tp-pp-dp-mapping`` gives tp-cp-ep-pp-dp."""
    return "tp-cp-ep-pp-dp" if args.get("use_tp_pp_dp_mapping") is True else DEFAULT_ORDER


def _layout(spec: TrainingSpec) -> dict[str, Any]:
    p = spec.parallel
    return {
        "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "etp": p.expert_tp,
        "vpp": p.vpp, "sequence_parallel": p.sequence_parallel,
        "micro_batch_size": spec.micro_batch_size, "num_microbatches": spec.num_microbatches,
        "recompute": spec.recompute, "params_dtype": spec.precision.params_dtype,
        "distributed_optimizer": spec.precision.distributed_optimizer,
        "num_layers": spec.model.num_layers, "hidden_size": spec.model.hidden_size,
        "num_experts": spec.model.num_experts, "seq_length": spec.model.seq_length,
        "vocab_size": spec.model.vocab_size,
    }  # fmt: skip


def megatron_shard_params(spec: TrainingSpec) -> float:
    """The parameters Megatron's ``report_theoretical_memory`` says its most loaded shard holds
    (theoretical_memory_usage.py, ``compute_weight_and_optimizer_memory``: the transformer
    block over ``pp``, plus one embedding, over ``tp``; plus the output layer when untied and
    ``pp == 1``), worked out from the configuration's own per-rank tensors."""
    m, p = spec.model, spec.parallel
    body = 0
    for stage in range(p.pp):
        tensors = rank_params(spec, RankPosition(tp_rank=0, pp_rank=stage))
        body += sum(t.numel for t in tensors
                    if not t.embedding_or_output and "embedding." not in t.name)  # fmt: skip
    embedding = m.vocab_size * m.hidden_size / p.tp
    extra = embedding if not m.tie_embeddings and p.pp == 1 else 0.0
    return body / p.pp + embedding + extra


def shard_params_note(run: LogRun, spec: TrainingSpec) -> str | None:
    """A note when Megatron's printed parameter count contradicts the configuration read: the
    log's configuration (a pasted script, an edited command) is then not the one that ran.
    Not checked for MoE or MTP models, whose count Megatron's formula makes differently (all
    experts, the whole MTP block on every shard)."""
    if run.shard_params_b is None or spec.model.num_experts or spec.model.mtp_num_layers:
        return None
    ours = megatron_shard_params(spec) / 1e9
    if ours <= 0 or abs(run.shard_params_b - ours) <= SHARD_PARAMS_TOLERANCE * ours:
        return None
    return (
        f"Megatron printed {run.shard_params_b:.4f} B parameters on its most loaded shard; "
        f"the configuration read ({run_args(run)[1]}) gives {ours:.4f} B: the log's "
        "configuration is probably not the one that ran, so its estimates and verdicts are "
        "not about this run"
    )


def _machine(options: LogOptions) -> dict[str, str]:
    """The GPU and Transformer Engine release the estimates follow: given, or assumed (a log
    names neither), and the option that names the run's."""
    gpu, te = options.gpu, options.transformer_engine_version
    return {
        "gpu": gpu_words(gpu) + ("; --gpu names the run's" if gpu is None else ", from --gpu"),
        "transformer_engine": te_words(te) + (
            "; --transformer-engine-version names the run's" if te is None
            else ", from --transformer-engine-version"
        ),
    }  # fmt: skip


def _latest_lines(run: LogRun) -> list[MemoryLine]:
    """Per rank, every distinct iteration it printed at (first line of each)."""
    seen: dict[tuple[int, int], MemoryLine] = {}
    for line in run.memory:
        seen.setdefault((line.rank, line.iteration), line)
    return sorted(seen.values(), key=lambda m: (m.rank, m.iteration))


def explain_run(run: LogRun, options: LogOptions = NO_OPTIONS) -> dict[str, Any]:
    """One run of the log as the report's plain dict (``options``: what the command line
    adds to the log)."""
    out: dict[str, Any] = {
        "index": run.index,
        "sources": list(run.sources),
        "theoretical": asdict(run.theoretical) if run.theoretical else None,
        "ranks": [],
        "stages": [],
        "ooms": [],
        "notes": [],
        "error": None,
    }
    if run.dropped:
        out["notes"].append(f"{run.dropped} records beyond the reader's cap were counted, not kept")
    if run.cut_lines:
        out["notes"].append(f"{run.cut_lines} lines over 1 MiB were skipped")
    if run.unfinished_args_where:
        out["notes"].append(
            f"{run.unfinished_args_where}: a later arguments block has no end line (a truncated "
            "log, or one elided where it was pasted): it was not read"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rs: RunSpec = run_spec(run, options)
    except UNEXPLAINED as exc:
        out["error"] = _reason(exc)
        out["ranks"] = _measured_only(run)  # what the log measured is still worth showing
        return out
    spec, args = rs.spec, run_args(run)[0]
    order = _order(args)
    out["config"] = {
        "origin": rs.origin, "where": rs.where, "world_size": rs.world_size,
        "world_origin": rs.world_origin, "rank_order": order, "layout": _layout(spec),
        "machine": _machine(options),
    }  # fmt: skip
    # every key of an arguments block is a Megatron argument: "unknown key" notes are noise
    dump = rs.origin == "arguments block"
    out["notes"] += [n for n in rs.notes if not (dump and "not a Megatron argument" in n)]
    mismatch = shard_params_note(run, spec)
    if mismatch is not None:
        out["notes"].append(mismatch)
    local_prefix = prefix_rank_note(run, rs.world_size)
    if local_prefix is not None:
        out["notes"].append(local_prefix)
    iterations = [(i.iteration, i.skipped) for i in run.iterations]
    for line in _latest_lines(run):
        steps, note = optimizer_steps(line.iteration, iterations)
        try:
            row = check_rank(
                spec, line.rank, _measured(line), line.iteration, steps, order, rs.unlogged
            )
        except UNEXPLAINED as exc:
            out["notes"].append(f"{line.where}: rank {line.rank}: {_reason(exc)}")
            continue
        row["where"], row["steps_note"] = line.where, note
        if run.theoretical is not None and row["grid"].get("pp") == 0:
            row["megatron_theoretical_mb"] = asdict(run.theoretical)  # first-stage figures
        out["ranks"].append(row)
    out["stages"] = _stages(out["ranks"])
    last = run.last_iteration
    steps = optimizer_steps(last, iterations)[0] if last is not None else 0
    for oom in _distinct_ooms(run):
        rank = _oom_rank(oom, run, rs.world_size, global_prefix=local_prefix is None)
        sizes = {
            "requested": oom.requested, "total": oom.total, "free": oom.free,
            "allocated": oom.allocated, "reserved_unallocated": oom.reserved_unallocated,
            "process_in_use": oom.process_in_use,
        }  # fmt: skip
        try:
            row = check_oom(spec, rank, sizes, steps, order)
        except UNEXPLAINED as exc:
            out["notes"].append(f"{oom.where}: {_reason(exc)}")
            continue
        row.update(where=oom.where, tag=oom.tag, device=oom.device, message=oom.text)
        out["ooms"].append(row)
    if not out["ranks"] and not out["ooms"]:
        out["error"] = missing_memory_lines(run)
    return out


def _measured(line: MemoryLine) -> dict[str, float]:
    return {
        "allocated": line.allocated_mb, "max_allocated": line.max_allocated_mb,
        "reserved": line.reserved_mb, "max_reserved": line.max_reserved_mb,
    }  # fmt: skip


def _measured_only(run: LogRun) -> list[dict[str, Any]]:
    """The memory lines of a run whose configuration could not be estimated: measured bytes,
    iteration and real steps; no grid place, estimate or verdict."""
    iterations = [(i.iteration, i.skipped) for i in run.iterations]
    return [
        {
            "rank": line.rank,
            "grid": None,
            "place": None,
            "iteration": line.iteration,
            "optimizer_steps": optimizer_steps(line.iteration, iterations)[0],
            "moment": None,
            "measured": {k: round(v * MIB) for k, v in _measured(line).items()},
            "estimate": None,
            "verdict": None,
            "allocated_verdict": None,
            "where": line.where,
        }
        for line in _latest_lines(run)
    ]


def prefix_rank_note(run: LogRun, world: int) -> str | None:
    """Why the numbers of the log's launcher prefixes are not global ranks, when they are
    not: the iteration lines come from the last rank (``print_rank_last``), and their prefix
    says another number (a ``[host:local_rank]:`` wrapper says the rank within the node)."""
    others = sorted(r for r in run.iteration_prefix_ranks if r != world - 1)
    if not others:
        return None
    return (
        f"the iteration lines, printed by the last rank ({world - 1}), carry the prefix number "
        f"{others[0]}: the launcher prefixes' numbers are not global ranks here, so no "
        "out-of-memory message is placed by its prefix"
    )


def _oom_rank(oom: OomMessage, run: LogRun, world: int, global_prefix: bool = True) -> int | None:
    """The failing global rank: the prefix's own (when the prefixes number global ranks),
    rank 0 of a one-rank run, or (FlagScale's host_{node}_*.output, one per node, torchrun's
    ``[default{local}]:``) node x ranks per node + local rank; else None."""
    if oom.rank is not None and global_prefix:
        return oom.rank
    if world == 1:
        return 0
    local = re.fullmatch(r"[A-Za-z_]*(\d+)", oom.tag)
    nodes = len(run.sources)
    if oom.node is not None and local and world % nodes == 0:
        return oom.node * (world // nodes) + int(local.group(1))
    return None


def _distinct_ooms(run: LogRun) -> list[Any]:
    """One message per failing writer (a traceback repeats it)."""
    seen: dict[tuple[Any, ...], Any] = {}
    for oom in run.ooms:
        seen.setdefault((oom.rank, oom.tag, oom.requested, oom.free), oom)
    return list(seen.values())


def _stages(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pipeline stage, its latest line's largest measured max allocated and prediction."""
    latest: dict[int, dict[str, Any]] = {}
    for row in ranks:
        latest_row = latest.get(row["rank"])
        if latest_row is None or row["iteration"] > latest_row["iteration"]:
            latest[row["rank"]] = row
    stages: dict[int, dict[str, Any]] = {}
    for row in latest.values():
        stage = row["grid"].get("pp", 0)
        best = stages.get(stage)
        if best is None or row["measured"]["max_allocated"] > best["measured_max_allocated_bytes"]:
            stages[stage] = {
                "pp_rank": stage,
                "rank": row["rank"],
                "iteration": row["iteration"],
                "measured_max_allocated_bytes": row["measured"]["max_allocated"],
                "predicted_max_allocated_bytes": row["estimate"]["max_allocated_bytes"],
                "status": row["verdict"]["status"],
                "explained_if": [a["setting"] for a in row["verdict"].get("explained_if") or ()],
            }
    return [stages[s] for s in sorted(stages)]


def log_document(
    paths: list[str], runs: list[LogRun], options: LogOptions = NO_OPTIONS
) -> dict[str, Any]:
    """The whole ``log_report.json`` (identity keys are the reporter's)."""
    explained = [explain_run(r, options) for r in runs]
    for run in explained:
        add_section_values(run)
    return {
        "logs": list(paths),
        "files": log_files(paths),  # every file read (a folder's host_*.output, in node order)
        INDEX_KEY: sections_index(),  # the declared sections, in page order
        "runs": explained,
    }


def calibration_comparisons(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The log's steady-state lines as the planner's per-term comparisons: what stays
    allocated between steps (``allocated``) calibrates the persistent terms together, what
    the step adds on top (``max allocated - allocated``) the activations; a log gives no
    finer split, so each group's terms share one ratio."""
    out = []
    for run in doc.get("runs") or []:
        for row in run.get("ranks") or []:
            if row.get("estimate") is None or row.get("optimizer_steps", 0) < 2:
                continue  # not estimated, or before the optimizer state existed
            terms, measured = row["estimate"]["terms"], row["measured"]
            persistent = ("weights", "gradients", "optimizer_state")
            static_steady = sum(terms[k] for k in persistent) + terms["workspaces"]
            static_steady += terms["global_buffer"] + terms["fp32_grad_copies"]
            static_act = row["estimate"]["max_allocated_bytes"] - static_steady
            if static_steady <= 0 or static_act <= 0:
                continue
            ratio = measured["allocated"] / static_steady
            act_ratio = (measured["max_allocated"] - measured["allocated"]) / static_act
            comps = {
                "parameters": terms["weights"], "gradients": terms["gradients"],
                "optimizer_state": terms["optimizer_state"], "other": terms["workspaces"],
            }  # fmt: skip
            rows = [
                {"component": k, "static_bytes": v, "runtime_bytes": round(v * ratio)}
                for k, v in comps.items()
            ]
            rows.append({"component": "activations", "static_bytes": static_act,
                         "runtime_bytes": round(static_act * act_ratio)})  # fmt: skip
            out.append({"status": "ok", "components": rows})
    return out
