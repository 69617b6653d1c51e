"""What one module or gradient event costs the host: MemScope's own Python per hook call.

On a GPU the hooks' host time is what slows a step (the first GPU pass: all hooks 2.1x, the
step callbacks alone 1.09x; ``benchmarks/gpu/h100_2026-11-28/summary.txt``): the kernels run
asynchronously, the hooks' Python does not. That Python is the same on any machine, so it is
measured here, on the CPU, apart from the backend's own cost:

* a plain PyTorch stack of ``--blocks`` blocks (Linear, LayerNorm, GELU, Linear) trains
  through :class:`~memscope.integrations.torch.MemScopeTorchRuntime` with the backend a user
  gets there (``storage`` on the CPU, ``cuda`` with ``--device cuda``), three ways,
  alternating: untraced, step callbacks only (no module or gradient hook: the backend's
  per-allocation ledger and the step boundaries) and all hooks (``--memscope-hook-steps 0``:
  every timed step records);
* per event = (all hooks - step callbacks only) / (events per step of all hooks - of the
  step callbacks), each run's fastest of ``--steps`` timed steps (the garbage collector off,
  as ``timeit`` has it: the code's cost without its or the machine's pauses), taken round by
  round
  and the median over ``--repeats`` rounds printed (with their range).

Usage::

    python tools/bench_hook_cost.py                      # ~30 s on 2 cores
    python tools/bench_hook_cost.py --profile            # + where the hook time goes
    python tools/bench_hook_cost.py --device cuda        # on a GPU: the cuda backend, whose
                                                         # allocator reading is included

The last line printed is ``per event: X us``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from memscope.integrations.torch import MemScopeTorchRuntime

OFF, STEPS_ONLY, ALL = "untraced", "step callbacks only", "all hooks"
NO_HOOKS = {"hook_modules": False, "hook_output_grads": False, "hook_param_grads": False}


class Block(torch.nn.Module):
    """A small pre-norm MLP block: four submodules (six parameters) and one residual."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.fc1 = torch.nn.Linear(hidden, 2 * hidden)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


def _model(blocks: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(Block(hidden) for _ in range(blocks)))


def _run(mode: str, args: argparse.Namespace, outdir: str, profile: bool = False) -> dict:
    """One training run; its median step time (s) and events per timed step."""
    model = _model(args.blocks, args.hidden).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(args.batch, args.hidden, device=args.device)
    settings: dict[str, Any] = dict(outdir=outdir, backend=_backend(args.device), hook_steps=0)
    if mode == STEPS_ONLY:
        settings.update(NO_HOOKS)
    ms = MemScopeTorchRuntime(model, opt, **settings) if mode != OFF else None
    times: list[float] = []
    events: list[int] = []
    prof = cProfile.Profile() if profile else None
    gc.collect()
    gc.disable()  # as timeit does: a collection of earlier runs' garbage is no hook's cost
    try:
        if ms is not None:
            ms.start()
        for step in range(args.warmup + args.steps):
            timed = step >= args.warmup
            before = ms.session.tracer.events_emitted if ms and ms.session.tracer else 0
            if prof is not None and timed:
                prof.enable()
            start = time.perf_counter()
            with ms.step(step) if ms is not None else contextlib.nullcontext():
                model(batch).square().mean().backward()
                with ms.optimizer_step() if ms is not None else contextlib.nullcontext():
                    opt.step()
                opt.zero_grad()
            if args.device == "cuda":
                torch.cuda.synchronize()  # the step's own kernels, not the next one's
            elapsed = time.perf_counter() - start
            if prof is not None and timed:
                prof.disable()
            if timed:
                times.append(elapsed)
                after = ms.session.tracer.events_emitted if ms and ms.session.tracer else 0
                events.append(after - before)
    finally:
        gc.enable()
        if ms is not None:
            ms.finalize()
    # the fastest step: what the code costs, without the collector's and the machine's pauses
    out: dict[str, Any] = {"step_s": min(times), "events": max(events)}
    if prof is not None:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats("memscope", 25)
        out["profile"] = text.getvalue()
    return out


def _backend(device: str) -> str:
    """The backend a user gets there: ``cuda`` on a GPU, ``storage`` on the CPU."""
    return "cuda" if device == "cuda" else "storage"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15, help="rounds of the three runs")
    parser.add_argument("--profile", action="store_true", help="cProfile one all-hooks run")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows: dict[str, list[dict]] = {OFF: [], STEPS_ONLY: [], ALL: []}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in rows:
                where = os.path.join(tmp, f"{mode.replace(' ', '_')}_{repeat}")
                rows[mode].append(_run(mode, args, where))
        profiled = _run(ALL, args, os.path.join(tmp, "profiled"), True) if args.profile else None
    step = {mode: statistics.median(r["step_s"] for r in runs) for mode, runs in rows.items()}
    events = {mode: runs[0]["events"] for mode, runs in rows.items()}
    added = max(1, events[ALL] - events[STEPS_ONLY])
    rounds = sorted(
        (a["step_s"] - b["step_s"]) / added
        for a, b in zip(rows[ALL], rows[STEPS_ONLY], strict=True)
    )
    per_event = statistics.median(rounds)
    print(
        f"memscope hook cost: {args.blocks} blocks of hidden {args.hidden} (5 modules, 6 "
        f"parameters each), batch {args.batch}, {args.device}, backend "
        f"{_backend(args.device)} | {args.steps} timed steps "
        f"(+{args.warmup}) x {args.repeats} rounds | {platform.machine()}, torch "
        f"{torch.__version__}, Python {platform.python_version()} | "
        f"{time.perf_counter() - start:.0f} s"
    )
    print(f"{'run':<22}{'fastest step (ms)':>18}{'events/step':>13}")
    for mode in rows:
        print(f"{mode:<22}{step[mode] * 1e3:>18.2f}{events[mode]:>13}")
    if profiled is not None:
        print(profiled["profile"], file=sys.stderr)
    print(f"rounds: {rounds[0] * 1e6:.1f} to {rounds[-1] * 1e6:.1f} us per event")
    print(f"per event: {per_event * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
