"""Static estimate vs published GPU memory of models the estimator was not developed on.

The first benchmark (``tools/bench_static_gpu_golden.py``) reads the functional-test cases
the FlagScale 0.8.0 wheel ships. This one reads cases published elsewhere; each case names
its source (repository, commit and path, or a URL). Only small excerpts are committed
(``tests/data/published_cases.json``: the training flags, the environment the run exports,
the world size with where it came from, the measured steady allocation and peak), never the
source files themselves.

Source today: NVIDIA/Megatron-LM's main branch (commit in ``SOURCE_COMMIT``, megatron-core
0.20): every GPT, MoE and Mixtral functional-test case there that trains (not ``MODE:
inference``) and has ``golden_values_*.json`` memory of the last rank
(``mem-allocated-bytes``/``mem-max-allocated-bytes``, see the first benchmark's docstring for
what they are). That is the FlagScale tree's cases re-measured on 0.20 under their main-branch
names, and the cases new since (``FEATURE_CASES``: MLA + MoE with the ``recompute_modules``
choices, DeepSeek-V3 proxy, Muon, fine-grained offloading, FP8 current scaling, MoE under CP,
op-fuser grouped GEMM, the 7B memory_speed runs), which the output also sums up on their own.

    python tools/bench_static_published.py [--json OUT]
    python tools/bench_static_published.py --extract GIT_DIR   # refresh the excerpts

``--extract`` reads every such case at ``SOURCE_COMMIT`` from a Megatron-LM git directory
(the ``fetch`` of github:NVIDIA/Megatron-LM) and rewrites the data file.

Each case is parsed by Megatron-LM's own argument code (FlagScale 0.8.0's tree, Megatron-LM
0.15, as the first benchmark does) and estimated for the last rank. Flags newer than that code
are ignored by its parser, except those the estimator reads (``NEWER_FLAGS``), which are set on
the parsed arguments afterwards as Megatron-LM at ``SOURCE_COMMIT`` sets them
(``megatron/training/arguments.py``, the ``TransformerConfig`` fields it exposes):

- Muon: the 0.15 parser refuses ``--optimizer muon``, so the case is parsed with ``adam`` and
  the optimizer set afterwards as ``validate_args`` at that commit does: ``muon`` with
  ``--use-distributed-optimizer`` (or the deprecated ``dist_muon``) is the layer-wise
  distributed optimizer (``use_layer_wise_distributed_optimizer``, the distributed optimizer
  switched off), our ``dist_muon``; without it plain Muon. ``--muon-tp-mode`` defaults to
  ``duplicated`` there. ``--no-use-layer-wise-param-layout`` (a ``store_false`` switch)
  clears ``use_layer_wise_param_layout``: the layer-wise optimizer's ping-pong split instead of
  the precomputed bucket layout (``analysis/static/muon.py``).
- Fine-grained activation offloading: ``--fine-grained-activation-offloading``,
  ``--offload-modules``, ``--min-offloaded-tensor-size`` (``TransformerConfig`` fields).
- Megatron-FSDP's main-gradient dtype: ``--megatron-fsdp-main-grads-dtype`` (``auto``: the
  parameters' dtype).
- CUDA graphs: ``--cuda-graph-impl`` and ``--cuda-graph-modules`` (the 0.15 parser knows
  ``--external-cuda-graph`` and ``--cuda-graph-scope`` instead; ``--cuda-graph-warmup-steps``
  it knows).
- A newer flag the estimator warns it does not model (``coverage.NOT_MODELLED``) is set from
  its words, so the case's ``warned`` list names it.

A case whose world size is not public (the release cases, which run from NVIDIA's private
recipes, and one case no recipe ran) is estimated at every world size its flags admit
(:func:`world_candidates`) and shown at the one whose estimated steady allocation is nearest the
measured, with every candidate's steady error; those cases are summed up on their own line,
outside the headline figures, since one number of theirs (the steady allocation) chose the
world size. Their tokenizer files are not public, their vocabularies are
(``bench_static_gpu_golden.PUBLIC_VOCABULARIES``).

A case the estimator refuses is listed with its reason: none is dropped. Nothing is tuned to
these numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_static_gpu_golden as golden  # noqa: E402
import golden_history  # noqa: E402
from golden_history import git as _git  # noqa: E402

ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "tests", "data", "published_cases.json")
SOURCE_REPO = "NVIDIA/Megatron-LM"
SOURCE_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
CASES_DIR = "tests/functional_tests/test_cases"
FAMILIES = ("gpt", "moe", "mixtral")  # GPTModel's families (the first benchmark's)
# (family, case): new in Megatron-LM main relative to the FlagScale 0.8.0 tree, or (the last
# three) kept there but re-measured on main: the features the first benchmark lacks, summed
# up on their own. Every other training case at SOURCE_COMMIT is in the benchmark too.
FEATURE_CASES = (
    ("gpt", "gpt3_7b_tp1_pp4_memory_speed"),
    ("gpt", "gpt3_7b_tp4_pp1_memory_speed"),
    ("gpt", "gpt3_15b_8t_release_sm_gb200"),
    ("gpt", "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"),
    ("gpt", "gpt3_weekly_mcore_tp4_cp2_current_scaling_native_fp8_tp_sp_cp_tp_overlap"),
    ("mixtral", "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release"),
    ("moe", "deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap"),
    ("moe", "gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic"),
    ("moe", "gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser"),
    ("moe", "gpt3_mcore_tp2_cp2_pp2_ep2_te_4experts2parallel"),
    ("moe", "gpt3_mcore_tp2_pp2_ep2_etp2_te_4experts2parallel"),
    ("moe", "gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel"),
    ("moe", "gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon"),
    ("moe", "gpt3_moe_mcore_te_ep8_resume_torch_dist_muon"),
    ("moe", "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading"),
    ("moe", "gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph"),
    ("moe", "gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental"),
    ("moe", "gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4"),
    ("gpt", "gpt3_mcore_te_tp2_pp2_mla"),
)
# Flags of Megatron-LM at SOURCE_COMMIT that the 0.15 parser does not know and the estimator
# reads: (flag, parsed name, default there). See the module docstring.
NEWER_FLAGS = (
    ("--muon-tp-mode", "muon_tp_mode", "duplicated"),
    ("--fine-grained-activation-offloading", "fine_grained_activation_offloading", False),
    ("--offload-modules", "offload_modules", []),
    ("--min-offloaded-tensor-size", "min_offloaded_tensor_size", 1024 * 1024),
    # Megatron-FSDP's main-gradient buffer dtype (arguments.py, "auto": the parameters')
    ("--megatron-fsdp-main-grads-dtype", "megatron_fsdp_main_grads_dtype", "auto"),
    # CUDA graphs (arguments.py at SOURCE_COMMIT; the 0.15 parser has --external-cuda-graph
    # and --cuda-graph-scope instead)
    ("--cuda-graph-impl", "cuda_graph_impl", "none"),
    ("--cuda-graph-modules", "cuda_graph_modules", []),
    # the RL loop's inference engine (analysis/static/rl.py; a size of 0: not given, None
    # there)
    ("--inference-dynamic-batching-paused-buffer-size-gb",
     "inference_dynamic_batching_paused_buffer_size_gb", 0.0),
    ("--inference-dynamic-batching-block-size", "inference_dynamic_batching_block_size", 256),
    ("--inference-dynamic-batching-unified-memory-level",
     "inference_dynamic_batching_unified_memory_level", 0),
    ("--rl-kv-cache-management-mode", "rl_kv_cache_management_mode", "persist"),
    ("--rl-inference-tensor-model-parallel-size", "rl_inference_tensor_model_parallel_size", 0),
    ("--rl-inference-pipeline-model-parallel-size",
     "rl_inference_pipeline_model_parallel_size", 0),
    ("--rl-inference-expert-model-parallel-size", "rl_inference_expert_model_parallel_size", 0),
    ("--rl-inference-expert-tensor-model-parallel-size",
     "rl_inference_expert_tensor_model_parallel_size", 0),
    ("--rl-inference-model-unified-memory-level", "rl_inference_model_unified_memory_level", 0),
    ("--rl-offload-inference-model-weights-when-idle",
     "rl_offload_inference_model_weights_when_idle", False),
    ("--rl-persist-cuda-graphs", "rl_persist_cuda_graphs", False),
    ("--num-speculative-tokens", "num_speculative_tokens", 0),
    ("--decode-only-cuda-graphs", "decode_only_cuda_graphs", False),
    ("--inference-dynamic-batching-max-requests", "inference_dynamic_batching_max_requests", 0),
    ("--inference-dynamic-batching-max-tokens", "inference_dynamic_batching_max_tokens", 0),
    ("--inference-dynamic-batching-cuda-graph-mixed-prefill-count",
     "inference_dynamic_batching_cuda_graph_mixed_prefill_count", 16),
)  # fmt: skip
FEATURE_NAMES = frozenset(name for _, name in FEATURE_CASES)
MUON = ("muon", "dist_muon")
# Why a release case has no world size: none of the public recipes lists it; NVIDIA runs its
# release cases from a private recipe repository (.gitlab/stages/03.convergence-tests.yml at
# Megatron-LM 4a756e24 adds ADLR/megatron-lm-convergence-tests as the submodule
# tests/functional_tests/local_recipes and runs $MODEL/$VARIANT.sh from it).
RELEASE_WORLD_SIZE = (
    "not public: a TEST_TYPE release case, listed by no recipe under tests/test_utils/recipes; "
    "release cases run from NVIDIA's private convergence-test recipes (Megatron-LM@4a756e24 "
    ".gitlab/stages/03.convergence-tests.yml)"
)
# Which run of a checkpoint-consistency case its golden values are (Megatron-LM's harness at
# the commit that measured it): run_ci_test.sh runs MODEL_ARGS, MODEL_ARGS_2, ... in the order
# ``yq keys`` lists them (the file's order), each on the GPUs per node its MODEL_ENV_VARS entry
# gives (_run_training.sh ``--nproc_per_node $GPUS_PER_NODE``, ``--nnodes`` the recipe's
# nodes), all into one TensorBoard directory; get_test_results_from_tensorboard_logs.py
# (``--is-normal-test``, not a second run) reads index 0 of the events files sorted by
# modification time (common.py ``read_tb_logs_as_list``): the first run's, MODEL_ARGS.
CONSISTENCY_RUN = (
    "TEST_TYPE checkpoint-consistency: its {runs} configurations run in turn into one "
    "TensorBoard log; the golden values are the first events file's (common.py "
    "read_tb_logs_as_list index 0, by modification time), the first run's: MODEL_ARGS, "
    "GPUS_PER_NODE {gpus} (MODEL_ENV_VARS) x {nodes} node(s) ({recipe})"
)
# A release case's world size is inferred (see :func:`world_candidates`): the GPUs of whole
# nodes of the machines its golden file names (DGX H100/A100: 8 each), up to this many.
NODE_GPUS = 8
MAX_INFERRED_WORLD = 4096
INFERRED_WORLD_SIZE = (
    "inferred: of the world sizes its flags admit in whole {node}-GPU nodes (micro batch x "
    "data parallel dividing each global batch size the run steps with) and Megatron's "
    "argument checks and the estimator take, the one whose estimated steady allocation is "
    "nearest the measured"
)
GIB = 1024**3


# --------------------------------------------------------------------------------------
# Extracting the excerpts from a Megatron-LM git directory
# --------------------------------------------------------------------------------------


def _golden_path(files: list[str]) -> str | None:
    """The golden file the first benchmark would pick (dev/h100 first), by name only."""
    order = [
        "golden_values_dev_dgx_h100.json",
        "golden_values_dev_dgx_a100.json",
        "golden_values_lts_dgx_h100.json",
        "golden_values_lts_dgx_a100.json",
    ]
    for name in order:
        if name in files:
            return name
    return None


RECIPES_ROOT = "tests/test_utils/recipes"


def _recipe_world_sizes(git_dir: str, commit: str) -> dict[str, tuple[int, str]]:
    """Case name -> (world size, where it came from) for every recipe under
    :data:`RECIPES_ROOT` at ``commit`` whose spec gives ``nodes`` and ``gpus``
    (:func:`bench_static_gpu_golden.read_recipes` reads them)."""
    paths = _git(git_dir, "ls-tree", "-r", "--name-only", commit, RECIPES_ROOT + "/").split()
    files = [(p, _git(git_dir, "show", f"{commit}:{p}")) for p in paths if p.endswith(".yaml")]
    out: dict[str, tuple[int, str]] = {}
    for case, (world, path, commented) in golden.read_recipes(files).items():
        where = f"{path}@{commit[:10]} nodes x GPUs per node"
        out[case] = (world, f"{where} (commented-out entry)" if commented else where)
    return out


def measured_at(
    git_dir: str, path: str, written: dict[str, tuple[str, str, str]] | None = None
) -> tuple[str, str, str, list[str]]:
    """Where the golden values file at ``path`` (as of :data:`SOURCE_COMMIT`) was measured
    (:func:`golden_history.measuring_commit`): the commit, its date, the file's path then, and
    the paths it had on the way, oldest first. ``written``:
    :func:`golden_history.first_written`, read once for many files."""
    written = (
        written if written is not None else golden_history.first_written(git_dir, SOURCE_COMMIT)
    )
    blob = _git(git_dir, "rev-parse", f"{SOURCE_COMMIT}:{path}").strip()
    return golden_history.measuring_commit(git_dir, written, blob)


def _literal(source: str) -> Any:
    """A default's source text as a value: a literal, or a product/sum of numbers
    (``1024 * 1024``); None for anything else (a name, a call)."""
    import ast

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
            left, right = value(node.left), value(node.right)
            return left * right if isinstance(node.op, ast.Mult) else left + right
        raise ValueError(ast.dump(node))

    try:
        return value(ast.parse(source.strip(), mode="eval").body)
    except (SyntaxError, ValueError, TypeError):
        return None


def arguments_at(git_dir: str, commit: str) -> dict[str, Any]:
    """What Megatron-LM's argument code at ``commit`` (``megatron/training/arguments.py``)
    gives for :data:`NEWER_FLAGS`: the default of each flag it declares with a literal
    default (``--muon-tp-mode`` was ``blockwise`` until 2026-08), and whether it has the
    layer-wise optimizer's bucket layout (``--no-use-layer-wise-param-layout``, from
    0044db1f20). A flag declared otherwise there (generated from ``TransformerConfig``'s
    fields, as the offloading and CUDA-graph flags are) or not at all, or with a default that
    is no literal, keeps the source commit's default."""
    text = _git(git_dir, "show", f"{commit}:megatron/training/arguments.py")
    defaults: dict[str, Any] = {}
    for flag, name, _ in NEWER_FLAGS:
        pattern = r"add_argument\(\s*'" + re.escape(flag) + r"'[^)]*?default=([^,)]+)"
        match = re.search(pattern, text)
        value = _literal(match.group(1)) if match else None
        if value is not None:
            defaults[name] = value
    return {
        "defaults": defaults,
        "layer_wise_param_layout": "'--no-use-layer-wise-param-layout'" in text,
    }


