"""Static estimate vs measured per-rank peak on real megatron-core CPU training runs.

Each configuration of the matrix trains the tiny real megatron-core GPT (``memscope.demo``)
for a few steps in 1 or 2 gloo processes with the exact ``storage`` backend, which counts
every live tensor storage. For every rank the table shows the measured true peak, our
static estimate for that rank, and the worst-rank numbers of Megatron-LM's and FlagScale's
own formulas (``theoretical_memory_usage.py`` from the FlagScale 0.8.0 wheel, called
unmodified; they assume bf16 with fp32 gradients and Adam, so on these fp32 runs they show
what those formulas say, not a like-for-like model). The last line is our worst error.

    python tools/bench_static_accuracy.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import types
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The test suite's instrumented worker (tests/harness/); spawned workers inherit sys.path.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

import torch
from flagscale_wheel import flagscale_tree
from harness import instrumented_worker

from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition
from memscope.demo.launcher import free_port, spawn
from memscope.demo.tiny_gpt import TinyGPTConfig
from memscope.demo.traced_training import MINIMAL_ARGS_DROP, megatron_like_args
from memscope.inputs.megatron_args import spec_from_megatron_args

BASE: dict[str, Any] = dict(
    num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=128, micro_batch_size=2,
    num_microbatches=2,
)  # fmt: skip
# (name, world size, overrides of BASE)
MATRIX: list[tuple[str, int, dict[str, Any]]] = [
    ("base", 1, {}),
    ("gqa+swiglu", 1, dict(num_query_groups=2, swiglu=True)),
    ("selective", 1, dict(recompute="selective")),
    ("full-recompute", 1, dict(recompute="full")),
    # core_attn recompute with grouped keys: the query copy and the repeated key (g = 1 / g > 1)
    ("selective-mqa", 1, dict(recompute="selective", num_query_groups=1)),
    ("selective-gqa-h8g2", 1, dict(recompute="selective", num_attention_heads=8,
                                   num_query_groups=2)),
    ("seq256-b1", 1, dict(seq_length=256, micro_batch_size=1)),
    ("seq64-b4-h128", 1, dict(seq_length=64, micro_batch_size=4, hidden_size=128)),
    ("vocab4096", 1, dict(vocab_size=4096, seq_length=64)),
    ("dropout0.1", 1, dict(dropout=0.1)),
    ("tp2", 2, dict(tp=2)),
    ("tp2+sp", 2, dict(tp=2, sequence_parallel=True)),
    ("tp2+sp+gqa+swiglu", 2, dict(tp=2, sequence_parallel=True, num_query_groups=2, swiglu=True)),
    ("tp2+selective", 2, dict(tp=2, recompute="selective")),
    ("pp2-m4", 2, dict(pp=2, num_layers=4, num_microbatches=4)),
    ("pp2-m8-swiglu", 2, dict(pp=2, num_layers=4, num_microbatches=8, swiglu=True)),
    ("pp2-full", 2, dict(pp=2, num_layers=4, num_microbatches=4, recompute="full")),
    ("pp2-selective-gqa", 2, dict(pp=2, num_layers=4, num_microbatches=4, recompute="selective",
                                  num_query_groups=2)),
    ("pp2-vpp2-m4", 2, dict(pp=2, vpp=2, num_layers=4, num_microbatches=4)),
    # megatron-core's pipeline_model_parallel_layout: uneven stages, and uneven chunks under VPP
    ("pp2-layout", 2, dict(pp=2, num_layers=4, num_microbatches=4, pipeline_layout="Et|tttL")),
    ("pp2-vpp2-layout", 2, dict(pp=2, vpp=2, num_layers=5, num_microbatches=4,
                                pipeline_layout="Et|tt|t|tL")),
    # args lacking Megatron's fusion and transformer_impl keys (traced_training's
    # MINIMAL_ARGS_DROP), and no Megatron args at all (MemScopeTorchRuntime, batch sizes
    # passed as training=): the spec comes from the model
    ("minimal-args", 1, dict(num_query_groups=2, swiglu=True)),
    ("minimal-args-tp2+sp", 2, dict(tp=2, sequence_parallel=True)),
    ("no-args", 1, dict(num_query_groups=2, swiglu=True)),
    ("no-args-pp2-m4", 2, dict(pp=2, num_layers=4, num_microbatches=4)),
    ("no-args-pp2-layout", 2, dict(pp=2, num_layers=4, num_microbatches=4,
                                   pipeline_layout="Et|tttL")),
]  # fmt: skip
# how each configuration's runtime gets its Megatron args (traced_training.ARGS_MODES)
ARGS_MODE = {"minimal-args": "minimal", "minimal-args-tp2+sp": "minimal", "no-args": "none",
             "no-args-pp2-m4": "none", "no-args-pp2-layout": "none"}  # fmt: skip
QUICK = ("base", "gqa+swiglu", "full-recompute", "tp2+sp", "pp2-m4", "minimal-args", "no-args",
         "no-args-pp2-layout")  # fmt: skip
MIB = 1024 * 1024


def measure(name: str, world: int, overrides: dict[str, Any], steps: int = 3) -> list[dict]:
    """Train one configuration traced; one row per rank with measured and estimated peaks."""
    cfg = TinyGPTConfig(**{**BASE, **overrides})
    outdir = tempfile.mkdtemp(prefix=f"memscope-acc-{name}-")
    argv = ["--memscope", "--memscope-backend", "storage", "--memscope-outdir", outdir]
    mode = ARGS_MODE.get(name, "full")
    # by keyword: the harness's optional arguments are many, and a positional list that
    # falls one short hands the mode to another parameter (it once became the W&B folder,
    # so every row ran with full args)
    worker = functools.partial(instrumented_worker, megatron_args=mode)
    results = spawn(world, worker, free_port(), cfg, steps, argv)
    rows = []
    for res in results:
        assert res.report_path is not None
        with open(res.report_path, encoding="utf-8") as f:
            report = json.load(f)
        peak, meta = report["peak"], report["metadata"]
        rows.append(
            {
                "config": name,
                "world": world,
                "rank": res.rank,
                "tp_rank": meta.get("tp_rank") or 0,
                "pp_rank": meta.get("pp_rank") or 0,
                "measured": int(peak["memory_bytes"]),
                "measured_where": f"{peak.get('phase')} {peak.get('module')}",
                "measured_categories": peak.get("categories") or {},
                "param_bytes": res.param_bytes,
                "optimizer_state_bytes": res.optimizer_state_bytes,
                "in_report": report["comparisons"].get("static_peak_memory_bytes"),
                "args_mode": mode,
                "spec_inputs": report["comparisons"].get("spec_inputs"),
                "spec_sources": report["comparisons"].get("spec_sources"),
                "disagreements": report["comparisons"].get("spec_disagreements"),
            }
        )
    for row in rows:
        check_args_mode(row)
    return rows


def check_args_mode(row: dict) -> None:
    """The run's in-run spec came from the Megatron args its mode says: some keys from the
    args in a full run, none of ``MINIMAL_ARGS_DROP`` from them in a minimal one, nothing from
    args at all without them (the report's ``spec_sources``)."""
    sources = row.get("spec_sources") or {}
    from_args = {k for k, v in sources.items() if v == "args"}
    mode, where = row["args_mode"], (row["config"], row["rank"])
    if mode == "none":
        assert sources and not from_args, (where, sorted(from_args))
    elif mode == "minimal":
        assert from_args and not from_args & set(MINIMAL_ARGS_DROP), (where, sorted(from_args))
    else:
        assert from_args, where


def _estimate(source: Any, row: dict) -> Any:
    spec = dataclasses.replace(spec_from_megatron_args(source), device="cpu")
    return estimate_rank(spec, RankPosition(row["tp_rank"], row["pp_rank"]))


def estimate(rows: list[dict]) -> None:
    """Add our per-rank estimate (and its error) to measured rows: from the full Megatron
    args, or, for a run given minimal or no args, from the inputs its report says the in-run
    spec was built from (the model's settings first); ``args_only`` is what those minimal
    args alone would give."""
    overrides = {name: o for name, _, o in MATRIX}
    for row in rows:
        cfg = TinyGPTConfig(**{**BASE, **overrides[row["config"]]})
        args = megatron_like_args(cfg, [])
        args.world_size = row["world"]
        mode = row.get("args_mode", "full")
        if mode == "full":
            est = _estimate(args, row)
        else:
            est = _estimate({**row["spec_inputs"], "world_size": row["world"]}, row)
        if mode == "minimal":
            for name in MINIMAL_ARGS_DROP:
                delattr(args, name)
            alone = _estimate(args, row).peak_memory_bytes
            row["args_only_error"] = (alone - row["measured"]) / row["measured"]
        row.update(
            ours=est.peak_memory_bytes,
            error=(est.peak_memory_bytes - row["measured"]) / row["measured"],
            ours_where=f"{est.peak_stage} {est.activations.peak_moment}",
            exact_params=est.persistent.weight_bytes == row["param_bytes"],
            exact_optimizer=est.persistent.optimizer_bytes == row["optimizer_state_bytes"],
            _args=args,
        )


def _load_formula(path: str, package: str) -> types.ModuleType:
    """Import ``theoretical_memory_usage.py`` unmodified (its ``.utils`` import satisfied)."""
    pkg = types.ModuleType(package)
    pkg.__path__ = []  # type: ignore[attr-defined]
    utils = types.ModuleType(f"{package}.utils")
    utils.print_rank_0 = lambda *a, **k: None  # type: ignore[attr-defined]
    sys.modules[package], sys.modules[f"{package}.utils"] = pkg, utils
    spec = importlib.util.spec_from_file_location(f"{package}.theoretical_memory_usage", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Args(types.SimpleNamespace):
    """Megatron args for the formulas: unset options read as None (Megatron's default)."""

    def __getattr__(self, name: str) -> Any:
        return None


def formula_args(args: argparse.Namespace, cfg_world: int) -> _Args:
    """The attributes the two formulas read, in Megatron's names."""
    heads = args.num_attention_heads
    values = {k: v for k, v in vars(args).items() if not k.startswith("memscope")}
    values.update(
        kv_channels=args.hidden_size // heads,
        ffn_hidden_size=args.ffn_hidden_size or 4 * args.hidden_size,
        num_query_groups=args.num_query_groups or heads,
        group_query_attention=bool(args.num_query_groups),
        data_parallel_size=cfg_world // (args.tensor_model_parallel_size
                                         * args.pipeline_model_parallel_size),
        use_distributed_optimizer=False, is_hybrid_model=False, multi_latent_attention=False,
        add_bias_linear=True, moe_layer_freq=1, mtp_num_layers=None, num_experts=None,
    )  # fmt: skip
    return _Args(**values)


def formulas(rows: list[dict], tree: str | None) -> None:
    """Fill each row's ``megatron`` / ``flagscale`` with the formulas' totals (bytes)."""
    if tree is None:
        return
    mega = _load_formula(
        os.path.join(tree, "third_party/Megatron-LM/megatron/training/theoretical_memory_usage.py"),
        "_megatron_formula",
    )
    flag = _load_formula(
        os.path.join(tree, "flagscale/train/theoretical_memory_usage.py"), "_flagscale_formula"
    )
    by_config: dict[str, list[dict]] = {}
    for row in rows:
        by_config.setdefault(row["config"], []).append(row)
    for group in by_config.values():
        args = group[0]["_args"]
        fa = formula_args(args, len(group))
        m = args.num_microbatches
        weights = mega.compute_weight_and_optimizer_memory(fa)
        if fa.sequence_parallel and fa.recompute_granularity == "selective":
            act = mega.compute_activation_memory(fa, m)
        else:
            act = mega.compute_activation_memory_without_sp(fa, m)
        fs = flag.compute_weight_and_optimizer_memory(fa) + flag.compute_activation_memory(fa, m)
        for row in group:
            row["megatron"], row["flagscale"] = int(weights + act), int(fs)


def _mib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / MIB:8.3f}"


