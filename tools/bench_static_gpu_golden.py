"""Static estimate vs the memory golden values of Megatron-LM's own GPU functional tests.

NVIDIA's Megatron-LM functional tests publish, per test case, ``model_config.yaml`` (the
training flags under ``MODEL_ARGS``) and ``golden_values_{dev,lts}_dgx_{h100,a100}.json``
with ``mem-allocated-bytes`` and ``mem-max-allocated-bytes`` per logged iteration:
``torch.cuda.memory_stats()``'s ``allocated_bytes.all.current`` / ``.peak`` as the
TensorBoard writer records them. That writer exists only on the last global rank
(``is_last_rank()``: rank world_size - 1, i.e. the last tensor-parallel rank of the last
pipeline stage), so every number here is that rank's. The FlagScale 0.8.0 wheel ships the
cases (megatron-core 0.15) under ``third_party/Megatron-LM/tests/functional_tests/test_cases``.

    python tools/bench_static_gpu_golden.py [--json OUT] [--filter SUBSTR]
        [--gpu h100|a100] [--golden dev|lts] [--write]

``--write`` regenerates the committed results: ``benchmarks/static_gpu_golden.txt`` (the
table), ``.json`` (every row) and ``memscope/analysis/static/gpu_benchmark_summary.py``
(a generated module of the last line's figures, which the planner's band and the docs'
accuracy figures come from; ``tests/test_gpu_benchmark_fresh.py`` fails when any of them is stale).

Per modelled case, one line: the measured steady allocation (``mem-allocated-bytes`` at the
last logged iteration: what stays allocated between iterations, ~ weights + gradients +
optimizer state + global buffers + what the pipeline schedule leaves referenced), the
measured peak (max of ``mem-max-allocated-bytes``), our
persistent and peak estimate for the last rank, the ratio estimate / measured peak, and the
term that differs most: ``persistent`` (our persistent part vs the measured steady
allocation) or ``transient`` (our peak - persistent vs measured peak - steady: activations,
backward working set, optimizer-step temporaries). The last line is
``worst: X%  median: Y%`` over the modelled cases: the signed peak error
(estimate - measured) / measured of the case with the largest absolute error, and the median
absolute error. Every case not modelled is listed below the table with its reason (a
non-GPT family, an inference-only case, a feature the estimator says it does not model, a
refusal by the estimator, an input the tree does not give); none is dropped silently.

**The namespace** of each case is built by Megatron-LM's own argument code from the
FlagScale tree, run in a subprocess (so the tree's ``megatron`` never shadows the installed
one in the caller): ``megatron.training.arguments.parse_args(ignore_unknown_args=True)`` on
the argv that the functional tests' ``_run_training.sh`` builds from ``MODEL_ARGS`` (``true``
-> the bare flag, a list -> its items), then ``validate_args`` with ``pretrain_gpt.py``'s
``args_defaults`` (``tokenizer_type=GPT2BPETokenizer``), ``world_size`` and ``rank`` (the last
one) set, which derives what the flags leave out (data-parallel size, FFN width, query groups,
virtual stages, ...). ``validate_args`` asks the GPU and Transformer Engine for versions; on
this CPU-only machine three answers are stubbed: the device's compute capability (9.0 for
``--gpu h100``, 8.0 for ``a100``) and ``is_te_min_version`` (True: the CI containers run a
recent Transformer Engine). The vocabulary is the tokenizer's, as Megatron builds it:
GPT-2 BPE (``vocab.json``/``merges.txt``, the default): 50257; ``NullTokenizer``:
``--vocab-size`` + 1 (its EOD); ``TikTokenizer``: ``--vocab-size`` or 131072; anything that
needs a tokenizer file the tree does not hold is listed as not modelled.

**World size**: ``NxG`` in the case name (``1N8G`` = 8 GPUs, ``2N8G`` = 16), else the
``nodes`` x ``gpus`` of the recipe (``tests/test_utils/recipes/*.yaml``) that lists the case;
a case with neither (the ``*_release`` ones) is listed as not modelled.

The estimator runs with ``device="cuda"`` (bool dropout masks) and the precision the flags
give (``--bf16`` / ``--fp16``). Nothing is tuned to these numbers.

**The release** each case estimates for is the one that measured it, never the installed
megatron-core (the output is the same whichever release CI installs), carried by every case as
``megatron_core`` (``spec.model.megatron_core_version``, where releases differ:
``memscope/analysis/static/megatron_versions.py``). The tree ships golden values written by
megatron-core 0.9 to 0.15 (a case keeps its numbers until CI re-measures it), so each golden
file is traced, by its git blob id, to the earliest Megatron-LM commit that wrote that content
and from there past edits of other fields to the run that measured it
(``tools/golden_history.py``); the release at that commit is recorded with it in
``tests/data/flagscale_golden_measured_at.json`` (``--measured-at GIT_DIR`` regenerates it from a
Megatron-LM clone) and checked against the file's bytes on every run. A file not found there
takes the tree's release (``megatron/core/package_info.py``, 0.15.0rc5), with a note. The
flags are the tree's: a flag added to a case after its numbers were written is read as if it
had run (``tools/bench_static_published.py`` reads each case's configuration as measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import types
from collections.abc import Iterable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CASES_DIR = os.path.join("third_party", "Megatron-LM", "tests", "functional_tests", "test_cases")
RECIPES_DIR = os.path.join("third_party", "Megatron-LM", "tests", "test_utils", "recipes")
# Families built on Megatron's GPTModel (the only model the static estimator models).
GPT_FAMILIES = ("gpt", "moe", "mixtral")
# Every other family of the tree, with the reason it is skipped.
SKIPPED_FAMILIES = {
    "bert": "BertModel (bidirectional encoder with a binary head), not GPTModel",
    "t5": "T5Model (encoder-decoder), not GPTModel",
    "hybrid": "MambaModel (hybrid Mamba/attention layers), not GPTModel",
    "multimodal-llava": "LLaVA (vision encoder + language model), not GPTModel",
    "mimo": "MIMO vision-language model, not GPTModel",
    "gpt-nemo": "NeMo 2.0 recipes (nemo-run arguments, not Megatron MODEL_ARGS)",
    "common": "checkpoint-consistency tooling, no training run",
}
GPU_ARCH = {"h100": (9, 0), "a100": (8, 0)}
GPT2_BPE_VOCAB = 50257  # GPT-2's vocab.json, the functional tests' default tokenizer
TIKTOKEN_DEFAULT_VOCAB = 2**17  # megatron/training/tokenizer/tokenizer.py's fallback
GIB = 1024**3
# Megatron-LM's main line the tree's golden files are looked up in (its ancestors): the
# published benchmark's source commit (tools/bench_static_published.py SOURCE_COMMIT)
MEASURED_AT_REF = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
MEASURED_AT = os.path.join(
    os.path.dirname(HERE), "tests", "data", "flagscale_golden_measured_at.json"
)
#: Variables Megatron-LM's argument code reads that a case's ENV_VARS, not the caller, set.
LAUNCHER_ENV = frozenset({"CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN",
                          "NVTE_UNFUSED_ATTN", "NVTE_ALLOW_NONDETERMINISTIC_ALGO"})  # fmt: skip


# --------------------------------------------------------------------------------------
# Reading a case
# --------------------------------------------------------------------------------------


def cases_root(tree: str) -> str:
    return os.path.join(tree, CASES_DIR)


def golden_file(case_dir: str, gpu: str, golden: str) -> str | None:
    """The golden-values file to use: the requested (golden, gpu) first, then the same golden
    on the other GPU, the other golden on this GPU, the other on the other, then a file
    without a platform (``golden_values_{dev,lts}.json``). Only files with memory values."""
    other_gpu = "a100" if gpu == "h100" else "h100"
    other_golden = "lts" if golden == "dev" else "dev"
    order = [
        f"golden_values_{golden}_dgx_{gpu}.json",
        f"golden_values_{golden}_dgx_{other_gpu}.json",
        f"golden_values_{other_golden}_dgx_{gpu}.json",
        f"golden_values_{other_golden}_dgx_{other_gpu}.json",
        f"golden_values_{golden}.json",
        f"golden_values_{other_golden}.json",
    ]
    for name in order:
        path = os.path.join(case_dir, name)
        if os.path.isfile(path) and _has_memory(path):
            return path
    return None


def _has_memory(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "mem-max-allocated-bytes" in data


def _numbers(metric: dict[str, Any]) -> list[tuple[int, float]]:
    """(iteration, value) pairs of one golden metric, NaN and non-numbers left out."""
    out = []
    for it, value in (metric.get("values") or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if number == number:  # not NaN
            out.append((int(it), number))
    return sorted(out)


def measured(path: str) -> dict[str, Any]:
    """Steady allocation (``mem-allocated-bytes`` at the last logged iteration) and peak
    (max of ``mem-max-allocated-bytes``) from a golden-values file."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    allocated = _numbers(data.get("mem-allocated-bytes") or {})
    peaks = _numbers(data.get("mem-max-allocated-bytes") or {})
    if not allocated or not peaks:
        raise ValueError(f"{os.path.basename(path)}: no numeric memory values")
    steady_iter, steady = allocated[-1]
    peak_iter, peak = max(peaks, key=lambda p: (p[1], -p[0]))
    return {
        "golden_file": os.path.basename(path),
        "steady_bytes": int(steady),
        "steady_iteration": steady_iter,
        "peak_bytes": int(peak),
        "peak_iteration": peak_iter,
        "iterations": [allocated[0][0], allocated[-1][0]],
    }


