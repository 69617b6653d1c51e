"""MemScope for FlagScale's auto-tuner: a memory model and a reader of what trials used.

* :func:`memory_model` has the call shape of FlagScale 0.8.0's
  ``flagscale.runner.auto_tuner.memory_model.default_model(strategy, config)`` and returns
  megabytes (MiB, as Megatron's ``report_theoretical_memory`` does) that the auto-tuner's
  pruner compares with ``experiment.auto_tuner.memory_model.gpu_memory``. Where FlagScale's
  default is Megatron's first-stage formula, this is MemScope's per-rank estimator for every
  pipeline stage of the strategy, the worst stage's peak returned.
* :func:`install_memory_model` puts :func:`memory_model` where FlagScale's searcher looks.
* :func:`trial_max_memory` replaces grepping "max reserved" from a trial's log: given a
  trial's MemScope output directory (``job_summary.json``, or ``rankNNNNN/`` folders), the
  highest reserved peak over all ranks, in MiB (``None`` when nothing there says). FlagScale's
  ``Recorder.grep_max_memory`` takes the largest "max reserved" (MB = MiB) printed in the
  trial's host logs, which Megatron's ``report_memory`` prints only for data-parallel rank 0
  of each (TP, PP) position and only at the first logging interval(s); this is every traced
  rank over the whole run, in the same unit.

Torch-free: the auto-tuner's process never trains.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from memscope.analysis.job import RankEntry, job_mixups
from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.planner import stage_peaks
from memscope.analysis.static.spec_checks import validate_spec
from memscope.events.file_names import JOB_SUMMARY_NAME, REPORT_NAME
from memscope.inputs.config_files import spec_from_flagscale_yaml
from memscope.io.rank_folders import rank_folders
from memscope.io.report_reader import ReportError, load_report

MIB = 2**20
# FlagScale strategy dimensions -> where they go in the training YAML (system: / model:).
_SYSTEM_DIMS = ("data_parallel_size", "use_distributed_optimizer", "tensor_model_parallel_size",
                "sequence_parallel", "pipeline_model_parallel_size",
                "num_layers_per_virtual_pipeline_stage", "context_parallel_size",
                "expert_model_parallel_size")  # fmt: skip


def _plain(config: Any) -> dict[str, Any]:
    """An OmegaConf config (FlagScale's) or a mapping, as plain dicts."""
    config = _container(config)
    if not isinstance(config, Mapping):
        raise ValueError(
            f"config must be FlagScale's OmegaConf config or a mapping, not {config!r:.60}"
        )
    return dict(config)


def _container(config: Any) -> Any:
    """An OmegaConf node as plain containers (interpolations FlagScale's own resolvers
    handle, such as ``${data_path:??}``, are left as written); anything else as it is."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # FlagScale's dependency, not MemScope's: then it is no OmegaConf
        return config
    if not isinstance(config, DictConfig):
        return config
    try:
        return OmegaConf.to_container(config, resolve=True)
    except Exception:
        return OmegaConf.to_container(config, resolve=False)


def strategy_spec(strategy: Mapping[str, Any], config: Any) -> TrainingSpec:
    """The training spec of one auto-tuner ``strategy`` of the experiment ``config``."""
    train = _plain(_plain(config).get("train") or {})
    system = dict(train.get("system") or {})
    model = dict(train.get("model") or {})
    for key in _SYSTEM_DIMS:
        if strategy.get(key) is not None:
            system[key] = strategy[key]
    if (
        "num_layers_per_virtual_pipeline_stage" in strategy
        and not strategy["num_layers_per_virtual_pipeline_stage"]
    ):
        system.pop("num_layers_per_virtual_pipeline_stage", None)
    if strategy.get("use_recompute"):
        for key in ("recompute_method", "recompute_granularity", "recompute_num_layers"):
            if strategy.get(key) is not None:
                system[key] = strategy[key]
    elif "use_recompute" in strategy:
        for key in ("recompute_method", "recompute_granularity", "recompute_num_layers"):
            system.pop(key, None)
    if strategy.get("micro_batch_size") is not None:
        model["micro_batch_size"] = strategy["micro_batch_size"]
    world = 1
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                "context_parallel_size", "data_parallel_size"):  # fmt: skip
        world *= int(system.get(key) or 1)
    yaml = {"system": system, "model": model, "data": dict(train.get("data") or {})}
    return validate_spec(spec_from_flagscale_yaml(yaml, world_size=world))


def memory_model(strategy: Mapping[str, Any], config: Any) -> float:
    """The strategy's worst pipeline stage's predicted peak, in MiB (FlagScale's call shape
    and unit; see the module docstring)."""
    peaks = stage_peaks(strategy_spec(strategy, config))
    return max(peaks) / MIB


SEARCHER_MODULE = "flagscale.runner.auto_tuner.search.searcher"


def install_memory_model() -> Any:
    """Make FlagScale's auto-tuner estimate every strategy with :func:`memory_model`.

    FlagScale 0.8.0 has no registry for memory models: its searcher calls the
    ``default_model`` it imported from ``memory_model.py`` (and accepts only
    ``model_name: default``), so the name in the searcher's module is replaced. Call it
    before the ``AutoTuner`` is built; returns what was there, to put back if wanted.
    FlagScale must be importable (its ``auto_tuner`` package imports pandas, psutil, aiohttp
    and tqdm)."""
    import importlib

    searcher = importlib.import_module(SEARCHER_MODULE)
    previous = getattr(searcher, "default_model", None)
    if previous is None:
        raise ValueError(f"{SEARCHER_MODULE} has no default_model: not FlagScale 0.8.0's searcher")
    setattr(searcher, "default_model", memory_model)  # noqa: B010 (a module of FlagScale's)
    return previous


def trial_max_memory(path: str) -> float | None:
    """The highest reserved peak over a trial's ranks, in MiB, from its MemScope output."""
    summary = os.path.join(path, JOB_SUMMARY_NAME)
    reports: list[dict[str, Any]] = []
    entries: list[RankEntry] = []
    try:
        if os.path.isfile(summary):
            reports = list(load_report(summary, "job_summary").get("ranks") or [])
        elif os.path.isdir(path):
            for rank, folder in rank_folders(path):
                report = os.path.join(folder, REPORT_NAME)
                if os.path.isfile(report):
                    reports.append(load_report(report, "runtime"))
                    entries.append(RankEntry(rank, reports[-1], where=os.path.basename(folder)))
    except ReportError:
        return None
    if job_mixups(entries):  # another run's ranks in the folder: no number is better than theirs
        return None
    peaks = [
        int((r.get("peak") or {}).get("reserved_bytes") or 0)
        for r in reports
        if isinstance(r, dict)
    ]
    return max(peaks) / MIB if peaks and max(peaks) > 0 else None
