"""MemScope as FlagScale 0.8.0's auto-tuner memory model, on the real FlagScale tree: the
strategy dicts its searcher makes and the experiment config it loads with OmegaConf go in,
megabytes its own pruner compares come out; and the trial reader that replaces grepping
"max reserved" from logs."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from flagscale_trees import pristine_tree
from omegaconf import OmegaConf

from memscope.analysis.static.estimator import estimate_all_ranks
from memscope.inputs.config_files import load_config
from memscope.integrations.flagscale.autotuner import MIB, memory_model, trial_max_memory

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_pp2_demo"
# One strategy as FlagScale's searcher builds it (every BUILT_IN_STRATEGY_DIMS key).
STRATEGY = {
    "data_parallel_size": 4, "use_distributed_optimizer": False,
    "tensor_model_parallel_size": 2, "sequence_parallel": True,
    "pipeline_model_parallel_size": 1, "num_layers_per_virtual_pipeline_stage": None,
    "use_recompute": False, "recompute_method": None, "recompute_granularity": None,
    "recompute_num_layers": None, "micro_batch_size": 2, "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
}  # fmt: skip


def _flagscale_module(relative: str):
    """A module of the real FlagScale tree, loaded from its file (the auto_tuner package's
    __init__ pulls in pandas for its recorder, which the pruner does not need)."""
    path = os.path.join(pristine_tree(), "flagscale", *relative.split("/"))
    spec = importlib.util.spec_from_file_location("flagscale_" + relative.replace("/", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _experiment(gpu_memory_mb: int):
    train = OmegaConf.load(os.path.join(pristine_tree(), "examples/aquila/conf/train/7b.yaml"))
    return OmegaConf.create({"train": train, "experiment": {
        "auto_tuner": {"memory_model": {"gpu_memory": gpu_memory_mb}}}})  # fmt: skip


def test_memory_model_is_the_estimators_worst_rank_for_that_strategy(tmp_path):
    config = _experiment(80_000)
    mb = memory_model(STRATEGY, config)
    # the same YAML with the strategy written into it, through analyze-static's loader
    yaml = OmegaConf.to_container(config.train, resolve=False)
    yaml["system"].update(tensor_model_parallel_size=2, sequence_parallel=True,
                          data_parallel_size=4, use_distributed_optimizer=False)  # fmt: skip
    yaml["model"]["micro_batch_size"] = 2
    path = tmp_path / "strategy.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(yaml)).replace("${data_path:??}", "x"))
    spec, _ = load_config(str(path), None, 8)
    worst = max(e.peak_memory_bytes for e in estimate_all_ranks(spec))
    assert mb == worst / MIB
    # each memory-saving dimension lowers it, as it would on the GPU
    for change in ({"use_distributed_optimizer": True}, {"use_recompute": True,
                   "recompute_granularity": "full", "recompute_method": "uniform",
                   "recompute_num_layers": 1}, {"micro_batch_size": 1}):  # fmt: skip
        assert memory_model({**STRATEGY, **change}, config) < mb


def test_flagscales_own_pruner_prunes_by_it():
    prune = _flagscale_module("runner/auto_tuner/prune/memory.py").prune_by_memory_model
    needed = memory_model(STRATEGY, _experiment(80_000))
    for budget, pruned in ((int(needed) - 1, True), (int(needed) + 1, False)):
        strategy = {**STRATEGY, "memory_model": needed}
        assert prune(_experiment(budget), strategy) is pruned
        assert (strategy.get("max_mem") == "OOM") is pruned


def test_trial_memory_comes_from_memscope_reports_not_a_log_grep(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank:05d}").mkdir()
        shutil.copy(EXAMPLE / f"rank{rank:05d}" / "runtime_report.json",
                    tmp_path / f"rank{rank:05d}" / "runtime_report.json")  # fmt: skip
    peaks = [json.loads((EXAMPLE / f"rank{r:05d}" / "runtime_report.json").read_text())
             ["peak"]["reserved_bytes"] for r in (0, 1)]  # fmt: skip
    assert trial_max_memory(str(tmp_path)) == max(peaks) / MIB
    assert trial_max_memory(str(tmp_path / "nothing-here")) is None
    (tmp_path / "rank00000" / "runtime_report.json").write_text("{truncated")
    assert trial_max_memory(str(tmp_path)) is None  # unreadable: no number is invented


def test_trial_memory_reads_the_job_summary_when_the_run_gathered_one(tmp_path):
    from memscope.analysis.job import rank_summary
    from memscope.events.file_names import JOB_SUMMARY_NAME
    from memscope.io.atomic import atomic_write_json
    from memscope.reporters.job_summary_json import job_summary_document

    reports = {r: json.loads((EXAMPLE / f"rank{r:05d}" / "runtime_report.json").read_text())
               for r in (0, 1)}  # fmt: skip
    doc = job_summary_document({r: rank_summary(x) for r, x in reports.items()}, {2: "died"},
                               world_size=3, written_by=0, run_id="t", collection={})  # fmt: skip
    atomic_write_json(str(tmp_path / JOB_SUMMARY_NAME), doc)
    expected = max(x["peak"]["reserved_bytes"] for x in reports.values()) / MIB
    assert trial_max_memory(str(tmp_path)) == expected


def _tuner_experiment(gpu_memory_mb: int, exp_dir: Path):
    """FlagScale 0.8.0's own auto-tuner example (aquila 7B on 8 GPUs) as its runner would
    compose it: ``train: 7b`` from its defaults, the data path given as on the command line,
    memory pruning turned on."""
    conf = os.path.join(pristine_tree(), "examples", "aquila", "conf")
    experiment = OmegaConf.load(os.path.join(conf, "train_auto_tuner.yaml"))
    for key in ("defaults", "hydra"):
        experiment.pop(key)
    experiment.train = OmegaConf.load(os.path.join(conf, "train", "7b.yaml"))
    experiment.train.data.data_path = "/data/pile_text_document"
    experiment.experiment.exp_dir = str(exp_dir)
    experiment.experiment.auto_tuner.memory_model = {"gpu_memory": gpu_memory_mb}
    return experiment


@pytest.fixture
def flagscale_importable(monkeypatch):
    """The real FlagScale tree importable in this process, and forgotten afterwards (other
    tests import patched copies of it in their own processes)."""
    import sys

    monkeypatch.syspath_prepend(pristine_tree())
    yield
    for name in [n for n in sys.modules if n == "flagscale" or n.startswith("flagscale.")]:
        del sys.modules[name]


def test_flagscales_real_auto_tuner_estimates_and_prunes_every_strategy_with_it(
    tmp_path, monkeypatch, flagscale_importable
):
    """The real ``AutoTuner`` (searcher, pruner, recorder, generator) built on FlagScale's
    example with MemScope's model installed: every strategy its searcher builds carries
    MemScope's estimate, and its own pruner prunes exactly the strategies that estimate puts
    above the GPU (OOM) or outside the utilization band."""
    import sys

    from memscope.integrations.flagscale.autotuner import SEARCHER_MODULE, install_memory_model

    previous = install_memory_model()
    assert previous is not memory_model and previous.__module__.endswith("memory_model")
    assert sys.modules[SEARCHER_MODULE].default_model is memory_model
    from flagscale.runner.auto_tuner.tuner import AutoTuner

    gpu_memory = 80_000
    tuner = AutoTuner(_tuner_experiment(gpu_memory, tmp_path))
    strategies = tuner.searcher.strategies
    assert len(strategies) > 100  # FlagScale's search space for 8 GPUs, not a handful
    config = tuner.config
    for strategy in strategies:
        assert strategy["memory_model"] == memory_model(strategy, config)
    low, high = (gpu_memory * u for u in strategies[0]["gpu_utilization"])
    pruned = [tuner.pruner.prune(dict(s), []) for s in strategies]
    expected = [not low <= s["memory_model"] <= high for s in strategies]
    assert pruned == expected and 0 < sum(pruned) < len(strategies)
    assert tuner.pruner.pruned_by_memory_model == sum(expected)
    oom = [s["memory_model"] > gpu_memory for s in strategies]
    for strategy, is_oom in zip(strategies, oom, strict=True):
        checked = dict(strategy)
        tuner.pruner.prune(checked, [])
        assert (checked.get("max_mem") == "OOM") is is_oom
    assert 0 < sum(oom) < sum(expected)  # some over the GPU, more over the 80% band