def _world_size(
    name: str, then: str, names: list[str], recipes_then: dict, recipes_now: dict
) -> tuple[int | None, str]:
    """The case's world size, from what named or ran it when it was measured: the name it
    had then (``NxG``), a recipe of that commit, its name now, a recipe of
    :data:`SOURCE_COMMIT`, then the name of any path the file had on the way (``names``)."""
    for label, candidate in (("when measured", then), ("now", name)):
        world, source = golden.world_size(candidate, {})
        if world is not None:
            return world, f"{source} ({label}: {candidate})"
        recipes = recipes_then if label == "when measured" else recipes_now
        if candidate in recipes:
            world, where = recipes[candidate]
            return world, f"{where} ({label}: {candidate})"
    for path in names:
        world, source = golden.world_size(path, {})
        if world is not None:
            return world, f"{source} (a name on the way: {path})"
    return None, "neither NxG in the name nor a recipe listing the case"


def consistency_world_size(
    config: dict[str, Any], recipe_world: int | None, recipe_source: str
) -> tuple[int, str]:
    """The world size of the run a checkpoint-consistency case's golden values are
    (:data:`CONSISTENCY_RUN`): MODEL_ARGS's ``GPUS_PER_NODE`` times the recipe's nodes (its
    nodes times GPUs per node over a DGX node's :data:`NODE_GPUS`)."""
    if recipe_world is None or recipe_world % NODE_GPUS:
        raise ValueError(f"checkpoint-consistency case without a DGX recipe: {recipe_source}")
    runs = [k for k in config if re.fullmatch(r"MODEL_ARGS(_\d+)?", str(k))]
    if not runs or runs[0] != "MODEL_ARGS":  # yq keys: the file's order
        raise ValueError(f"checkpoint-consistency case whose first run is not MODEL_ARGS: {runs}")
    launch = (config.get("MODEL_ENV_VARS") or {}).get("MODEL_ARGS", {})
    gpus = int(launch.get("GPUS_PER_NODE", golden.LAUNCH_DEFAULT_GPUS_PER_NODE))
    nodes = recipe_world // NODE_GPUS
    source = CONSISTENCY_RUN.format(runs=len(runs), gpus=gpus, nodes=nodes, recipe=recipe_source)
    return gpus * nodes, source