def load_case_config(case_dir: str) -> dict[str, Any]:
    import yaml

    with open(os.path.join(case_dir, "model_config.yaml"), encoding="utf-8") as f:
        data = yaml.safe_load(f)
    return data if isinstance(data, dict) else {}


# Variables Megatron-LM's harness exports before ``_run_training.sh`` substitutes them into
# the flags (``envsubst``) that a parsed flag's type needs: run_ci_test.sh ``export
# REPEAT=$i`` for the repeats 1..N_REPEAT; the golden values are the first repeat's (``--seed:
# ${REPEAT}``).
HARNESS_VARIABLES = {"REPEAT": "1"}


def argv_from_model_args(model_args: dict[str, Any]) -> list[str]:
    """The command line ``_run_training.sh`` builds from ``MODEL_ARGS``: ``true`` -> the
    bare flag, a list or a ``"[a b]"`` string -> its items, anything else -> the flag and
    its value. ``false`` (which the script would pass as the word ``false``, refused by
    argparse for a switch) is left out. A value with spaces (``--hierarchical-context-
    parallel-sizes: 2 2``) is split into words, as an ``nargs='+'`` option reads it (the
    script quotes it into one word, which argparse refuses for an int list; a
    single-valued option ignores the extra words here). A ``${NAME}`` of
    :data:`HARNESS_VARIABLES` is replaced by its value, as the script's ``envsubst`` does;
    other variables (paths) are left as written."""
    argv: list[str] = []
    for key, value in model_args.items():
        key = str(key)
        if isinstance(value, str):
            value = re.sub(
                r"\$\{(\w+)\}", lambda m: HARNESS_VARIABLES.get(m.group(1), m.group(0)), value
            )
        if value is True:
            argv.append(key)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [key, *(str(v) for v in value)]
        else:
            text = str(value).strip()
            if re.fullmatch(r"\([^)]+\)", text):
                argv += [key, text]  # the script quotes a parenthesised value as one word
            elif re.fullmatch(r"\[[^]]+\]", text):
                argv += [key, *text[1:-1].split()]  # ... and strips brackets into words
            elif "\\" in text or '"' in text or "'" in text:
                argv += [key, *_unquoted(text)]
            else:
                argv += [key, *(text.split() or [""])]
    return argv


