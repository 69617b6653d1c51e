"""The results of a GPU pass (``tools/gpu_checks.sh``), read from what it wrote, every estimate
recomputed by the estimator as it is now.

Reads RUN_DIR (``benchmarks/gpu/<gpu>_<date>/``: the pass's log, the runtime check's output,
the megatron-core JSON results, the overhead lines), ``examples/flagscale_gpu_e2e/`` (the
end-to-end run's report and Megatron log) and ``tests/data/gpu_e2e_snapshot/`` (its allocator
snapshot). Measured numbers come from those files; estimates are made now (the accuracy
cases from their Megatron args, the end-to-end run from its FlagScale YAML and from its own
log through ``memscope analyze-log``), so a change of the estimator changes this output and
``tests/test_gpu_results.py`` asks for it to be regenerated:

    RUN=benchmarks/gpu/h100_2026-11-28; python tools/gpu_results.py $RUN > $RUN/summary.txt
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
from typing import Any

TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)

E2E = os.path.join(REPO, "examples", "flagscale_gpu_e2e")
E2E_YAML = os.path.join(REPO, "configs", "flagscale", "memscope_tiny_gpt.yaml")
SNAPSHOT = os.path.join(
    REPO, "tests", "data", "gpu_e2e_snapshot", "memory_snapshot_steps1-2.pickle"
)
OVERHEAD_LINE = re.compile(
    r"overhead r(\d+) (.+?): off ([\d.]+) ms on ([\d.]+) ms ratio ([\d.]+)"
)  # fmt: skip
CHECK_LINE = re.compile(r"^(ok  |FAIL) (.+?): (.*)$")
MiB = 2**20
sys.path.insert(0, REPO)
from memscope.events.file_names import LOG_REPORT_NAMES, REPORT_NAME, STATIC_REPORT_NAME  # noqa: E402

LOG_REPORT = LOG_REPORT_NAMES[0]


def _load(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _mib(n: float) -> str:
    return f"{n / MiB:,.1f}"


def _pct(ours: float, measured: float) -> str:
    return f"{100 * (ours - measured) / measured:+.1f}%"


def _cli(argv: list[str]) -> None:
    """Run a memscope command in-process, its printing swallowed; exit 0 asserted."""
    from memscope.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    assert code == 0, (argv, code)


def header(run_dir: str) -> list[str]:
    env = _load(os.path.join(run_dir, "gpu_megatron_accuracy.json"))["environment"]
    with open(os.path.join(run_dir, "gpu_checks.log"), encoding="utf-8") as f:
        smi = f.read().splitlines()[1]
    return [
        f"GPU pass of {env['date']}: {smi} (nvidia-smi: name, memory, driver)",
        f"torch {env['torch']} (CUDA {env['cuda']}), Python {env['python']}, "
        f"megatron-core {env['megatron_core']} (local spec, no Transformer Engine or apex)",
        f"raw results: {os.path.relpath(run_dir, REPO)}/; estimates below are recomputed now",
    ]


def runtime_checks(run_dir: str) -> list[str]:
    out = ["", "1. Runtime correctness (tools/gpu_runtime_check.py: 8-layer bf16 torch stack)"]
    with open(os.path.join(run_dir, "runtime_check.txt"), encoding="utf-8") as f:
        for line in f:
            m = CHECK_LINE.match(line.rstrip())
            if m:
                out.append(f"   {m.group(1).strip():4} {m.group(2)}: {m.group(3)[:110]}")
            elif line.startswith("overhead"):
                out.append(f"   {line.strip()}")
    losses = _load(os.path.join(run_dir, "gpu_megatron_losses.json"))["losses"]
    first, before, traced = (losses["max_allocated"][k] for k in ("off", "off_again", "on"))
    untraced, again, on = (losses["losses"][k] for k in ("off", "off_again", "on"))
    out += [
        "   megatron-core GPT (base case, deterministic algorithms, tools/gpu_megatron_check.py "
        "--sections losses):",
        f"     untraced runs repeat bitwise: {untraced == again}; traced losses == untraced: "
        f"{on == again} (last {on[-1]!r})",
        f"     Megatron's max allocated per step, traced == the untraced run before it: "
        f"{traced == before} ({', '.join(str(x) for x in traced)})",
        f"     (the process's first run read {first[0] - before[0]:+,} bytes at step 0: what "
        "a process allocates once and keeps)",
    ]
    return out


def accuracy(run_dir: str) -> list[str]:
    from gpu_megatron_check import CASES, args_estimate, megatron_args

    rows = _load(os.path.join(run_dir, "gpu_megatron_accuracy.json"))["accuracy"]
    out = [
        "",
        "3. Static estimate vs measured, megatron-core bf16 training on one GPU (3 steps each)",
        "   measured = torch.cuda.max_memory_allocated() over the run; runtime = the report's peak",
        "   The runs shared one process and each traced run kept its state (fixed in 1317847): "
        "'before' is what",
        "   earlier runs held when the case started, 'own' = measured - before. Only the first "
        "case ran clean; the",
        "   others' own peak lacks what the process allocated once and kept (cuBLAS "
        "workspaces and more: the",
        "   estimate's steady part exceeds their measured steady part by the 'kept' column), "
        "so their error",
        "   lies between 'err own' and 'err own+kept'.",
        f"   {'case':<26}{'measured':>10}{'runtime':>9}{'before':>10}{'own':>10}"
        f"{'estimate':>10}{'err own':>9}{'kept':>8}{'err own+kept':>14}  peak moment",
    ]
    by_name = {case.name: case for case in CASES}
    for row in rows:
        if "error" in row:
            out.append(f"   {row['case']:<26} failed: {row['error'][:90]}")
            continue
        case = by_name[row["case"]]
        est = args_estimate(megatron_args(case, ["--memscope"]))
        measured, before = row["measured_peak"], row["allocated_before"]
        own = measured - before
        kept = 0 if before == 0 else est.steady_bytes - row["measured_steady"]
        same = "==" if row["runtime_peak"] == measured else "!="
        out.append(
            f"   {row['case']:<26}{_mib(measured):>10}{same:>9}{_mib(before):>10}{_mib(own):>10}"
            f"{_mib(est.peak_memory_bytes):>10}{_pct(est.peak_memory_bytes, own):>9}"
            f"{_mib(kept):>8}{_pct(est.peak_memory_bytes, own + kept):>14}  "
            f"{est.peak_stage} {est.activations.peak_moment}"
        )
    clean = rows[0]
    est = args_estimate(megatron_args(by_name[clean["case"]], ["--memscope"]))
    out.append(
        f"   first case, steady (allocated after a step): measured {_mib(clean['measured_steady'])}"
        f" MiB, estimate {_mib(est.steady_bytes)} MiB "
        f"({_pct(est.steady_bytes, clean['measured_steady'])}); weights "
        f"{_mib(est.persistent.weight_bytes)}, gradients {_mib(est.persistent.grad_bytes)}, "
        f"optimizer {_mib(est.persistent.optimizer_bytes)} MiB"
    )
    return out


def static_summary() -> dict:
    """``memscope analyze-static`` on the end-to-end run's YAML: its report's summary."""
    with tempfile.TemporaryDirectory() as tmp:
        _cli(["analyze-static", "--config", E2E_YAML, "--outdir", tmp])
        return _load(os.path.join(tmp, STATIC_REPORT_NAME))["summary"]


def end_to_end(summary: dict) -> tuple[list[str], list[str]]:
    """Sections 4 (the run) and 6 (its log against its report); ``summary``: the static
    estimate of its YAML."""
    static = summary["peak_memory_bytes"]
    report = _load(os.path.join(E2E, "rank00000", REPORT_NAME))
    steps = [s["peak_allocated"] for s in report["steps"]]
    with tempfile.TemporaryDirectory() as tmp:
        _cli(["analyze-log", os.path.join(E2E, "train_log.txt"), "--outdir", tmp])
        rank = _load(os.path.join(tmp, LOG_REPORT))["runs"][0]["ranks"][0]
    inrun = report["comparisons"]["static_peak_memory_bytes"]
    measured = report["peak"]["memory_bytes"]
    timeline = report["allocator_timeline"]["peak_bytes"]
    run = [
        "",
        "4. End to end: patched FlagScale 0.8.0 train_gpt.py, torchrun, 1 GPU, 6 steps "
        "(examples/flagscale_gpu_e2e/)",
        f"   status {report['status']}; peak {measured:,} bytes at step {report['peak']['step']} "
        f"({report['peak']['phase']}, {report['peak']['module']}); per-step peaks "
        f"{', '.join(f'{p:,}' for p in steps)}",
        f"   static estimate from the YAML (analyze-static) {static:,} ({_pct(static, measured)}); "
        f"the report's in-run estimate {inrun:,}",
        f"   allocator history at the peak (requested bytes, not rounded to 512-byte blocks): "
        f"{timeline:,} ({_pct(static, timeline)} for the estimate)",
    ]
    log = [
        "",
        "6. Log vs runtime: memscope analyze-log on the run's own Megatron log",
        f"   log 'max allocated' after iteration {rank['iteration']}: "
        f"{rank['measured']['max_allocated']:,} bytes; runtime report, step 0 peak: "
        f"{steps[0]:,} (equal: {rank['measured']['max_allocated'] == steps[0]})",
        f"   log's estimate at that moment {rank['estimate']['max_allocated_bytes']:,} "
        f"({_pct(rank['estimate']['max_allocated_bytes'], steps[0])}); its steady-state peak "
        f"{rank['estimate']['steady_peak_bytes']:,} (== the static estimate: "
        f"{rank['estimate']['steady_peak_bytes'] == static})",
    ]
    return run, log


def overhead(run_dir: str) -> list[str]:
    out = [
        "",
        "2. Overhead: megatron-core GPT bf16, 1.1B parameters (20 x 2048, seq 2048, 4 "
        "micro-batches of 1), one off/on pair per mode",
    ]
    with open(os.path.join(run_dir, "megatron_overhead.txt"), encoding="utf-8") as f:
        text = f.read()
    for m in OVERHEAD_LINE.finditer(text):
        out.append(f"   {m.group(2):<32} off {m.group(3)} ms  on {m.group(4)} ms  ratio "
                   f"{m.group(5)}")  # fmt: skip
    if "OutOfMemoryError" in text:
        out.append("   the second repeat ran out of memory: the traced runs' kept state "
                   "(fixed in 1317847)")  # fmt: skip
    return out


#: the allocator-history composition's categories -> the static report's summary fields
TERMS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("parameters", ("parameters",), ("weight_memory_bytes",)),
    ("gradients", ("gradients",), ("grad_memory_bytes",)),
    ("optimizer (main params + states)", ("main_params", "optimizer_state"),
     ("optimizer_memory_bytes",)),
    ("activations + buffers", ("activations", "buffers"),
     ("activation_memory_bytes", "temporary_memory_bytes")),
    ("before the window (workspaces)", ("other",), ("workspace_memory_bytes",)),
)  # fmt: skip


def fixture(summary: dict) -> list[str]:
    """Section 5: the snapshot's composition at its peak against the estimate's terms
    (``summary``: the static estimate of the run's YAML)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in os.listdir(os.path.dirname(SNAPSHOT)):
            os.symlink(os.path.join(os.path.dirname(SNAPSHOT), name), os.path.join(tmp, name))
        path = os.path.join(tmp, os.path.basename(SNAPSHOT))
        _cli(["analyze-snapshot", "--snapshot", path])
        peak = _load(path[: -len(".pickle")] + ".peak.json")
    size = os.path.getsize(SNAPSHOT)
    return [
        "",
        "5. Fixture: the end-to-end run's allocator history, steps 1-2 "
        f"({os.path.relpath(SNAPSHOT, REPO)}, {size:,} bytes)",
        f"   analyze-snapshot: {peak['events']:,} events, peak {peak['peak_allocated_bytes']:,} "
        f"bytes, {peak['inconsistencies']} inconsistencies; what was live at that peak against "
        "the static estimate's terms:",
    ] + [
        f"   {name:<34}{_term(peak, cats):>14,} measured {_term(summary, keys):>14,} estimated "
        f"({_pct(_term(summary, keys), _term(peak, cats))})"
        for name, cats, keys in TERMS
    ]


def _term(source: dict, keys: tuple[str, ...]) -> int:
    """A static summary's fields, or a snapshot composition's categories, summed."""
    if "composition" not in source:
        return sum(int(source[k]) for k in keys)
    items = source["composition"]["items"]
    return sum(int(i["bytes"]) for i in items if i["category"] in keys)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not os.path.isdir(args[0]):
        print("usage: python tools/gpu_results.py RUN_DIR", file=sys.stderr)
        return 2
    run_dir = os.path.abspath(args[0])
    lines = header(run_dir) + runtime_checks(run_dir) + overhead(run_dir) + accuracy(run_dir)
    summary = static_summary()
    run, log = end_to_end(summary)
    lines += run + fixture(summary) + log
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