def print_table(rows: list[dict]) -> None:
    """One line per rank; the last line is our worst error."""
    head = (
        f"{'config':20s} {'rank':>4s} {'tp':>2s} {'pp':>2s} {'measured':>9s} {'ours':>9s} "
        f"{'err':>7s} {'act%':>5s} {'megatron':>9s} {'flagscale':>9s}  exact"
    )
    print(head + "\n" + "-" * len(head))
    for r in rows:
        share = r["measured_categories"].get("activations", 0) / r["measured"] * 100
        exact = "params+opt" if r["exact_params"] and r["exact_optimizer"] else "NO"
        print(
            f"{r['config']:20s} {r['rank']:4d} {r['tp_rank']:2d} {r['pp_rank']:2d} "
            f"{_mib(r['measured'])} {_mib(r['ours'])} {r['error'] * 100:+6.2f}% {share:4.0f}% "
            f"{_mib(r.get('megatron'))} {_mib(r.get('flagscale'))}  {exact}"
        )
    print("(MiB; act% = activations' share of the measured peak; megatron/flagscale: worst rank)")
    for r in rows:
        if "args_only_error" in r:
            print(
                f"{r['config']} rank {r['rank']}: from its minimal args alone (no model) the "
                f"estimate would be {r['args_only_error'] * 100:+.2f}% off"
            )
        for d in r.get("disagreements") or []:
            print(f"{r['config']} rank {r['rank']}: model and args disagree on {d}")
    print(worst_line(rows))