def training_cases(git_dir: str) -> list[tuple[str, str]]:
    """(family, case) of every case of :data:`FAMILIES` at ``SOURCE_COMMIT`` with a golden
    values file, sorted."""
    paths = _git(git_dir, "ls-tree", "-r", "--name-only", SOURCE_COMMIT, CASES_DIR + "/").split()
    found = set()
    for path in paths:
        parts = path[len(CASES_DIR) + 1 :].split("/")
        if len(parts) == 3 and parts[0] in FAMILIES and _golden_path([parts[2]]):
            found.add((parts[0], parts[1]))
    return sorted(found)


def extract(git_dir: str, te_git_dir: str) -> list[dict[str, Any]]:
    """The committed excerpt of every training case :func:`training_cases` finds whose
    golden values record memory (a ``MODE: inference`` case is left out: they hold no
    training memory). Each case's configuration, environment and megatron-core release are
    read at the commit that wrote its golden values (:func:`measured_at`), not at
    :data:`SOURCE_COMMIT`: flags added to a case since were never measured; so is the
    Transformer Engine release its container ran (``te_git_dir``: a Transformer Engine git
    directory, :func:`golden_history.transformer_engine_version`)."""
    import tempfile

    import yaml

    written = golden_history.first_written(git_dir, SOURCE_COMMIT)
    recipes: dict[str, dict[str, tuple[int, str]]] = {}
    versions: dict[str, str] = {}
    te: dict[str, tuple[str, str]] = {}
    arguments: dict[str, dict[str, Any]] = {}

    def recipes_at(commit: str) -> dict[str, tuple[int, str]]:
        if commit not in recipes:
            recipes[commit] = _recipe_world_sizes(git_dir, commit)
        return recipes[commit]

    out = []
    for family, name in training_cases(git_dir):
        folder = f"{CASES_DIR}/{family}/{name}"
        files = [
            os.path.basename(p)
            for p in _git(git_dir, "ls-tree", "--name-only", SOURCE_COMMIT, folder + "/").split()
        ]
        golden_name = _golden_path(files)
        assert golden_name is not None, name
        commit, date, measured_path, names = measured_at(
            git_dir, f"{folder}/{golden_name}", written
        )
        config_path = measured_path.rsplit("/", 1)[0] + "/model_config.yaml"
        config = yaml.safe_load(_git(git_dir, "show", f"{commit}:{config_path}"))
        if str(config.get("MODE", "pretraining")) == "inference":
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, golden_name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(_git(git_dir, "show", f"{commit}:{measured_path}"))
            if not golden._has_memory(path):  # its golden values record no memory
                continue
            measured = golden.measured(path)
        then = measured_path.rsplit("/", 2)[1]
        world, source = _world_size(
            name, then, names, recipes_at(commit), recipes_at(SOURCE_COMMIT)
        )
        if world is None and config.get("TEST_TYPE") == "release":
            source = RELEASE_WORLD_SIZE
        if config.get("TEST_TYPE") == "checkpoint-consistency":
            world, source = consistency_world_size(config, world, source)
        if commit not in versions:
            versions[commit] = golden_history.megatron_core_version(git_dir, commit)
            te[commit] = golden_history.transformer_engine_version(git_dir, te_git_dir, commit)
            arguments[commit] = arguments_at(git_dir, commit)
        out.append(
            {
                "family": family,
                "name": name,
                "source": {
                    "repo": SOURCE_REPO,
                    "commit": commit,
                    "date": date,
                    "megatron_core_version": versions[commit],
                    "transformer_engine_version": te[commit][0],
                    "transformer_engine_source": te[commit][1],
                    "config": config_path,
                    "measured": measured_path,
                    "listed_at": f"{SOURCE_COMMIT}:{folder}",
                    "arguments": arguments[commit],
                },
                "mode": str(config.get("MODE", "pretraining")),
                "world_size": world,
                "world_size_source": source,
                "model_args": config.get("MODEL_ARGS") or {},
                "env_vars": {
                    str(k): golden._env_value(v) for k, v in (config.get("ENV_VARS") or {}).items()
                },
                "measured": measured,
            }
        )
    return out


