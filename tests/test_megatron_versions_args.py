"""The Megatron args reader (``spec_from_megatron_args``) across Megatron-LM versions: each
version's own ``parse_args`` + ``validate_args`` (``megatron_args_worker.py``) turns the same
command line into its own namespace (0.19's has some 200 arguments that 0.15's lacks), and the
reader must give the same ``TrainingSpec`` from each.

The versions are the ones this interpreter can reach: FlagScale 0.8.0's bundled Megatron-LM
(0.15.0rc5) and the installed ``megatron.training`` when the installed megatron-core ships one
(0.19's wheel does, 0.16.1's does not). With fewer than two the test skips, or fails where
``MEMSCOPE_REQUIRE_MEGATRON_VERSIONS=1`` (CI's megatron-core 0.19 run sets it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os
import subprocess
import sys

import pytest
from flagscale_trees import MEGATRON, pristine_tree

from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = [pytest.mark.integration, pytest.mark.megatron_versions]

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "megatron_args_worker.py")
INSTALLED = "-"

MODEL = (
    "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
    "--max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 2 "
    "--global-batch-size 64 --transformer-impl local"
)
# name -> (world size, flags beyond MODEL): dense with TP/PP/SP and the distributed optimizer,
# interleaved PP with full recompute in fp16, CP with an uneven PP split, MLA and MTP, and MoE
# with expert parallelism.
COMMAND_LINES: dict[str, tuple[int, list[str]]] = {
    "tp2_pp2_bf16_gqa": (8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                             "2", "--bf16", "--use-distributed-optimizer", "--swiglu",
                             "--group-query-attention", "--num-query-groups", "4",
                             "--position-embedding-type", "rope", "--normalization", "RMSNorm",
                             "--recompute-activations", "--sequence-parallel"]),
    "pp2_vpp2_full_recompute_fp16": (4, ["--pipeline-model-parallel-size", "2",
                                         "--num-layers-per-virtual-pipeline-stage", "2", "--fp16",
                                         "--recompute-granularity", "full", "--recompute-method",
                                         "uniform", "--recompute-num-layers", "1"]),
    "cp2_pp2_uneven_mla_mtp": (8, ["--bf16", "--context-parallel-size", "2",
                                   "--pipeline-model-parallel-size", "2",
                                   "--decoder-first-pipeline-num-layers", "3",
                                   "--multi-latent-attention", "--q-lora-rank", "256",
                                   "--kv-lora-rank", "128", "--qk-head-dim", "64",
                                   "--qk-pos-emb-head-dim", "32", "--v-head-dim", "64",
                                   "--position-embedding-type", "rope", "--mtp-num-layers", "1",
                                   "--untie-embeddings-and-output-weights",
                                   "--use-distributed-optimizer", "--overlap-grad-reduce"]),
    "moe_ep4_top2": (8, ["--bf16", "--num-experts", "8", "--moe-router-topk", "2",
                         "--expert-model-parallel-size", "4", "--moe-ffn-hidden-size", "512",
                         "--moe-token-dispatcher-type", "alltoall", "--swiglu",
                         "--use-distributed-optimizer"]),
}  # fmt: skip


def _parsers() -> dict[str, str]:
    """label -> the worker's ROOT argument, for every Megatron-LM this interpreter can reach."""
    tree = pristine_tree()
    roots = {"flagscale": os.pathsep.join([os.path.join(tree, MEGATRON), tree])}
    if importlib.util.find_spec("megatron") and importlib.util.find_spec("megatron.training"):
        roots["installed"] = INSTALLED
    return roots


def _parse(root: str, jobs: dict[str, tuple[int, list[str]]], out_dir: str) -> dict[str, dict]:
    """name -> the worker's output for each command line of ``jobs`` (name -> (world size,
    flags beyond MODEL)), all parsed by one worker process."""
    outs = {name: os.path.join(out_dir, f"{name}.json") for name in jobs}
    listing = os.path.join(out_dir, "jobs.json")
    with open(listing, "w", encoding="utf-8") as f:
        json.dump([{"world_size": world, "out": outs[name], "argv": [*MODEL.split(), *argv]}
                   for name, (world, argv) in jobs.items()], f)  # fmt: skip
    proc = subprocess.run(
        [sys.executable, WORKER, root, listing], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed: dict[str, dict] = {}
    for name, out in outs.items():
        with open(out, encoding="utf-8") as f:
            parsed[name] = json.load(f)
    return parsed


def _differences(a: object, b: object, path: str = "spec") -> list[str]:
    if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
        found: list[str] = []
        for field in dataclasses.fields(a):
            name = field.name
            found += _differences(getattr(a, name), getattr(b, name), f"{path}.{name}")
        return found
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """version -> command line name -> the worker's output."""
    roots = _parsers()
    by_version: dict[str, dict[str, dict]] = {}
    if len(roots) > 1:  # (else nothing to compare: not parsed)
        for label, root in roots.items():
            out_dir = str(tmp_path_factory.mktemp(f"megatron_args_{label}"))
            runs = _parse(root, COMMAND_LINES, out_dir)
            by_version[runs[next(iter(runs))]["version"]] = runs
    if len(by_version) < 2:
        reason = f"only one Megatron-LM argument parser reachable ({sorted(by_version or roots)})"
        if os.environ.get("MEMSCOPE_REQUIRE_MEGATRON_VERSIONS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return by_version


@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_args_reader_gives_one_spec_from_every_versions_parser(parsed, name):
    specs = {version: spec_from_megatron_args(run[name]["args"]) for version, run in parsed.items()}
    for (va, a), (vb, b) in itertools.combinations(specs.items(), 2):
        assert _differences(a, b) == [], (va, vb)


def test_the_versions_compared_are_different_parsers(parsed):
    """Not one parser twice: distinct versions, distinct files, distinct argument sets."""
    first = {version: runs[next(iter(COMMAND_LINES))] for version, runs in parsed.items()}
    assert len({r["arguments_file"] for r in first.values()}) == len(first)
    names = [set(r["args"]) for r in first.values()]
    assert all(a != b for a, b in itertools.combinations(names, 2))