def worst_line(rows: list[dict]) -> str:
    """The table's last line: our worst error over the rows."""
    worst = max(rows, key=lambda r: abs(r["error"]))
    return (
        f"worst error: {worst['error'] * 100:+.2f}% ({worst['config']}, rank {worst['rank']}) "
        f"over {len(rows)} ranks in {len({r['config'] for r in rows})} configurations"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--only", nargs="*", help="configuration names to run")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--measured", help="re-estimate the rows of an earlier --json run")
    parser.add_argument("--verbose", action="store_true", help="where each peak is")
    parser.add_argument("--no-formulas", action="store_true", help="skip the FlagScale wheel")
    ns = parser.parse_args(argv)
    names = set(ns.only or (QUICK if ns.quick else [n for n, _, _ in MATRIX]))
    rows: list[dict] = []
    if ns.measured:
        with open(ns.measured, encoding="utf-8") as f:
            rows = [r for r in json.load(f)["rows"] if r["config"] in names]
    else:
        for name, world, overrides in MATRIX:
            if name in names:
                rows += measure(name, world, overrides)
                print(f"measured {name}", file=sys.stderr)
    estimate(rows)
    tree = None
    if not ns.no_formulas:
        try:
            tree = flagscale_tree()
        except RuntimeError as exc:
            print(f"formulas skipped: {exc}", file=sys.stderr)
    formulas(rows, tree)
    mcore = importlib.metadata.version("megatron-core")
    print(f"# python tools/bench_static_accuracy.py  (torch {torch.__version__}, megatron-core "
          f"{mcore}, {os.cpu_count()} CPU cores)")  # fmt: skip
    print("# measured: exact storage backend, true per-rank peak over 3 steps; ours: memscope "
          "static estimator for that rank (in-run inputs for minimal-/no-args rows)")  # fmt: skip
    if ns.measured:
        print(f"# re-estimated from the measurements in {os.path.basename(ns.measured)}")
    print_table(rows)
    if ns.verbose:
        for r in rows:
            print(f"{r['config']:20s} r{r['rank']} measured at {r['measured_where']}; "
                  f"ours at {r['ours_where']}")  # fmt: skip
    if ns.json:
        # a full-args row is re-estimated from its args; the others from their in-run inputs
        drop = {"spec_inputs"}
        clean = [
            {k: v for k, v in r.items() if not k.startswith("_")
             and (k not in drop or r.get("args_mode", "full") != "full")}
            for r in rows
        ]  # fmt: skip
        with open(ns.json, "w", encoding="utf-8") as f:
            json.dump({"rows": clean, "matrix": [dataclasses.asdict(TinyGPTConfig(**{**BASE, **o}))
                                                 for _, _, o in MATRIX]}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