# --------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------


def load_cases(path: str = DATA) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    cases: list[dict[str, Any]] = data["cases"]
    return cases


def _flag_values(argv: list[str], flag: str) -> list[str] | None:
    """The words after ``flag`` on the command line up to the next flag; None if absent."""
    if flag not in argv:
        return None
    rest = argv[argv.index(flag) + 1 :]
    end = next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))
    return rest[:end]


def parser_argv(argv: list[str]) -> list[str]:
    """The command line given to the 0.15 parser: ``--optimizer muon``/``dist_muon`` read as
    ``adam`` (that parser refuses both; :func:`with_newer_flags` sets the optimizer)."""
    out = list(argv)
    if (_flag_values(argv, "--optimizer") or [""])[0] in MUON:
        out[argv.index("--optimizer") + 1] = "adam"
    return out


def with_newer_flags(
    argv: list[str], parsed: dict[str, Any], arguments: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The parsed arguments with what Megatron-LM sets from the flags the 0.15 parser does
    not know (``NEWER_FLAGS``, the Muon optimizer): as ``arguments`` says its argument code
    did at the commit that measured the case (:func:`arguments_at`), else as at
    ``SOURCE_COMMIT``; or only a ``reason`` saying why the estimator cannot take the case."""
    arguments = arguments or {}
    defaults = arguments.get("defaults", {})
    out = dict(parsed)
    for flag, name, default in NEWER_FLAGS:
        words = _flag_values(argv, flag)
        if words is None:
            out.setdefault(name, defaults.get(name, default))
        elif isinstance(default, bool):
            out[name] = True  # a store_true switch
        elif isinstance(default, list):
            out[name] = words  # nargs='+'
        else:
            out[name] = type(default)(words[0])
    from memscope.analysis.static.coverage import NOT_MODELLED

    for name in NOT_MODELLED:  # newer flags the estimator warns of: named in ``warned``
        words = _flag_values(argv, "--" + name.replace("_", "-"))
        if name not in out and words is not None:
            out[name] = words[0] if len(words) == 1 else (words or True)
    optimizer = (_flag_values(argv, "--optimizer") or [""])[0]
    if optimizer in MUON:
        # arguments.py validate_args ("emerging optimizer check") at SOURCE_COMMIT
        layer_wise = optimizer == "dist_muon" or bool(parsed.get("use_distributed_optimizer"))
        # --no-use-layer-wise-param-layout (store_false, unknown to the 0.15 parser), or no
        # such flag where the case ran (before Megatron-LM 0044db1f20): the legacy ping-pong
        # split instead of the precomputed bucket layout
        layout = _flag_values(argv, "--no-use-layer-wise-param-layout") is None and bool(
            arguments.get("layer_wise_param_layout", True)
        )
        out.update(
            optimizer="dist_muon" if layer_wise else "muon",
            use_distributed_optimizer=False,
            use_layer_wise_param_layout=layout,
        )
    return out


def imbalance_range(
    case: dict[str, Any], parsed: dict[str, Any], megatron_core: str | None = None
) -> dict[str, Any] | None:
    """For a dropless MoE case: the token-imbalance bound (``moe.imbalance_bound``) and our
    peak at it, the other end of the range the report gives (the benchmark's error uses the
    default assumption, balanced routing); and the imbalance independent per-token routing
    reaches at most at the run's busiest logged step (``moe.routing_drift``, for one MoE
    layer's draw: an upper bound) with our peak at it."""
    import types

    from memscope.analysis.static.moe import imbalance_bound, routing_drift

    experts = parsed.get("num_experts")
    factor = parsed.get("moe_expert_capacity_factor")
    if not experts or (factor is not None and float(factor) >= 0):
        return None
    shape = types.SimpleNamespace(
        model=types.SimpleNamespace(num_experts=experts, moe_router_topk=parsed["moe_router_topk"]),
        parallel=types.SimpleNamespace(
            ep=parsed.get("expert_model_parallel_size") or 1,
            expert_tp=parsed.get("expert_tensor_parallel_size") or 1,
        ),
    )
    bound = imbalance_bound(shape)  # type: ignore[arg-type]
    at_bound = golden.estimate_case(
        case, {**parsed, "moe_token_imbalance": bound}, megatron_core=megatron_core
    )
    tp = parsed.get("tensor_model_parallel_size") or 1
    sp = tp if parsed.get("sequence_parallel") else 1
    cp = parsed.get("context_parallel_size") or 1
    tokens = parsed["seq_length"] // cp // sp * parsed["micro_batch_size"]
    steps = case["measured"]["iterations"][1]
    drift = routing_drift(shape, tokens, 1, steps)  # type: ignore[arg-type]
    at_drift = golden.estimate_case(
        case, {**parsed, "moe_token_imbalance": drift}, megatron_core=megatron_core
    )
    return {
        "bound": bound,
        "peak_bytes": at_bound["estimate"]["peak_bytes"],
        "drift": drift,
        "drift_peak_bytes": at_drift["estimate"]["peak_bytes"],
    }


# Model-shaping fields ``--use-checkpoint-args`` takes from the checkpoint when the flags leave
# them out (megatron/training/checkpointing.py ``load_args_from_checkpoint``; most with
# ``force=True``, so the checkpoint's value wins): a case leaving any out has an architecture
# its published flags do not give.
CHECKPOINT_ARCHITECTURE = (
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--num-query-groups", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--normalization",
)  # fmt: skip
CHECKPOINT_MOE_ARCHITECTURE = (
    "--moe-layer-freq", "--moe-ffn-hidden-size", "--moe-router-topk",
    "--moe-shared-expert-intermediate-size",
)  # fmt: skip


def architecture_from_checkpoint(model_args: dict[str, Any]) -> list[str]:
    """The model-shaping flags a ``--use-checkpoint-args`` case leaves to its checkpoint
    (:data:`CHECKPOINT_ARCHITECTURE`; the MoE ones with ``--num-experts``)."""
    if not model_args.get("--use-checkpoint-args"):
        return []
    wanted = CHECKPOINT_ARCHITECTURE
    if model_args.get("--num-experts"):
        wanted += CHECKPOINT_MOE_ARCHITECTURE
    return [flag for flag in wanted if flag not in model_args]


def _vocab_unknown(model_args: dict[str, Any]) -> str | None:
    """Why the case's vocabulary is unknown too (its tokenizer file is not public), if it is:
    a case without a world size is not parsed, so the tokenizer is read from its flags."""
    import types

    ns = types.SimpleNamespace(
        tokenizer_type=model_args.get("--tokenizer-type"),
        tokenizer_model=model_args.get("--tokenizer-model"),
        vocab_size=model_args.get("--vocab-size"),
    )
    vocab, source = golden.tokenizer_vocab(ns)
    if vocab is not None:
        return None
    return f"vocabulary unknown too: {source} ({model_args.get('--tokenizer-model')})"


def run_batch_sizes(model_args: dict[str, Any]) -> list[int] | None:
    """The global batch sizes a run steps with: ``--global-batch-size``, or with
    ``--rampup-batch-size START INCREMENT SAMPLES`` the ones the ramp reaches within
    ``--train-samples`` (megatron/core/num_microbatches_calculator.py: one increment per
    SAMPLES / increments samples); None without a global batch size (Megatron then takes
    micro batch x data parallel: any data-parallel size fits)."""
    if "--global-batch-size" not in model_args:
        return None
    final = int(model_args["--global-batch-size"])
    ramp = model_args.get("--rampup-batch-size")
    if not ramp:
        return [final]
    start, step, samples = (int(w) for w in str(ramp).strip("[]").replace(",", " ").split())
    increments = (final - start) // step
    reached = increments
    if "--train-samples" in model_args and increments:
        reached = min(increments, int(int(model_args["--train-samples"]) * increments / samples))
    return [start + k * step for k in range(reached + 1)]


def world_candidates(model_args: dict[str, Any]) -> list[int]:
    """World sizes a case's flags admit, for a case whose runs' world size is not public:
    tp x pp x cp x dp with micro batch x dp dividing every global batch size the run steps
    with (:func:`run_batch_sizes`; Megatron's ``num_microbatches_calculator`` checks it at
    each step), in whole :data:`NODE_GPUS`-GPU nodes, at most :data:`MAX_INFERRED_WORLD`;
    none when a size is not a number. Megatron's own argument checks (expert parallelism
    dividing the data-parallel ranks, ...) and the estimator's then drop the ones they
    refuse."""

    def size(flag: str) -> int:
        return int(model_args.get(flag, 1))

    try:
        model = size("--tensor-model-parallel-size") * size("--pipeline-model-parallel-size")
        model *= size("--context-parallel-size")
        micro = size("--micro-batch-size")
        batches = run_batch_sizes(model_args)
    except ValueError:  # a size left to the launch script (``${TP}``)
        return []
    return [
        model * dp
        for dp in range(1, MAX_INFERRED_WORLD // model + 1)
        if (model * dp) % NODE_GPUS == 0
        and all(b % (micro * dp) == 0 for b in batches or [micro * dp])
    ]


def _inferable(case: dict[str, Any]) -> bool:
    """A pretraining case whose world size is not public (a release case, or one no recipe
    lists), not one whose golden values mix several runs' world sizes."""
    return case["world_size"] is None and not case["world_size_source"].startswith("TEST_TYPE")


def _nearest_steady(
    name: str, estimates: dict[int, dict[str, Any]], measured_steady: int
) -> dict[str, Any]:
    """The candidate whose estimated steady allocation is nearest the measured one, with
    every candidate's steady error (``world_size_fit``) so the choice can be judged."""
    fits = {
        world: (e["estimate"]["steady_bytes"] - measured_steady) / measured_steady
        for world, e in estimates.items()
    }
    world = min(fits, key=lambda w: abs(fits[w]))
    chosen = estimates[world]
    chosen["world_size_source"] = INFERRED_WORLD_SIZE.format(node=NODE_GPUS)
    chosen["world_size_fit"] = {str(w): fits[w] for w in sorted(fits)}
    assert chosen["name"] == name
    return chosen


def _base(case: dict[str, Any]) -> dict[str, Any]:
    """What every listed case carries: its name, family, source and measurement."""
    return {k: case[k] for k in ("name", "family", "source", "measured")}


def run(tree: str, cases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    cases = load_cases() if cases is None else cases
    rows: list[dict[str, Any]] = []
    inferred: list[dict[str, Any]] = []
    separate: list[dict[str, Any]] = []
    jobs, prepared = [], []
    for c in cases:
        base = _base(c)
        if c["mode"] not in ("pretraining", "rl"):
            reason = f"MODE: {c['mode']}: not a training run the estimator models"
            separate.append({**base, "reason": reason})
            continue
        missing = architecture_from_checkpoint(c["model_args"])
        if missing:
            reason = (
                "architecture from a checkpoint that is not public (--use-checkpoint-args): "
                f"the flags leave out {', '.join(missing)}"
            )
            separate.append({**base, "reason": reason})
            continue
        vocab = _vocab_unknown(c["model_args"])
        if c["world_size"] is None and (vocab or not _inferable(c)):
            reason = f"world size unknown: {c['world_size_source']}"
            separate.append({**base, "reason": reason + (f"; {vocab}" if vocab else "")})
            continue
        argv = golden.argv_from_model_args(c["model_args"])
        worlds = [c["world_size"]] if c["world_size"] else world_candidates(c["model_args"])
        if not worlds:
            reason = (
                f"world size unknown: {c['world_size_source']}; and its flags admit none in "
                f"whole {NODE_GPUS}-GPU nodes up to {MAX_INFERRED_WORLD} GPUs"
            )
            separate.append({**base, "reason": reason})
            continue
        for world in worlds:
            job = {"name": f"{c['name']}@{world}", "argv": parser_argv(argv), "world_size": world}
            jobs.append(job | {"env": c["env_vars"]})
            prepared.append(
                {
                    **base,
                    "world_size": world,
                    "world_size_source": c["world_size_source"],
                    "argv": argv,
                    "env": c["env_vars"],
                    "transformer_engine": c["source"].get("transformer_engine_version"),
                    "job": job["name"],
                    "inferring": c["world_size"] is None,
                }
            )
    parsed = golden.parse_with_megatron(tree, jobs, "h100") if jobs else {}
    # inferred cases' estimates by world, with what their imbalance range is computed from
    candidates: dict[str, dict[int, dict[str, Any]]] = {}
    inputs: dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any], str]] = {}
    refusals: dict[str, list[str]] = {}
    for case in prepared:
        ns, inferring = parsed[case.pop("job")], case.pop("inferring")
        if "error" not in ns:
            ns = with_newer_flags(case["argv"], ns, case["source"].get("arguments"))
        # the estimate follows the release that ran the case, not the one installed here
        megatron_core = case["source"]["megatron_core_version"]
        result = (
            {k: v for k, v in case.items() if k not in ("argv", "env")} | {"reason": ns["reason"]}
            if "reason" in ns
            else golden.estimate_case(case, ns, megatron_core=megatron_core)
        )
        if not inferring:
            if "reason" in result:
                separate.append(result)
                continue
            result["imbalance_bound"] = imbalance_range(case, ns, megatron_core)
            rows.append(result)
        elif "reason" in result:
            refusals.setdefault(case["name"], []).append(
                f"{case['world_size']}: {result['reason']}"
            )
        else:
            candidates.setdefault(case["name"], {})[case["world_size"]] = result
            inputs[case["name"], case["world_size"]] = (case, ns, megatron_core)
    for c in cases:
        if c["name"] in candidates:
            chosen = _nearest_steady(
                c["name"], candidates[c["name"]], c["measured"]["steady_bytes"]
            )
            # the range of the chosen world size only: the other candidates are not shown
            chosen["imbalance_bound"] = imbalance_range(*inputs[c["name"], chosen["world_size"]])
            inferred.append(chosen)
        elif c["name"] in refusals:
            reason = "world size unknown, and every world size its flags admit is refused: "
            separate.append(_base(c) | {"reason": reason + "; ".join(refusals[c["name"]])})
    megatron, flagscale = golden.versions(tree)
    return {
        "source": {"repo": SOURCE_REPO, "commit": SOURCE_COMMIT},
        "parser": {"megatron": megatron, "flagscale": flagscale},
        "rows": rows,
        "inferred": inferred,
        "separate": separate,
        "summary": summary(rows, sum(1 for c in cases if not _inferable(c))),
        "inferred_summary": summary(inferred, sum(1 for c in cases if _inferable(c))),
        "features": summary(
            [r for r in rows if r["name"] in FEATURE_NAMES],
            sum(1 for c in cases if c["name"] in FEATURE_NAMES and not _inferable(c)),
        ),
    }


