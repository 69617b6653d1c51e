"""Shared fixtures. Megatron runs use the clearly labelled CPU shims in memscope.demo and the
test-only instrumentation in ``harness`` (tests/harness/)."""

from __future__ import annotations

import atexit
import gc
import json
import os
import shutil
import tempfile
from typing import Any

import pytest
from harness import InstrumentedResult, instrumented_worker
from layer_guard import LayerGuard
from megatron_newest import NewestMegatronSelection

from memscope.demo.launcher import free_port
from memscope.demo.tiny_gpt import TinyGPTConfig

# torch's inductor (which megatron-core imports) caches under <temp>/torchinductor_<user>,
# looked up when first used: keep that in a folder of this test session, removed at exit
# (subprocesses inherit the setting), so the tests leave nothing in the temporary directory.
_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="memscope-tests-inductor-")
atexit.register(shutil.rmtree, _INDUCTOR_CACHE, True)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _INDUCTOR_CACHE)


#: Small real fixtures, each with the command that made it or its source (tests/data/README.md).
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
#: A 2-rank job of `memscope demo --steps 2 --microbatches 2`: job_summary.json and each rank's
#: runtime_report.json and trace.jsonl.
DEMO_JOB = os.path.join(DATA, "demo_pp2")
#: A CUDA allocator snapshot (torch.cuda.memory._dump_snapshot) of a public training benchmark.
PUBLIC_SNAPSHOT = os.path.join(DATA, "cuda_snapshot", "memory_forward_fp32_128.pickle")


def session_basetemp(given: str | None) -> str:
    """pytest's base temporary directory for this session: the one given with --basetemp,
    else a fresh folder of its own. pytest's default, <temp>/pytest-of-<user>/pytest-N, is
    shared by concurrent runs (each prunes the others' older folders and moves the
    ``pytest-current`` link), so two test runs at once never share one."""
    return given or tempfile.mkdtemp(prefix="memscope-tests-")


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "basetemp", None) is None:
        config.option.basetemp = session_basetemp(None)
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, True))
    # the unit / integration split, checked while the tests run (tests/layer_guard.py)
    guard = LayerGuard()
    guard.install()
    config.pluginmanager.register(guard, "memscope-layer-guard")
    # the tests CI runs a second time on the newest megatron-core (tests/megatron_newest.py)
    config.pluginmanager.register(NewestMegatronSelection(), "memscope-megatron-newest")


def run_in_process(
    cfg: TinyGPTConfig, steps: int, memscope_argv: list[str] | None, **plants: Any
) -> InstrumentedResult:
    """One real megatron-core training run in this process (world size 1, gloo), instrumented
    (``plants``: the faults and bugs :func:`harness.instrumented_worker` can plant).
    Garbage earlier tests left in reference cycles (tensors held by tracebacks, models) is
    collected first: the storage backend would rightly count it as live until the collector
    runs, which it may do in the middle of the run."""
    gc.collect()
    return instrumented_worker(0, 1, free_port(), cfg, steps, memscope_argv, **plants)


def load_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def demo_job(tmp_path) -> str:
    """A private copy of the committed 2-rank demo job (commands may write pages beside it)."""
    return shutil.copytree(DEMO_JOB, os.path.join(tmp_path, "demo_pp2"))


@pytest.fixture
def demo_rank0(demo_job) -> tuple[dict[str, Any], str]:
    """(rank 0's report, the job directory) of the committed demo: a real report, no training."""
    return load_json(os.path.join(demo_job, "rank00000", "runtime_report.json")), demo_job


@pytest.fixture(scope="session")
def small_cfg() -> TinyGPTConfig:
    return TinyGPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_microbatches=2)


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory, small_cfg) -> tuple[InstrumentedResult, dict[str, Any], str]:
    """A 4-step traced single-rank run with default settings: (result, report, outdir)."""
    outdir = str(tmp_path_factory.mktemp("traced"))
    result = run_in_process(small_cfg, 4, ["--memscope", "--memscope-outdir", outdir])
    assert result.report_path == os.path.join(outdir, "rank00000", "runtime_report.json")
    return result, load_json(result.report_path), outdir


@pytest.fixture(scope="session")
def history_run(tmp_path_factory, small_cfg) -> tuple[InstrumentedResult, dict[str, Any], str]:
    """A 3-step traced single-rank run recording the storage ledger's allocator history over
    steps 1 and 2: (result, report, outdir)."""
    outdir = str(tmp_path_factory.mktemp("history"))
    argv = ["--memscope", "--memscope-outdir", outdir, "--memscope-enable-memory-snapshot",
            "--memscope-snapshot-start-step", "1", "--memscope-snapshot-steps", "2"]  # fmt: skip
    result = run_in_process(small_cfg, 3, argv)
    return result, load_json(result.report_path), outdir