def _unquoted(text: str) -> list[str]:
    """A value with quotes or backslashes as the script passes it on: ``echo "$value" |
    xargs`` takes one level of quoting off, then ``eval "TRAINING_PARAMS_ARRAY=(...)"`` reads
    the unquoted word once more (``Et*3\\\\|\\\\(tt\\\\|\\\\)*6tL`` -> ``Et*3|(tt|)*6tL``, the
    pipeline layout of a 2025 MoE case)."""
    import shlex

    trimmed = " ".join(shlex.split(text))  # xargs
    return shlex.split(trimmed)  # eval


def _env_value(value: Any) -> str:
    """An ``ENV_VARS`` value as the shell exports it (YAML ``true`` -> ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# _run_training.sh: ``GPUS_PER_NODE=${GPUS_PER_NODE:-8}``, ``torchrun --nproc_per_node
# $GPUS_PER_NODE --nnodes $NUM_NODES``.
LAUNCH_DEFAULT_GPUS_PER_NODE = 8


def launched_gpus_per_node(gpus: int, text: str) -> int:
    """The processes per node a recipe's run starts: its ``gpus`` where its script exports
    ``GPUS_PER_NODE={gpus}`` (the GB200 recipes), else ``_run_training.sh``'s default of 8
    (the DGX recipes, whatever their ``gpus`` says: the RL recipes say 1 and run TP 4 x DP 2)."""
    return gpus if "GPUS_PER_NODE={gpus}" in text else LAUNCH_DEFAULT_GPUS_PER_NODE


def read_recipes(
    files: Iterable[tuple[str, str]],
) -> dict[str, tuple[int, str, bool]]:
    """test case -> (nodes x the GPUs per node it launches, the recipe's path, whether the
    recipe lists the case only in a commented-out entry) over Megatron-LM's test recipes,
    given as (path, YAML text).

    A case a DGX recipe (8 GPUs a node, the golden files' platforms) lists takes that one's
    world size, not a GB200 recipe's; a case listed in one recipe and commented out in another
    takes the listing's; a case only commented out ran under that file's spec when it ran.
    The one reader of a recipe's text, for the tree's files and for git."""
    import yaml

    listed: dict[str, tuple[int, str, bool]] = {}
    commented: dict[str, tuple[int, str, bool]] = {}
    for path, text in sorted(files, key=lambda f: ("gb200" in f[0], f[0])):
        data = yaml.safe_load(text) or {}
        spec = (data.get("spec") or {}) if isinstance(data, dict) else {}
        if not isinstance(spec.get("nodes"), int) or not isinstance(spec.get("gpus"), int):
            continue
        world = spec["nodes"] * launched_gpus_per_node(spec["gpus"], text)
        for product in data.get("products") or []:
            for case in product.get("test_case") or []:
                listed.setdefault(str(case), (world, path, False))
        for case in re.findall(r"#\s*- test_case: \[(\w+)\]", text):
            commented.setdefault(case, (world, path, True))
    return {**commented, **listed}


def recipe_world_sizes(tree: str) -> dict[str, int]:
    """test case -> nodes x launched GPUs per node of the recipe listing it, from the tree's
    recipe files. A case only commented out gets no world size here (its name may still
    carry one, which :func:`world_size` reads first): it does not run at the tree's commit,
    so its golden values are older than its model_config.yaml here, which may have changed
    since (the selective-recompute MoE case gained an MTP layer in its layout after its H100
    values)."""
    files = []
    for path in glob.glob(os.path.join(tree, RECIPES_DIR, "*.yaml")):
        with open(path, encoding="utf-8") as f:
            files.append((path, f.read()))
    return {
        case: world
        for case, (world, _, only_commented) in read_recipes(files).items()
        if not only_commented
    }


def world_size(name: str, recipes: dict[str, int]) -> tuple[int | None, str]:
    """The case's world size and where it came from."""
    match = re.search(r"(\d+)N(\d+)G", name)
    if match:
        return int(match.group(1)) * int(match.group(2)), f"name {match.group(0)}"
    if name in recipes:
        return recipes[name], "recipe nodes x GPUs per node"
    return None, "neither NxG in the name nor a recipe listing the case"


#: SentencePiece files that test cases name by path but the tree does not hold, whose
#: vocabulary is published: (tokenizer type, file name) -> (pieces, where that is stated).
#: Megatron's ``_SentencePieceTokenizer`` and ``_Llama2Tokenizer`` take the model's piece count
#: as the vocabulary (megatron/training/tokenizer/tokenizer.py), padded like any other.
PUBLIC_VOCABULARIES: dict[tuple[str, str], tuple[int, str]] = {
    ("GPTSentencePieceTokenizer", "nemotron_2_256k.model"): (
        256_000,
        "nemotron_2_256k.model, Nemotron-4's tokenizer: 256,000 tokens (Nemotron-4 15B "
        "technical report, arXiv:2402.16819; the file ships with nvidia/Nemotron-4-340B-Base)",
    ),
    ("Llama2Tokenizer", "tokenizer.model"): (
        32_000,
        "Llama2Tokenizer's tokenizer.model: 32,000 pieces, Llama 2's (arXiv:2307.09288) and "
        "Mixtral's (arXiv:2401.04088) alike",
    ),
    # Megatron's HuggingFaceTokenizer.vocab_size is len(tokenizer): base vocabulary and added
    # tokens. Padded to a multiple of 128 x TP 4 it is 152,064, as the model's own
    # vocab_size of 151,936 (config.json) would be too.
    ("HuggingFaceTokenizer", "qwen3-8b-dist/tokenizer"): (
        151_669,
        "Qwen3's tokenizer (Qwen/Qwen3-8B tokenizer.json: 151,643 byte-level BPE tokens and "
        "26 added tokens, ids up to 151,668)",
    ),
}


def tokenizer_vocab(ns: Any) -> tuple[int | None, str]:
    """The tokenizer's (unpadded) vocabulary as Megatron's ``build_tokenizer`` gets it."""
    kind = getattr(ns, "tokenizer_type", None) or "GPT2BPETokenizer"
    given = getattr(ns, "vocab_size", None)
    if kind == "GPT2BPETokenizer":
        return GPT2_BPE_VOCAB, "GPT-2 BPE vocab.json"
    if kind == "NullTokenizer" and given:
        return int(given) + 1, "NullTokenizer --vocab-size + EOD"
    if kind == "TikTokenizer":
        return int(given or TIKTOKEN_DEFAULT_VOCAB), "TikTokenizer"
    path = str(getattr(ns, "tokenizer_model", None) or "").rstrip("/").split("/")
    for model in (path[-1], "/".join(path[-2:])):  # the file, or its folder and name
        if (kind, model) in PUBLIC_VOCABULARIES:
            return PUBLIC_VOCABULARIES[kind, model]
    return None, f"{kind}: the vocabulary is in a tokenizer file the tree does not hold"


def not_modelled_feature(ns: Any) -> str | None:
    """A feature docs/static-estimator.md says the estimator does not model (FP8/FP4 training
    is modelled: memscope/analysis/static/fp8.py)."""
    for flag in ("cpu_offloading", "optimizer_cpu_offload"):
        if getattr(ns, flag, None):
            return f"--{flag.replace('_', '-')}: CPU/activation offloading is not modelled"
    return None


# --------------------------------------------------------------------------------------
# Megatron's parser, in a subprocess
# --------------------------------------------------------------------------------------


def _worker(tree: str, gpu: str) -> None:
    """Read [{name, argv, env, world_size}] on stdin; write {name: vars(args) | {"error": ...}}."""
    import contextlib
    import io
    import warnings

    warnings.filterwarnings("ignore")
    sys.path[:0] = [os.path.join(tree, "third_party", "Megatron-LM"), tree]
    jobs = json.load(sys.stdin)
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(io.StringIO()):
        import torch
        from megatron.training import arguments

        arch = GPU_ARCH[gpu]
        arguments.get_device_arch_version = lambda: arch[0]  # STUB: no GPU here
        arguments.is_te_min_version = lambda *a, **k: True  # STUB: no Transformer Engine
        torch.cuda.get_device_capability = lambda *a, **k: arch  # STUB: no GPU here
        out: dict[str, Any] = {}
        for job in jobs:
            sys.argv = ["pretrain_gpt.py", *job["argv"]]
            saved = dict(os.environ)
            os.environ.update(job["env"])  # _run_training.sh exports ENV_VARS before training
            os.environ["WORLD_SIZE"] = str(job["world_size"])
            os.environ["RANK"] = str(job["world_size"] - 1)
            stage, err = "parse_args", io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    args = arguments.parse_args(ignore_unknown_args=True)
                stage = "validate_args"
                arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
                out[job["name"]] = json.loads(json.dumps(vars(args), default=str))
            except SystemExit as exc:
                out[job["name"]] = {"error": f"{stage}: argparse exit {exc.code}: {_last(err)}"}
            except Exception as exc:  # Megatron's own checks are asserts and ValueErrors
                message = str(exc).splitlines()[0][:200] if str(exc) else ""
                out[job["name"]] = {"error": f"{stage}: {type(exc).__name__}: {message}"}
            finally:
                os.environ.clear()
                os.environ.update(saved)
    json.dump(out, real_stdout)


def _last(stream: Any) -> str:
    lines = stream.getvalue().strip().splitlines()
    return lines[-1][:200] if lines else ""


def parse_with_megatron(tree: str, jobs: list[dict[str, Any]], gpu: str) -> dict[str, Any]:
    """Megatron-LM's ``parse_args`` + ``validate_args`` from the tree, for every job."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", tree, "--gpu", gpu]
    # Each case's environment is its own ENV_VARS on a clean launcher: what the caller's
    # process happens to export (a test that built megatron's tiny GPT in-process sets
    # CUDA_DEVICE_MAX_CONNECTIONS=1, which validate_args reads) must not change the answer.
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    proc = subprocess.run(cmd, input=json.dumps(jobs), capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"Megatron argument parser failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


# --------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------


def prepare_case(
    tree: str,
    family: str,
    name: str,
    gpu: str,
    golden: str,
    recipes: dict[str, int],
    megatron_core: str,
) -> dict[str, Any] | None:
    """One GPT-family case read from the tree: measured numbers, the megatron-core release
    that ran it, world size, argv and env for Megatron's parser; or, with a ``reason``, why it
    goes to the separate list. ``None`` when the case has no memory golden values."""
    case_dir = os.path.join(cases_root(tree), family, name)
    path = golden_file(case_dir, gpu, golden)
    if path is None:
        return None
    at = measured_at(family, name, path)
    case: dict[str, Any] = {
        "name": name,
        "family": family,
        "measured": measured(path),
        "megatron_core": at["megatron_core_version"] if at else megatron_core,
        # the release its container ran (None: the estimator's assumed one)
        "transformer_engine": at.get("transformer_engine_version") if at else None,
        "measured_at": at,
    }
    if at is None:
        case["notes"] = [
            "golden file not in Megatron-LM's history: estimated as the tree's release"
        ]
    config = load_case_config(case_dir)
    if str(config.get("MODE", "pretraining")) == "inference":
        return {**case, "reason": "inference-only case (MODE: inference)"}
    world, source = world_size(name, recipes)
    if world is None:
        return {**case, "reason": f"world size unknown: {source}"}
    case.update(world_size=world, world_size_source=source)
    case["argv"] = argv_from_model_args(config.get("MODEL_ARGS") or {})
    env = config.get("ENV_VARS") or {}
    case["env"] = {str(k): _env_value(v) for k, v in env.items()}
    return case


@functools.lru_cache(maxsize=4)
def _measured_at_records(path: str) -> dict[str, dict[str, str]]:
    """The committed records at ``path`` (read once: every case looks its file up)."""
    with open(path, encoding="utf-8") as f:
        records: dict[str, dict[str, str]] = json.load(f)["files"]
    return records


def measured_at(family: str, name: str, path: str) -> dict[str, str] | None:
    """Where the golden file at ``path`` was written (commit, date, megatron-core release,
    its path then), from the committed record when the file's bytes are the recorded ones;
    None otherwise."""
    import golden_history

    record = _measured_at_records(MEASURED_AT).get(f"{family}/{name}/{os.path.basename(path)}")
    with open(path, "rb") as f:
        blob = golden_history.blob_id(f.read())
    return record if record is not None and record["blob"] == blob else None


def write_measured_at(tree: str, git_dir: str, te_git_dir: str) -> int:
    """Record where every golden file of the tree's GPT families was written, and the
    megatron-core and Transformer Engine releases that ran it."""
    import golden_history

    written = golden_history.first_written(git_dir, MEASURED_AT_REF)
    files: dict[str, dict[str, str]] = {}
    versions: dict[str, str] = {}
    te: dict[str, tuple[str, str]] = {}
    root = cases_root(tree)
    for family in GPT_FAMILIES:
        for name in sorted(os.listdir(os.path.join(root, family))):
            for path in sorted(glob.glob(os.path.join(root, family, name, "golden_values*.json"))):
                with open(path, "rb") as f:
                    blob = golden_history.blob_id(f.read())
                if blob not in written:
                    continue
                # the run behind those bytes: an edit (of another field) may have written them
                commit, date, then, _ = golden_history.measuring_commit(git_dir, written, blob)
                if commit not in versions:
                    versions[commit] = golden_history.megatron_core_version(git_dir, commit)
                    te[commit] = golden_history.transformer_engine_version(
                        git_dir, te_git_dir, commit
                    )
                key = f"{family}/{name}/{os.path.basename(path)}"
                files[key] = {"blob": blob, "commit": commit, "date": date, "path": then,
                              "megatron_core_version": versions[commit],
                              "transformer_engine_version": te[commit][0],
                              "transformer_engine_source": te[commit][1]}  # fmt: skip
    with open(MEASURED_AT, "w", encoding="utf-8") as f:
        f.write(json_text({"repo": "NVIDIA/Megatron-LM", "files": files}))
    return len(files)


def estimate_cases(tree: str, cases: list[dict[str, Any]], gpu: str) -> list[dict[str, Any]]:
    """Parse every prepared case with Megatron's code (one subprocess), then estimate each."""
    jobs = [{k: c[k] for k in ("name", "argv", "env", "world_size")} for c in cases]
    parsed = parse_with_megatron(tree, jobs, gpu) if jobs else {}
    return [
        estimate_case(case, parsed[case["name"]], gpu, megatron_core=case["megatron_core"])
        for case in cases
    ]


def collect(tree: str, gpu: str, golden: str, substr: str | None) -> dict[str, Any]:
    """Every case with memory golden values: modelled rows and the rest with reasons."""
    root = cases_root(tree)
    recipes = recipe_world_sizes(tree)
    megatron_core, _ = versions(tree)  # the release whose functional tests these are
    skipped_families: dict[str, dict[str, Any]] = {}
    separate: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    for family in sorted(os.listdir(root)):
        for name in sorted(os.listdir(os.path.join(root, family))):
            if substr and substr not in name:
                continue
            if family not in GPT_FAMILIES:
                if golden_file(os.path.join(root, family, name), gpu, golden) is None:
                    continue
                entry = skipped_families.setdefault(
                    family,
                    {"reason": SKIPPED_FAMILIES.get(family, "not a GPTModel family"), "cases": []},
                )
                entry["cases"].append(name)
                continue
            case = prepare_case(tree, family, name, gpu, golden, recipes, megatron_core)
            if case is not None:
                (separate if "reason" in case else jobs).append(case)
    rows: list[dict[str, Any]] = []
    for result in estimate_cases(tree, jobs, gpu):
        (separate if "reason" in result else rows).append(result)
    return {"rows": rows, "separate": separate, "skipped_families": skipped_families}


def measured_gpu(golden_name: str, requested: str) -> str:
    """The GPU the golden file was measured on (``..._dgx_h100.json``), else ``requested``."""
    match = re.search(r"_dgx_([a-z0-9]+)\.json$", golden_name)
    return match.group(1) if match and match.group(1) in GPU_ARCH else requested


def optimizer_state_loaded(ns: Any) -> bool:
    """Whether the run's first step starts with the optimizer state a checkpoint holds:
    megatron/training/checkpointing.py ``load_checkpoint`` loads it for ``--load`` unless
    ``--finetune`` or ``--no-load-optim`` (``not release and not args.finetune and not
    args.no_load_optim``); without it Adam allocates its moments at the first step."""
    return bool(getattr(ns, "load", None)) and not (
        getattr(ns, "finetune", False) or getattr(ns, "no_load_optim", False)
    )


# the benchmark's moment column for peaks outside the forward/backward's own moments
STAGE_MOMENTS = {"cuda_graph_capture": "CUDA-graph capture", "rl_rollout": "RL rollout"}


def estimate_case(
    case: dict[str, Any],
    parsed: dict[str, Any],
    gpu: str = "h100",
    megatron_core: str | None = None,
) -> dict[str, Any]:
    """Our estimate for the case's last rank, or the case with the reason it is not one.

    The estimate is for the GPU the golden file names and the ``CUBLAS_WORKSPACE_CONFIG``
    the case's ``ENV_VARS`` export (both size the fixed workspaces), for the megatron-core
    release ``megatron_core`` that ran the case (``None``: the installed one, as the args
    reader records it) and the Transformer Engine release ``case["transformer_engine"]``
    (absent: the estimator's assumed one)."""
    from memscope.analysis.log_check import moment_estimate
    from memscope.analysis.static.coverage import not_modelled
    from memscope.analysis.static.estimator import estimate_rank, position_of_rank
    from memscope.inputs.megatron_args import spec_from_megatron_args

    env = case.get("env") or {}
    given = {a[2:].replace("-", "_") for a in case.get("argv") or [] if a.startswith("--")}
    case = {k: v for k, v in case.items() if k not in ("argv", "env")}
    if "error" in parsed:
        return {**case, "reason": f"Megatron's argument code refused it: {parsed['error']}"}
    ns = types.SimpleNamespace(**parsed)
    reason = not_modelled_feature(ns)
    if reason:
        return {**case, "reason": reason}
    vocab, vocab_source = tokenizer_vocab(ns)
    if vocab is None:
        return {**case, "reason": vocab_source}
    ns.vocab_size = vocab
    ns.padded_vocab_size = None  # Megatron pads the tokenizer's vocabulary after parsing
    try:
        spec = spec_from_megatron_args(ns, megatron_core=megatron_core)
        spec = dataclasses.replace(
            spec,
            device="cuda",
            gpu=measured_gpu(case["measured"]["golden_file"], gpu),
            cublas_workspace_config=env.get("CUBLAS_WORKSPACE_CONFIG"),
            transformer_engine_version=case.get("transformer_engine"),
        )
        rank = case["world_size"] - 1
        position = position_of_rank(spec, rank)
        est = estimate_rank(spec, position)
    except ValueError as exc:
        return {**case, "reason": f"refused by the estimator: {exc}"}
    m = case["measured"]
    persistent, peak = est.steady_bytes, est.peak_memory_bytes
    peak_stage = est.peak_stage
    peak_moment = STAGE_MOMENTS.get(peak_stage, est.activations.peak_moment)
    if m["iterations"][1] == 1 and not optimizer_state_loaded(ns):
        # one logged step: its peak is the first step's, whose forward/backward ran before
        # the optimizer's moments existed (log_check.moment_estimate, as analyze-log reads it)
        first = moment_estimate(spec, est, 1)
        peak, peak_stage, peak_moment = first.peak_bytes, "first_step", first.label
    d_persistent = persistent - m["steady_bytes"]
    d_transient = (peak - persistent) - (m["peak_bytes"] - m["steady_bytes"])
    term = "steady" if abs(d_persistent) >= abs(d_transient) else "transient"
    p = spec.parallel
    return {
        **case,
        "rank": rank,
        "tp_rank": position.tp_rank,
        "pp_rank": position.pp_rank,
        "parallel": {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "vpp": p.vpp},
        "dtype": spec.precision.params_dtype,
        "vocab": {"tokenizer": vocab, "source": vocab_source, "padded": spec.model.vocab_size},
        "estimate": {
            "persistent_bytes": est.persistent.total_bytes,
            "steady_bytes": persistent,
            "workspace_bytes": est.workspace_bytes,
            "buffer_bytes": est.activations.buffer_bytes,
            "retained_input_bytes": est.retained_input_bytes,
            "weight_bytes": est.persistent.weight_bytes,
            "grad_bytes": est.persistent.grad_bytes,
            "optimizer_bytes": est.persistent.optimizer_bytes,
            "peak_bytes": peak,
            "peak_stage": peak_stage,
            "peak_moment": peak_moment,
        },
        "ratio": peak / m["peak_bytes"],
        "error": (peak - m["peak_bytes"]) / m["peak_bytes"],
        "steady_diff_bytes": d_persistent,
        "transient_diff_bytes": d_transient,
        "most_differing_term": term,
        # what the estimator itself warns it does not model for these flags (the coverage
        # footer of its report): such a case is measured but outside the band
        "warned": sorted(
            {
                item.key
                for item in not_modelled({k: getattr(ns, k) for k in given if hasattr(ns, k)}, spec)
            }
        ),
        "notes": case.get("notes", []),
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {"cases": 0}
    worst = max(rows, key=lambda r: abs(r["error"]))
    # the band: cases whose flags the estimator claims to model whole (it warns of nothing)
    claimed = [r for r in rows if not r.get("warned")]
    band = max(claimed, key=lambda r: abs(r["error"])) if claimed else worst
    return {
        "cases": len(rows),
        "worst_error": worst["error"],
        "worst_case": worst["name"],
        "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
        "over_5_percent": sum(abs(r["error"]) > 0.05 for r in rows),
        "over_10_percent": [r["name"] for r in rows if abs(r["error"]) > 0.10],
        "band_cases": len(claimed),
        "band_worst_error": band["error"],
        "band_worst_case": band["name"],
    }


def summary_file(s: dict[str, Any]) -> dict[str, Any]:
    """What the package reads (``memscope.analysis.static.accuracy``): the last line's
    figures."""
    return {
        "source": "benchmarks/static_gpu_golden.txt (tools/bench_static_gpu_golden.py --write)",
        "cases": s["cases"],
        "worst_error": s["worst_error"],
        "worst_case": s["worst_case"],
        "median_abs_error": s["median_abs_error"],
        "over_5_percent": s["over_5_percent"],
        "over_10_percent": len(s["over_10_percent"]),
        "band_cases": s["band_cases"],
        "band_worst_error": s["band_worst_error"],
        "band_worst_case": s["band_worst_case"],
    }


def summary_module(s: dict[str, Any]) -> str:
    """:func:`summary_file` as the generated Python module the package imports (analysis reads
    no files), formatted as ``ruff format`` leaves it."""
    lines = [
        '"""The GPU benchmark\'s summary: the figures of ``benchmarks/static_gpu_golden.txt``\'s',
        "last line (:mod:`.accuracy` reads them).",
        "",
        "Generated by ``python tools/bench_static_gpu_golden.py --write``: do not edit;",
        "``tests/test_gpu_benchmark_fresh.py`` fails when it differs from a fresh run.",
        '"""',
        "",
        "SUMMARY: dict[str, int | float | str] = {",
    ]
    for key, value in sorted(summary_file(s).items()):
        line = f"    {json.dumps(key)}: {json.dumps(value)},"
        lines.append(line if len(line) <= 100 else f"{line}  # noqa: E501 (a case's name)")
    return "\n".join([*lines, "}", ""])


def committed_paths() -> dict[str, str]:
    """Where ``--write`` puts the results (txt, json, the package's summary)."""
    root = os.path.dirname(HERE)
    return {
        "txt": os.path.join(root, "benchmarks", "static_gpu_golden.txt"),
        "json": os.path.join(root, "benchmarks", "static_gpu_golden.json"),
        "summary": os.path.join(root, "memscope", "analysis", "static", "gpu_benchmark_summary.py"),
    }


def json_text(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def write_committed(result: dict[str, Any]) -> None:
    """Write the txt, json and summary that the repository commits."""
    paths = committed_paths()
    outputs = {
        "txt": render(result) + "\n",
        "json": json_text(result),
        "summary": summary_module(result["summary"]),
    }
    for key, text in outputs.items():
        with open(paths[key], "w", encoding="utf-8") as f:
            f.write(text)


def short_release(version: str) -> str:
    """``0.15.0rc5`` -> ``0.15``: the release a table column shows."""
    return ".".join(version.split(".")[:2])


def release_counts(rows: list[dict[str, Any]]) -> str:
    """How many modelled cases each megatron-core release measured, as docs/static-estimator.md
    words it (``of the 119 modelled cases 2 were written on 0.11, 33 on 0.12, ...``)."""
    counts: dict[tuple[int, ...], int] = {}
    for r in rows:
        key = tuple(int(x) for x in r["megatron_core"].split(".")[:2])
        counts[key] = counts.get(key, 0) + 1
    parts = [f"{n} {'were written ' if i == 0 else ''}on {a}.{b}"
             for i, ((a, b), n) in enumerate(sorted(counts.items()))]  # fmt: skip
    text = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    return f"of the {len(rows)} modelled cases {text}"


def _gib(n: float) -> str:
    return f"{n / GIB:7.2f}"


def render(result: dict[str, Any]) -> str:
    rows, lines = result["rows"], []
    lines.append(
        f"# memory golden values of Megatron-LM {result['megatron']} functional tests "
        f"(FlagScale {result['flagscale']} wheel), last rank, device=cuda; "
        f"requested golden={result['golden']} gpu={result['gpu']}; each estimated for the "
        "megatron-core release that wrote its golden values (mcore: "
        "tests/data/flagscale_golden_measured_at.json)"
    )
    lines.append(
        "# GiB; steady = mem-allocated-bytes at the last logged iteration, peak = max "
        "mem-max-allocated-bytes; est = ours for that rank; term = where ours differs most "
        "(steady: est steady - steady; transient: (est peak - est steady) - (peak - steady)); "
        "est steady = weights + gradients + optimizer state + fixed cuBLAS/TE workspaces + "
        "megatron's global buffer (+ fp16 fp32 gradient copies) + the last pipeline input and "
        "its gradient each model chunk keeps; the GPU is the golden file's"
    )
    header = (
        f"{'case':<100} {'golden':<10} {'mcore':>5} {'world':>5} {'rank':>4} {'tp,pp':>5} "
        f"{'steady':>7} {'peak':>7} {'est.stdy':>8} {'est.peak':>8} {'ratio':>6} {'error':>7} "
        f"{'term':<10} {'diff':>7}  notes"
    )
    lines.append(header)
    for r in rows:
        m, e = r["measured"], r["estimate"]
        diff = r[f"{r['most_differing_term']}_diff_bytes"]
        golden = m["golden_file"].replace("golden_values_", "").replace(".json", "")
        golden = golden.replace("_dgx_", "/")
        lines.append(
            f"{r['family'] + '/' + r['name']:<100} {golden:<10} "
            f"{short_release(r['megatron_core']):>5} {r['world_size']:>5} "
            f"{r['rank']:>4} {r['tp_rank']:>2},{r['pp_rank']:<2} "
            f"{_gib(m['steady_bytes'])} {_gib(m['peak_bytes'])} "
            f"{_gib(e['steady_bytes']):>8} {_gib(e['peak_bytes']):>8} "
            f"{r['ratio']:6.2f} {r['error'] * 100:+6.1f}% {r['most_differing_term']:<10} "
            f"{diff / GIB:+7.2f}  "
            f"{', '.join(r['notes'])}"
        )
    lines.append("")
    lines.append(f"listed separately (not modelled): {len(result['separate'])} cases")
    for s in result["separate"]:
        lines.append(f"  {s['family']}/{s['name']}: {s['reason']}")
    lines.append("skipped families (cases with memory golden values):")
    for family, entry in sorted(result["skipped_families"].items()):
        lines.append(f"  {family} ({len(entry['cases'])} cases): {entry['reason']}")
    s = result["summary"]
    lines.append("")
    if s["cases"]:
        lines.append(
            f"modelled: {s['cases']} cases; worst: {s['worst_case']}; "
            "median is of |estimate - measured| / measured peak; "
            f"{s['over_5_percent']} cases beyond 5%, {len(s['over_10_percent'])} beyond 10%"
            + (f" ({', '.join(s['over_10_percent'])})" if s["over_10_percent"] else "")
        )
        warned = [r for r in rows if r.get("warned")]
        lines.append(
            f"band (the {s['band_cases']} cases setting nothing the estimator warns it does not "
            f"model): worst {100 * s['band_worst_error']:+.1f}% ({s['band_worst_case']}); "
            f"{len(warned)} cases set such a feature: "
            + (", ".join(f"{r['name']} ({', '.join(r['warned'])})" for r in warned) or "none")
        )
        lines.append(
            f"worst: {100 * s['worst_error']:+.1f}%  median: {100 * s['median_abs_error']:.1f}%"
        )
    else:
        lines.append("worst: n/a  median: n/a (no case modelled)")
    return "\n".join(lines)


def versions(tree: str) -> tuple[str, str]:
    info = os.path.join(tree, "third_party", "Megatron-LM", "megatron", "core", "package_info.py")
    ns: dict[str, Any] = {}
    try:
        with open(info, encoding="utf-8") as f:
            exec(compile(f.read(), info, "exec"), ns)
    except OSError:
        pass
    from flagscale_wheel import VERSION

    return str(ns.get("__version__", "?")), VERSION


def run(tree: str, gpu: str = "h100", golden: str = "dev", substr: str | None = None) -> dict:
    result = collect(tree, gpu, golden, substr)
    megatron, flagscale = versions(tree)
    result.update(gpu=gpu, golden=golden, megatron=megatron, flagscale=flagscale)
    result["summary"] = summary(result["rows"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="OUT", help="write machine-readable results")
    parser.add_argument("--filter", metavar="SUBSTR", help="only cases whose name contains it")
    parser.add_argument("--gpu", choices=sorted(GPU_ARCH), default="h100")
    parser.add_argument("--golden", choices=("dev", "lts"), default="dev")
    parser.add_argument("--tree", help="FlagScale root (default: tools/flagscale_wheel.py)")
    parser.add_argument(
        "--write", action="store_true", help="regenerate the committed results (all cases)"
    )
    parser.add_argument(
        "--measured-at", metavar="GIT_DIR", help="re-record where each golden file was written"
    )
    parser.add_argument(
        "--te-git",
        metavar="GIT_DIR",
        help="with --measured-at: a Transformer Engine git directory (the releases' versions)",
    )
    parser.add_argument("--_worker", metavar="TREE", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts._worker:
        _worker(opts._worker, opts.gpu)
        return 0
    if opts.tree:
        tree = opts.tree
    else:
        from flagscale_wheel import flagscale_tree

        tree = flagscale_tree()
    if opts.measured_at:
        if not opts.te_git:
            parser.error("--measured-at needs --te-git")
        count = write_measured_at(tree, opts.measured_at, opts.te_git)
        print(f"recorded {count} golden files in {os.path.relpath(MEASURED_AT)}")
        return 0
    if opts.write and (opts.filter or opts.gpu != "h100" or opts.golden != "dev"):
        parser.error("--write regenerates the committed run: no --filter, --gpu or --golden")
    result = run(tree, opts.gpu, opts.golden, opts.filter)
    print(render(result))
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as f:
            f.write(json_text(result))
    if opts.write:
        write_committed(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