def summary(rows: list[dict[str, Any]], total: int) -> dict[str, Any]:
    out: dict[str, Any] = {"cases": total, "modelled": len(rows)}
    if rows:
        worst = max(rows, key=lambda r: abs(r["error"]))
        out.update(
            worst_error=worst["error"],
            worst_case=worst["name"],
            median_abs_error=statistics.median(abs(r["error"]) for r in rows),
            over_5_percent=[r["name"] for r in rows if abs(r["error"]) > 0.05],
        )
        ranged = [r for r in rows if r.get("imbalance_bound")]
        out["dropless_moe"] = len(ranged)
        out["within_imbalance_range"] = [
            r["name"]
            for r in ranged
            if r["estimate"]["peak_bytes"]
            <= r["measured"]["peak_bytes"]
            <= r["imbalance_bound"]["peak_bytes"]
        ]
        if ranged:
            widest = max(ranged, key=lambda r: r["imbalance_bound"]["drift"])
            out["largest_drift"] = widest["imbalance_bound"]["drift"]
            out["largest_drift_case"] = widest["name"]
            out["above_drift"] = [
                r["name"]
                for r in ranged
                if r["measured"]["peak_bytes"] > r["imbalance_bound"]["drift_peak_bytes"]
            ]
    return out


def doc_figures(s: dict[str, Any]) -> str:
    """The figures docs/static-estimator.md quotes, as this function words them."""
    if not s["modelled"]:
        return f"0 of {s['cases']} cases modelled"
    return (
        f"{s['modelled']} of {s['cases']} cases modelled, median |error| "
        f"{100 * s['median_abs_error']:.1f}%, worst {100 * s['worst_error']:+.1f}% "
        f"(`{s['worst_case']}`), {len(s['over_5_percent'])} beyond 5%"
    )


