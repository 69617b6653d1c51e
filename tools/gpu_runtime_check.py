"""GPU check of the runtime's CUDA paths (run it on a machine with a GPU).

Trains a small bf16 transformer stack on one GPU with plain torch (no megatron-core needed),
traced by ``MemScopeMegatronRuntime`` with the ``cuda`` backend, and checks:

- the report's peak equals ``torch.cuda.max_memory_allocated`` over the same steps (the true
  allocator high-water mark, not a sampled value), per step as well;
- the allocator snapshot is dumped on its schedule, is pickle protocol <= 4 and loads with
  torch's own ``torch.cuda._memory_viz`` functions (what pytorch.org/memory_viz renders);
- a real CUDA OOM triggers the OOM observer: an ``oom`` report and an ``oom_snapshot.pickle``;
- losses are identical with tracing on and off; hook overhead at default settings;
- the host's own counter is left alone: ``torch.cuda.max_memory_allocated()`` read after each
  step and never reset (as Megatron-LM's "max allocated" is) is the same with tracing on and
  off.

Usage: ``python tools/gpu_runtime_check.py [--outdir DIR]``; prints one ``ok``/``FAIL`` line
per check and exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time

import torch

from memscope.events.file_names import REPORT_NAME, rank_folder_name
from memscope.integrations.megatron import MemScopeMegatronRuntime, add_memscope_args


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, num_layers=8).cuda().to(torch.bfloat16)


def _train(
    argv: list[str] | None, steps: int, oom_at: int | None = None, reset_each_step: bool = True
) -> dict:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    runtime = None
    if argv is not None:
        args = add_memscope_args(argparse.ArgumentParser()).parse_args(argv)
        args.bf16 = True
        runtime = MemScopeMegatronRuntime.from_megatron_args(args)
        runtime.attach_model(model)
        runtime.attach_optimizer(opt)
        runtime.start()
    gen = torch.Generator(device="cuda").manual_seed(1)
    losses, times, torch_peaks = [], [], []
    try:
        for step in range(steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            if reset_each_step:
                torch.cuda.reset_peak_memory_stats()
            if runtime:
                runtime.on_train_step_start(step)
            for _ in range(4):
                x = torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
                if oom_at is not None and step == oom_at:
                    torch.empty(10**15, device="cuda")  # a real CUDA OOM
                loss = model(x).float().pow(2).mean()
                loss.backward()
            if runtime:
                runtime.on_forward_backward_end(loss)
                runtime.on_optimizer_step_start()
            opt.step()
            if runtime:
                runtime.on_optimizer_step_end()
                runtime.on_train_step_end(loss)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            torch_peaks.append(torch.cuda.max_memory_allocated())
            losses.append(loss.item())
    except torch.OutOfMemoryError as exc:
        if runtime:
            runtime.on_exception(exc)
    finally:
        if runtime:
            runtime.finalize()
    return {"losses": losses, "times": times, "torch_peaks": torch_peaks, "runtime": runtime}


def _memory_viz_check(path: str) -> tuple[bool, str]:
    """(ok, detail): pickle protocol <= 4 and torch's own memory_viz renders it."""
    from torch.cuda import _memory_viz

    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        data = pickle.load(f)
    protocol = head[1] if head[:1] == b"\x80" else 0
    pages = [_memory_viz.trace_plot(data), _memory_viz.segment_plot(data)]
    summary = _memory_viz.segsum(data)
    ok = protocol <= 4 and all(isinstance(p, str) and len(p) > 1000 for p in pages)
    ok = ok and "segments" in data and "device_traces" in data and bool(summary)
    return ok, f"protocol {protocol}, trace_plot {len(pages[0])} chars, segsum {len(summary)} chars"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outdir", default=None)
    parser.add_argument("--steps", type=int, default=8)
    ns = parser.parse_args()
    if not torch.cuda.is_available():
        print("FAIL no CUDA device")
        return 2
    outdir = ns.outdir or tempfile.mkdtemp(prefix="memscope-gpu-")
    failures = 0

    def check(name: str, ok: bool, detail: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)

    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} outdir {outdir}")
    # bitwise-comparable losses need deterministic kernels (SDPA's backward is not by default);
    # the untraced pair shows whether the GPU repeats itself at all
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    off = _train(None, ns.steps)
    again = _train(None, ns.steps)["losses"]
    print(f"untraced runs repeat bitwise: {again == off['losses']}")
    base = ["--memscope", "--memscope-backend", "cuda", "--memscope-outdir"]
    on = _train(
        [*base, os.path.join(outdir, "traced"), "--memscope-enable-memory-snapshot",
         "--memscope-snapshot-start-step", "2", "--memscope-snapshot-steps", "2"],
        ns.steps,
    )  # fmt: skip
    check("losses identical on/off", on["losses"] == off["losses"], f"{on['losses'][-1]:.6f}")
    report_path = os.path.join(outdir, "traced", rank_folder_name(0), REPORT_NAME)
    with open(report_path) as f:
        report = json.load(f)
    peak = report["peak"]["memory_bytes"]
    check("peak == torch max_memory_allocated", peak == max(on["torch_peaks"]),
          f"report {peak} torch {max(on['torch_peaks'])}")  # fmt: skip
    per_step = [s["peak_allocated"] for s in report["steps"]]
    check("per-step peaks match", per_step == on["torch_peaks"], f"{per_step[:3]}...")
    snaps = [a for k, a in report["artifacts"].items() if k.startswith("memory_snapshot")]
    check("snapshot dumped", bool(snaps), ", ".join(snaps))
    for name in snaps:
        check(f"snapshot {name} opens in memory_viz", *_memory_viz_check(
            os.path.join(outdir, "traced", rank_folder_name(0), name)))  # fmt: skip
    dev = report["steps"][-1].get("device_end", {})
    check("device-level used memory recorded", dev.get("device_used_bytes", 0) >= peak, str(dev))
    ratio = statistics.median(on["times"][2:]) / statistics.median(off["times"][2:])
    print(f"overhead (all hooks, default settings, no sync): {ratio:.3f}")

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    plain = _train(None, 4, reset_each_step=False)["torch_peaks"]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    traced = _train([*base, os.path.join(outdir, "counters")], 4, reset_each_step=False)
    check("host's max_memory_allocated unchanged by tracing", traced["torch_peaks"] == plain,
          f"off {plain} on {traced['torch_peaks']}")  # fmt: skip

    oom_dir = os.path.join(outdir, "oom")
    _train([*base, oom_dir, "--memscope-enable-memory-snapshot"], 3, oom_at=1)
    with open(os.path.join(oom_dir, rank_folder_name(0), REPORT_NAME)) as f:
        oom = json.load(f)
    check("OOM report", oom["status"] == "oom", oom["status_reason"][:120])
    check("OOM snapshot", "oom_snapshot" in oom["artifacts"], str(oom["artifacts"]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