def _gib(n: float) -> str:
    return f"{n / GIB:7.2f}"


def _row(r: dict[str, Any]) -> str:
    """One estimated case as a line of the table."""
    m, e = r["measured"], r["estimate"]
    bound = r["imbalance_bound"]
    at_bound = _gib(bound["peak_bytes"]) if bound else f"{'-':>7}"
    at_drift = _gib(bound["drift_peak_bytes"]) if bound else f"{'-':>7}"
    term = r["most_differing_term"]
    return (
        f"{r['family'] + '/' + r['name']:<80} "
        f"{golden.short_release(r['source']['megatron_core_version']):>5} {r['world_size']:>5} "
        f"{r['tp_rank']:>2},{r['pp_rank']:<2} {_gib(m['steady_bytes'])} "
        f"{_gib(m['peak_bytes'])} {_gib(e['steady_bytes']):>8} {_gib(e['peak_bytes']):>8} "
        f"{r['error'] * 100:+6.1f}% {at_bound} {at_drift} {term:<9} "
        f"{r[term + '_diff_bytes'] / GIB:+6.2f}  {e['peak_moment']}"
        + (f"; warned: {', '.join(r['warned'])}" if r["warned"] else "")
    )


def render(result: dict[str, Any]) -> str:
    src, parser = result["source"], result["parser"]
    lines = [
        f"# published GPU memory: {src['repo']}@{src['commit'][:12]} functional-test golden "
        "values (last rank), each with its configuration and argument defaults at the commit "
        f"whose run wrote its numbers, parsed by Megatron-LM {parser['megatron']} (FlagScale "
        f"{parser['flagscale']}) and estimated for the megatron-core release of that commit "
        "(mcore: megatron/core/package_info.py there); GiB; steady = mem-allocated-bytes at "
        "the last logged iteration, peak = max mem-max-allocated-bytes; est = ours under "
        "balanced routing (moe_token_imbalance 1), @bound = ours at the imbalance bound of a "
        "dropless MoE case (the report's range), @drift = ours at the imbalance independent "
        "per-token routing reaches at most at the busiest logged step (moe.routing_drift, one "
        "layer's draw); term = where ours differs most (steady: est steady - steady; "
        "transient: (est peak - est steady) - (peak - steady)), diff its GiB; moment = where "
        "our peak falls; warned = what the estimator warns it does not model",
        f"{'case':<80} {'mcore':>5} {'world':>5} {'tp,pp':>5} {'steady':>7} {'peak':>7} "
        f"{'est.stdy':>8} {'est.peak':>8} {'error':>7} {'@bound':>7} {'@drift':>7} "
        f"{'term':<9} {'diff':>6}  moment",
    ]
    lines.extend(_row(r) for r in result["rows"])
    inferred = result["inferred"]
    lines.append("")
    how = INFERRED_WORLD_SIZE.format(node=NODE_GPUS)
    lines.append(
        f"world size not public ({len(inferred)} cases): {how} (world = that size; below "
        "each, every admitted world size with its steady error)"
    )
    for r in inferred:
        lines.append(_row(r))
        fits = ", ".join(f"{w} {100 * f:+.1f}%" for w, f in r["world_size_fit"].items())
        lines.append(f"    steady error by world size: {fits}")
    lines.append("")
    lines.append(f"listed separately: {len(result['separate'])} cases")
    for s in result["separate"]:
        lines.append(f"  {s['family']}/{s['name']}: {s['reason']}")
    lines.append("sources:")
    for r in [*result["rows"], *inferred, *result["separate"]]:
        src = r["source"]
        lines.append(
            f"  {r['name']}: {src['repo']}@{src['commit'][:12]} ({src['date']}, megatron-core "
            f"{src['megatron_core_version']}) {src['measured']}"
        )
    s = result["summary"]
    lines.append("")
    i = result["inferred_summary"]
    lines.append("world size not public, inferred from the steady allocation: " + doc_figures(i))
    if i.get("dropless_moe"):
        lines.append(
            "  of them dropless MoE: the measured peak lies between ours at balanced routing "
            f"and ours at the imbalance bound in {len(i['within_imbalance_range'])} of "
            f"{i['dropless_moe']}"
        )
    lines.append("the cases with a public world size:")
    if s["modelled"]:
        lines.append(
            f"modelled: {s['modelled']} of {s['cases']} cases; worst: {s['worst_case']}; "
            f"{len(s['over_5_percent'])} beyond 5%"
        )
        lines.append(
            f"dropless MoE: the measured peak lies between ours at balanced routing and ours at "
            f"the imbalance bound in {len(s['within_imbalance_range'])} of {s['dropless_moe']} "
            "cases"
        )
        if s.get("dropless_moe"):
            lines.append(
                "independent per-token routing (moe.routing_drift): at most "
                f"{100 * (s['largest_drift'] - 1):+.1f}% routed rows at the busiest logged step "
                f"({s['largest_drift_case']}); the measured peak is above ours at it in "
                f"{len(s['above_drift'])} of {s['dropless_moe']} cases"
            )
        lines.append(
            "the features new since the FlagScale tree (FEATURE_CASES): "
            + doc_figures(result["features"])
        )
        lines.append(
            f"worst: {100 * s['worst_error']:+.1f}%  median: {100 * s['median_abs_error']:.1f}%"
        )
    else:
        lines.append("worst: n/a  median: n/a (no case modelled)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="OUT", help="write machine-readable results")
    parser.add_argument("--tree", help="FlagScale root (default: tools/flagscale_wheel.py)")
    parser.add_argument("--extract", metavar="GIT_DIR", help="rewrite the excerpts from a git dir")
    parser.add_argument(
        "--te-git",
        metavar="GIT_DIR",
        help="with --extract: a Transformer Engine git directory (the releases' versions)",
    )
    opts = parser.parse_args(argv)
    if opts.extract:
        if not opts.te_git:
            parser.error("--extract needs --te-git")
        cases = extract(opts.extract, opts.te_git)
        _write_json(DATA, {"cases": cases, "listed_at": SOURCE_COMMIT})
        print(f"wrote {len(cases)} cases to {os.path.relpath(DATA, ROOT)}")
        return 0
    from flagscale_wheel import flagscale_tree

    result = run(opts.tree or flagscale_tree())
    print(render(result))
    if opts.json:
        _write_json(opts.json, result)
    return 0


def _write_json(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
