"""GPU checks on real megatron-core bf16 training (one GPU; checks 2, 3 and 5 of the GPU list).

Trains megatron-core's ``GPTModel`` (local spec, no Transformer Engine or apex) the way
Megatron-LM's ``pretrain_gpt.py`` does on one GPU: bf16 parameters in ``Float16Module``,
megatron-core's ``DistributedDataParallel`` with fp32 gradient buffers (what ``--bf16`` sets),
``get_megatron_optimizer`` (fp32 main parameters; torch's AdamW, the fallback megatron-core
takes without TE or apex; gradient clipping at 1.0), ``get_forward_backward_func()``. Fusions
are off (their CUDA kernels come from apex / TE). MemScope is wired as the Megatron-LM patch
wires it (``from_megatron_args`` -> ``attach_model`` -> ``attach_optimizer`` -> ``start``, the
five step callbacks, ``finalize``).

Sections (``--sections``, default all, in this order):

* ``accuracy``: each case of :data:`CASES` trains a few steps traced by the ``cuda`` backend.
  Per case: ``torch.cuda.max_memory_allocated()`` over the run (never reset inside it), the
  runtime report's peak, the in-run static comparison the report carries, the static
  estimate from the args alone, and what stays allocated after a step against the estimate's
  steady part.
* ``losses``: the first case three times, untraced, untraced, traced, with deterministic
  algorithms: losses and Megatron's ``max allocated`` reading per step must be identical
  (the untraced pair shows the GPU itself is deterministic here).
* ``overhead``: a ~1B-parameter GPT (``--overhead-*`` sizes), untraced and traced runs
  alternating, per MemScope mode: step-time ratio on/off (median of per-pair ratios).
* ``fixture``: one step of a tiny GPT with the allocator history recorded by MemScope; the
  snapshot is written to ``OUTDIR/fixture/``.

Writes ``OUTDIR/gpu_megatron.json`` (rewritten after every section) and prints a table per
section. ``--cpu-smoke`` runs every code path on the CPU (gloo, the test suite's CUDA
redirections, tiny sizes, nothing measured) so the script is checked before GPU time is spent.

    python tools/gpu_megatron_check.py --outdir OUT [--sections accuracy overhead]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

import torch

SECTIONS = ("accuracy", "losses", "overhead", "fixture", "profile")


@dataclasses.dataclass(frozen=True)
class GpuCase:
    """One training configuration (Megatron-LM's names where it has them)."""

    name: str
    num_layers: int = 4
    hidden_size: int = 1024
    num_attention_heads: int = 16
    num_query_groups: int | None = None
    ffn_hidden_size: int | None = None
    seq_length: int = 1024
    micro_batch_size: int = 2
    num_microbatches: int = 2
    vocab_size: int = 32000
    recompute: str | None = None  # "selective" | "full" | None
    swiglu: bool = False
    dropout: float = 0.1  # Megatron-LM's default hidden and attention dropout
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None


CASES: tuple[GpuCase, ...] = (
    GpuCase("base h1024 L4 s1024 b2"),
    GpuCase("wide h2048 L4 s1024 b1", hidden_size=2048, micro_batch_size=1),
    GpuCase("deep h1024 L12 s1024 b2", num_layers=12),
    GpuCase("long s4096 b1", seq_length=4096, micro_batch_size=1),
    GpuCase("mbs8 s512", seq_length=512, micro_batch_size=8),
    GpuCase("no dropout", dropout=0.0),
    GpuCase("selective recompute", recompute="selective"),
    GpuCase("full recompute", recompute="full"),
    GpuCase("gqa g4 + swiglu", num_query_groups=4, swiglu=True, ffn_hidden_size=2816),
    GpuCase(
        "moe 8 experts top2",
        num_experts=8,
        moe_ffn_hidden_size=1024,
        dropout=0.0,
    ),
)
OVERHEAD_CASE = GpuCase(
    "overhead ~1.1B", num_layers=20, hidden_size=2048, num_attention_heads=16,
    seq_length=2048, micro_batch_size=1, num_microbatches=4, dropout=0.0,
)  # fmt: skip
FIXTURE_CASE = GpuCase(
    "fixture tiny", num_layers=2, hidden_size=256, num_attention_heads=4, seq_length=256,
    micro_batch_size=2, num_microbatches=2, vocab_size=1024, dropout=0.0,
)  # fmt: skip
# MemScope modes of the overhead section: (name, argv after --memscope)
OVERHEAD_MODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cuda, all hooks (default)", ("--memscope-backend", "cuda")),
    ("cuda, step callbacks only", (
        "--memscope-backend", "cuda", "--memscope-hook-modules", "false",
        "--memscope-hook-output-grads", "false", "--memscope-hook-param-grads", "false")),
    ("storage (exact composition)", ("--memscope-backend", "storage")),
    # timed after the hook window (the warm-up steps): what every step past the first 20 pays
    ("cuda, all hooks, after the window", ("--memscope-backend", "cuda",
                                           "--memscope-hook-steps", "{warmup}")),
)  # fmt: skip


def smoke_case(case: GpuCase) -> GpuCase:
    """``case`` at a size the CPU runs in a second."""
    return dataclasses.replace(
        case, num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
        micro_batch_size=2, vocab_size=128, num_query_groups=case.num_query_groups and 2,
        ffn_hidden_size=case.ffn_hidden_size and 176,
        moe_ffn_hidden_size=case.moe_ffn_hidden_size and 64,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# process, model, optimizer


class Device:
    """Where the run is: the GPU, or the CPU for ``--cpu-smoke``."""

    def __init__(self, cpu_smoke: bool) -> None:
        self.cpu = cpu_smoke
        self.name = "cpu" if cpu_smoke else "cuda"

    def sync(self) -> None:
        if not self.cpu:
            torch.cuda.synchronize()

    def allocated(self) -> int:
        return 0 if self.cpu else torch.cuda.memory_allocated()

    def max_allocated(self) -> int:
        return 0 if self.cpu else torch.cuda.max_memory_allocated()

    def fresh(self) -> None:
        """Free what earlier runs left and restart the peak counter (between runs only)."""
        gc.collect()
        if not self.cpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def init_process(device: Device) -> None:
    """One-rank process group and megatron's parallel state."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    for name in ("RANK", "LOCAL_RANK"):
        os.environ.setdefault(name, "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    if device.cpu:
        from harness.megatron_ddp_cpu import install_ddp_cpu_stand_ins

        from memscope.demo.megatron_cpu_shims import apply_cpu_shims

        dist.init_process_group("gloo", rank=0, world_size=1)
        apply_cpu_shims()
        install_ddp_cpu_stand_ins()
    else:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)


def seed(device: Device, value: int = 1234) -> None:
    """Megatron's ``_set_random_seed`` for one rank."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(value)
    if device.cpu:
        model_parallel_cuda_manual_seed(value, inference_rng_tracker=True, force_reset_rng=True)
    else:
        torch.cuda.manual_seed(value)
        model_parallel_cuda_manual_seed(value)


def no_te_moe_workaround() -> None:
    """megatron-core 0.16.1 without Transformer Engine: ``moe_utils.router_gating_linear``
    reads the module global ``te_general_gemm``, which is only bound when TE imports
    (``NameError`` otherwise). Bind it to ``None``, the value the code tests for, so the
    router takes its plain ``torch.matmul`` path. Labelled workaround, nothing else changed."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def transformer_config(case: GpuCase, device: Device) -> Any:
    """megatron-core's ``TransformerConfig`` as Megatron-LM builds it for ``--bf16``."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    from memscope.demo.tiny_gpt import FUSIONS_OFF

    kwargs: dict[str, Any] = {}
    if case.recompute == "full":
        kwargs.update(recompute_method="uniform", recompute_num_layers=1)
    if case.swiglu:
        kwargs.update(gated_linear_unit=True, activation_func=F.silu)
    if case.num_experts:
        no_te_moe_workaround()
        kwargs.update(
            num_moe_experts=case.num_experts, moe_router_topk=case.moe_router_topk,
            moe_ffn_hidden_size=case.moe_ffn_hidden_size, moe_token_dispatcher_type="allgather",
            moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
            add_bias_linear=False,
        )  # fmt: skip
    return TransformerConfig(
        num_layers=case.num_layers,
        hidden_size=case.hidden_size,
        num_attention_heads=case.num_attention_heads,
        num_query_groups=case.num_query_groups,
        ffn_hidden_size=case.ffn_hidden_size,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=device.cpu,
        hidden_dropout=case.dropout,
        attention_dropout=case.dropout,
        recompute_granularity=case.recompute,
        **FUSIONS_OFF,
        **kwargs,
    )


def build(case: GpuCase, device: Device) -> tuple[list[Any], Any, Any]:
    """(model chunks, optimizer, TransformerConfig) as Megatron-LM's ``get_model`` and
    ``setup_model_and_optimizer`` build them for one GPU."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module

    seed(device)
    config = transformer_config(case, device)
    spec = get_gpt_layer_local_spec(num_experts=case.num_experts, moe_grouped_gemm=False)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=case.vocab_size,
        max_sequence_length=case.seq_length,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=True,  # Megatron-LM's default (no --untie-...)
        position_embedding_type="learned_absolute",
    )
    if not device.cpu:
        model.cuda(torch.cuda.current_device())
    model = Float16Module(config, model)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False,
        check_for_nan_in_grad=True,
    )  # fmt: skip
    chunks = [DistributedDataParallel(config, ddp_config, model)]
    opt_config = OptimizerConfig(
        optimizer="adam", lr=1e-4, weight_decay=0.01, bf16=True, params_dtype=torch.bfloat16,
        clip_grad=0.0 if device.cpu else 1.0, use_distributed_optimizer=False,
    )  # fmt: skip
    optimizer = get_megatron_optimizer(opt_config, chunks, use_gloo_process_groups=False)
    config.no_sync_func = chunks[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    return chunks, optimizer, config


def megatron_args(case: GpuCase, memscope_argv: list[str]) -> argparse.Namespace:
    """Megatron-LM's parsed args for ``case`` (what its ``pretrain_gpt.py`` command line with
    ``--bf16`` leaves), with MemScope's flags parsed in."""
    from memscope.demo.tiny_gpt import TinyGPTConfig
    from memscope.demo.traced_training import megatron_like_args

    tiny = TinyGPTConfig(
        num_layers=case.num_layers, hidden_size=case.hidden_size,
        num_attention_heads=case.num_attention_heads, num_query_groups=case.num_query_groups,
        ffn_hidden_size=case.ffn_hidden_size, vocab_size=case.vocab_size,
        seq_length=case.seq_length, micro_batch_size=case.micro_batch_size,
        num_microbatches=case.num_microbatches, swiglu=case.swiglu, recompute=case.recompute,
        dropout=case.dropout,
    )  # fmt: skip
    args = megatron_like_args(tiny, memscope_argv)
    args.bf16 = True
    args.params_dtype = torch.bfloat16
    args.accumulate_allreduce_grads_in_fp32 = True  # what Megatron-LM's validate_args sets
    args.use_distributed_optimizer = False
    args.clip_grad = 1.0
    args.weight_decay = 0.01
    args.world_size = 1
    args.data_parallel_size = 1
    args.max_position_embeddings = case.seq_length
    args.position_embedding_type = "learned_absolute"
    # the model's TransformerConfig keeps megatron-core's default (True); Megatron-LM's
    # --attention-softmax-in-fp32 defaults to False, so its args must say what ran
    args.attention_softmax_in_fp32 = True
    if case.num_experts:
        args.num_experts = case.num_experts
        args.moe_router_topk = case.moe_router_topk
        args.moe_ffn_hidden_size = case.moe_ffn_hidden_size
        args.moe_token_dispatcher_type = "allgather"
        args.moe_grouped_gemm = False
        args.moe_router_load_balancing_type = "aux_loss"
        args.moe_aux_loss_coeff = 1e-2
        args.disable_bias_linear = True
        args.add_bias_linear = False
    return args


def batches(case: GpuCase, device: Device) -> Iterator[dict[str, torch.Tensor]]:
    """Deterministic micro-batches on the device (mock data, as ``--mock-data`` gives)."""
    gen = torch.Generator().manual_seed(7)
    b, s, v = case.micro_batch_size, case.seq_length, case.vocab_size
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(1, 1, s, s)
    positions = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
    while True:
        tokens = torch.randint(0, v, (b, s + 1), generator=gen)
        batch = {
            "tokens": tokens[:, :-1].contiguous(),
            "labels": tokens[:, 1:].contiguous(),
            "loss_mask": torch.ones(b, s, dtype=torch.float32),
            "attention_mask": mask,
            "position_ids": positions,
        }
        yield {k: t.to(device.name) for k, t in batch.items()}


def _forward_step(data: Iterator[dict[str, torch.Tensor]], model: Any) -> tuple[Any, Callable]:
    from memscope.demo.tiny_gpt_training import megatron_loss

    batch = next(data)
    out = model(
        batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]
    )
    return out, partial(megatron_loss, batch["loss_mask"])


def train_step(
    case: GpuCase, chunks: list[Any], optimizer: Any, data: Iterator, step: int, runtime: Any
) -> float:
    """Megatron-LM's ``train_step`` for one rank, with the MemScope patch's callbacks."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    if runtime is not None:
        runtime.on_train_step_start(step=step, batch=None, notes=case.name)
    losses = get_forward_backward_func()(
        forward_step_func=_forward_step, data_iterator=[data], model=chunks,
        num_microbatches=case.num_microbatches, seq_length=case.seq_length,
        micro_batch_size=case.micro_batch_size, forward_only=False,
    )  # fmt: skip
    if runtime is not None:
        runtime.on_forward_backward_end(outputs=losses)
        runtime.on_optimizer_step_start()
    optimizer.step()
    if runtime is not None:
        runtime.on_optimizer_step_end()
        runtime.on_train_step_end(outputs=losses)
    total = torch.stack([item["lm loss"] for item in losses]).sum(dim=0)
    return float(total[0] / total[1])


@dataclasses.dataclass
class RunResult:
    """What one training run measured."""

    losses: list[float]
    step_times: list[float]
    max_allocated: list[int]  # Megatron's reading after each step (never reset in the run)
    allocated_after: list[int]  # torch.cuda.memory_allocated() after each step
    allocated_before: int  # before the model was built (what earlier runs keep: workspaces)
    report: dict | None = None
    args: argparse.Namespace | None = None


def start_runtime(
    case: GpuCase, chunks: list[Any], optimizer: Any, memscope_argv: Sequence[str]
) -> tuple[Any, argparse.Namespace]:
    """MemScope wired as the Megatron-LM patch wires it, started; (runtime, its args)."""
    from memscope.integrations.megatron import MemScopeMegatronRuntime

    args = megatron_args(case, ["--memscope", *memscope_argv])
    runtime = MemScopeMegatronRuntime.from_megatron_args(args)
    runtime.attach_model(chunks)
    runtime.attach_optimizer(optimizer)
    runtime.start()
    return runtime, args


def mode_argv(argv: Sequence[str], device: Device, warmup: int) -> list[str]:
    """An overhead mode's MemScope argv for this run: the hook window set to ``warmup`` where
    the mode asks for it, the ``storage`` backend in place of ``cuda`` on the CPU."""
    out = [a.format(warmup=warmup) for a in argv]
    return ["storage" if device.cpu and a == "cuda" else a for a in out]


def run(
    case: GpuCase, device: Device, steps: int, memscope_argv: list[str] | None = None
) -> RunResult:
    """Build ``case``, train ``steps`` steps (traced when ``memscope_argv`` is given)."""
    device.fresh()
    before = device.allocated()
    chunks, optimizer, _ = build(case, device)
    runtime, args = None, None
    if memscope_argv is not None:
        runtime, args = start_runtime(case, chunks, optimizer, memscope_argv)
    data = batches(case, device)
    result = RunResult([], [], [], [], before, args=args)
    try:
        for step in range(steps):
            device.sync()
            start = time.perf_counter()
            result.losses.append(train_step(case, chunks, optimizer, data, step, runtime))
            device.sync()
            result.step_times.append(time.perf_counter() - start)
            result.max_allocated.append(device.max_allocated())
            result.allocated_after.append(device.allocated())
    except BaseException as exc:
        if runtime is not None:
            runtime.on_exception(exc)
        raise
    finally:
        if runtime is not None:
            runtime.finalize()
            if runtime.report_path:
                with open(runtime.report_path) as f:
                    result.report = json.load(f)
        del chunks, optimizer, runtime, data
        device.fresh()
    return result


# --------------------------------------------------------------------------------------------
# sections


def args_estimate(args: argparse.Namespace) -> Any:
    """The static estimate from the args alone (``memscope estimate`` on this config)."""
    from memscope.analysis.static.estimator import estimate_rank
    from memscope.analysis.static.params import RankPosition
    from memscope.inputs.megatron_args import spec_from_megatron_args

    spec = dataclasses.replace(spec_from_megatron_args(args), device="cuda")
    return estimate_rank(spec, RankPosition(0, 0))


def _err(ours: int | None, measured: int) -> float | None:
    return None if ours is None or not measured else (ours - measured) / measured


def accuracy(
    device: Device, outdir: str, steps: int, rows: list[dict], saved: Callable[[], None]
) -> list[dict]:
    """Measured, runtime-reported and estimated peaks of every case (see module doc), appended
    to ``rows``; ``saved()`` after each."""
    for case in CASES:
        if device.cpu and case.num_experts:  # megatron-core's router moves its weight to CUDA
            print(f"{case.name:<26} not smoke-tested: the MoE router needs CUDA", flush=True)
            continue
        case = smoke_case(case) if device.cpu else case
        row: dict[str, Any] = {"case": case.name, "config": dataclasses.asdict(case)}
        try:
            traced = os.path.join(outdir, "accuracy", case.name.split()[0])
            backend = "storage" if device.cpu else "cuda"
            argv = ["--memscope-backend", backend, "--memscope-outdir", traced]
            res = run(case, device, steps, argv)
            assert res.report is not None and res.args is not None
            est = args_estimate(res.args)
            comparison = res.report.get("comparisons") or {}
            measured = max(res.max_allocated)
            row.update(
                measured_peak=measured,
                runtime_peak=res.report["peak"]["memory_bytes"],
                runtime_step_peaks=[s.get("peak_allocated") for s in res.report["steps"]],
                inrun_static_peak=comparison.get("static_peak_memory_bytes"),
                inrun_components=comparison.get("components"),
                inrun_status=comparison.get("status"),
                args_static_peak=est.peak_memory_bytes,
                args_static_where=f"{est.peak_stage} {est.activations.peak_moment}",
                args_static_steady=est.steady_bytes,
                args_static_weights=est.persistent.weight_bytes,
                args_static_grads=est.persistent.grad_bytes,
                args_static_optimizer=est.persistent.optimizer_bytes,
                args_static_workspaces=est.workspaces,
                measured_steady=res.allocated_after[-1] - res.allocated_before,
                allocated_before=res.allocated_before,
                measured_max_allocated=res.max_allocated,
                losses=res.losses,
                step_times=res.step_times,
                report_warnings=res.report.get("warnings"),
                report_errors=res.report.get("errors"),
            )
            row["args_error"] = _err(est.peak_memory_bytes, measured)
            row["inrun_error"] = _err(row["inrun_static_peak"], measured)
        except Exception as exc:  # one case's failure must not lose the others
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()[-4000:]
        rows.append(row)
        saved()
        print(_accuracy_line(row), flush=True)
    return rows


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:9.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+6.1f}%"


def _accuracy_line(row: dict) -> str:
    if "error" in row:
        return f"{row['case']:<26} FAILED {row['error'][:200]}"
    same = row["runtime_peak"] == row["measured_peak"]
    return (
        f"{row['case']:<26} measured {_mib(row['measured_peak'])} MiB | runtime "
        f"{_mib(row['runtime_peak'])} ({'==' if same else '!='}) | in-run est "
        f"{_mib(row['inrun_static_peak'])} {_pct(row['inrun_error'])} | args est "
        f"{_mib(row['args_static_peak'])} {_pct(row['args_error'])} | steady "
        f"{_mib(row['measured_steady'])} vs est {_mib(row['args_static_steady'])}"
    )


def losses(device: Device, outdir: str, steps: int) -> dict:
    """Untraced, untraced, traced: losses and Megatron's ``max allocated`` per step. The
    traced run is compared with the untraced one just before it: a process's first run also
    allocates what the process then keeps (cuBLAS and NCCL state), so its step-0 high-water
    mark differs from every later run's, traced or not."""
    case = smoke_case(CASES[0]) if device.cpu else CASES[0]
    backend = "storage" if device.cpu else "cuda"
    off1 = run(case, device, steps)
    off2 = run(case, device, steps)
    on = run(case, device, steps, ["--memscope-backend", backend, "--memscope-outdir",
                                   os.path.join(outdir, "losses")])  # fmt: skip
    out = {
        "case": case.name,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "losses": {"off": off1.losses, "off_again": off2.losses, "on": on.losses},
        "max_allocated": {
            "off": off1.max_allocated,
            "off_again": off2.max_allocated,
            "on": on.max_allocated,
        },
        "gpu_deterministic": off1.losses == off2.losses,
        "losses_identical": on.losses == off2.losses,
        "max_allocated_identical": on.max_allocated == off2.max_allocated,
    }
    print(
        f"losses: off==off {out['gpu_deterministic']}, on==off {out['losses_identical']} "
        f"({on.losses[-1]!r}); Megatron's max allocated on==off "
        f"{out['max_allocated_identical']} ({on.max_allocated} vs {off2.max_allocated}; "
        f"first run {off1.max_allocated})",
        flush=True,
    )
    return out


def overhead(device: Device, outdir: str, steps: int, repeats: int, warmup: int) -> list[dict]:
    """Step-time ratio on/off of each mode on the ~1B GPT (alternating off/on pairs)."""
    case = smoke_case(OVERHEAD_CASE) if device.cpu else OVERHEAD_CASE
    rows: list[dict] = []
    ratios: dict[str, list[float]] = {name: [] for name, _ in OVERHEAD_MODES}
    medians: dict[str, list[float]] = {name: [] for name, _ in OVERHEAD_MODES}
    offs: list[float] = []
    for repeat in range(repeats):
        for name, argv in OVERHEAD_MODES:
            off = run(case, device, warmup + steps)
            where = os.path.join(outdir, "overhead", f"r{repeat}")
            on_argv = [*mode_argv(argv, device, warmup), "--memscope-outdir", where]
            on = run(case, device, warmup + steps, on_argv)
            t_off = statistics.median(off.step_times[warmup:])
            t_on = statistics.median(on.step_times[warmup:])
            offs.append(t_off)
            ratios[name].append(t_on / t_off)
            medians[name].append(t_on)
            print(f"overhead r{repeat} {name}: off {t_off * 1e3:.1f} ms on {t_on * 1e3:.1f} ms "
                  f"ratio {t_on / t_off:.4f}", flush=True)  # fmt: skip
    for name, _ in OVERHEAD_MODES:
        rows.append({
            "mode": name, "ratio": statistics.median(ratios[name]), "ratios": ratios[name],
            "median_step_on_s": statistics.median(medians[name]),
        })  # fmt: skip
    rows.append({"mode": "off", "median_step_off_s": statistics.median(offs)})
    return rows


def fixture(device: Device, outdir: str) -> dict:
    """One step of a tiny GPT with MemScope's allocator history on; the snapshot's path."""
    case = smoke_case(FIXTURE_CASE) if device.cpu else FIXTURE_CASE
    if device.cpu:
        return {"skipped": "allocator history needs CUDA"}
    where = os.path.join(outdir, "fixture")
    res = run(case, device, 2, [
        "--memscope-backend", "cuda", "--memscope-enable-memory-snapshot",
        "--memscope-snapshot-start-step", "1", "--memscope-snapshot-steps", "1",
        "--memscope-snapshot-stacks", "python", "--memscope-outdir", where,
    ])  # fmt: skip
    assert res.report is not None
    arts = {k: v for k, v in res.report["artifacts"].items() if k.startswith("memory_snapshot")}
    print(f"fixture: {arts} peak {res.report['peak']['memory_bytes']}", flush=True)
    return {"artifacts": arts, "peak": res.report["peak"]["memory_bytes"], "where": where,
            "max_allocated": res.max_allocated}  # fmt: skip


def _per_call_us(fn: Callable[[], Any], calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def profile(device: Device, outdir: str) -> dict:
    """Where the traced step's host time goes on the overhead model: the cost of one
    allocator reading, the hook and event counts, a cProfile of two traced steps (all hooks,
    cuda backend) and the device synchronisations torch's sync debug mode sees in them."""
    import cProfile
    import io
    import pstats
    import warnings

    out: dict[str, Any] = {}
    if not device.cpu:
        out["us_per_call"] = {
            "torch._C._cuda_memoryStats": _per_call_us(lambda: torch._C._cuda_memoryStats(0), 2000),
            "torch.cuda.memory_allocated": _per_call_us(torch.cuda.memory_allocated, 2000),
            "torch.cuda.max_memory_allocated": _per_call_us(torch.cuda.max_memory_allocated, 2000),
            "torch.cuda.mem_get_info": _per_call_us(torch.cuda.mem_get_info, 200),
        }
        print(f"profile: {out['us_per_call']}", flush=True)
    case = smoke_case(OVERHEAD_CASE) if device.cpu else OVERHEAD_CASE
    for name, argv in OVERHEAD_MODES[:2]:
        device.fresh()
        chunks, optimizer, _ = build(case, device)
        where = os.path.join(outdir, "profile")
        runtime, _ = start_runtime(
            case, chunks, optimizer, [*mode_argv(argv, device, 0), "--memscope-outdir", where]
        )
        data = batches(case, device)
        entry: dict[str, Any] = {}
        try:
            train_step(case, chunks, optimizer, data, 0, runtime)
            device.sync()
            prof = cProfile.Profile()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if not device.cpu:
                    torch.cuda.set_sync_debug_mode("warn")
                start = time.perf_counter()
                prof.enable()
                for step in (1, 2):
                    train_step(case, chunks, optimizer, data, step, runtime)
                prof.disable()
                device.sync()
                entry["two_steps_s"] = time.perf_counter() - start
                if not device.cpu:
                    torch.cuda.set_sync_debug_mode(0)
            syncs: dict[str, int] = {}
            for w in caught:
                if "synchroniz" in str(w.message):
                    where = f"{os.path.basename(w.filename)}:{w.lineno}"
                    syncs[where] = syncs.get(where, 0) + 1
            entry["syncs"] = syncs
            text = io.StringIO()
            stats = pstats.Stats(prof, stream=text).sort_stats("tottime")
            stats.print_stats(35)
            stats.sort_stats("cumulative").print_stats("memscope", 35)
            entry["cprofile"] = text.getvalue()[-30000:]
        finally:
            runtime.finalize()
            del chunks, optimizer, runtime, data
            device.fresh()
        out[name] = entry
        print(f"profile {name}: two steps {entry.get('two_steps_s', 0):.3f} s, "
              f"syncs {entry.get('syncs')}", flush=True)  # fmt: skip
    return out


def environment(device: Device) -> dict[str, Any]:
    import importlib.metadata

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "megatron_core": importlib.metadata.version("megatron-core"),
    }
    if not device.cpu:
        env.update(
            gpu=torch.cuda.get_device_name(),
            capability=list(torch.cuda.get_device_capability()),
            cuda=torch.version.cuda,
            total_memory=torch.cuda.get_device_properties(0).total_memory,
        )
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outdir", default=None)
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--steps", type=int, default=3, help="steps per accuracy run")
    parser.add_argument("--overhead-steps", type=int, default=4, help="timed steps per run")
    parser.add_argument("--overhead-warmup", type=int, default=2)
    parser.add_argument("--overhead-repeats", type=int, default=2)
    parser.add_argument("--cpu-smoke", action="store_true", help="check the code paths on CPU")
    ns = parser.parse_args(argv)
    device = Device(ns.cpu_smoke)
    if not device.cpu and not torch.cuda.is_available():
        print("gpu_megatron_check: no CUDA device (use --cpu-smoke on a CPU)")
        return 2
    outdir = ns.outdir or tempfile.mkdtemp(prefix="memscope-gpu-megatron-")
    os.makedirs(outdir, exist_ok=True)
    from memscope.demo.tiny_gpt import quiet_megatron_cpu_warnings

    quiet_megatron_cpu_warnings()
    init_process(device)
    results: dict[str, Any] = {"environment": environment(device)}
    print(json.dumps(results["environment"]), flush=True)
    path = os.path.join(outdir, "gpu_megatron.json")
    failed = 0

    def save() -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1, default=str)
        os.replace(path + ".tmp", path)

    for section in ns.sections:
        start = time.perf_counter()
        try:
            if section == "accuracy":
                results[section] = []
                accuracy(device, outdir, ns.steps, results[section], save)
                failed += any("error" in row for row in results[section])
            elif section == "losses":
                torch.use_deterministic_algorithms(True, warn_only=True)
                try:
                    results[section] = losses(device, outdir, 4)
                finally:
                    torch.use_deterministic_algorithms(False)
            elif section == "overhead":
                results[section] = overhead(
                    device, outdir, ns.overhead_steps, ns.overhead_repeats, ns.overhead_warmup
                )
            elif section == "fixture":
                results[section] = fixture(device, outdir)
            elif section == "profile":
                results[section] = profile(device, outdir)
        except Exception as exc:
            failed += 1
            results[section] = {"error": f"{type(exc).__name__}: {exc}",
                                "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            print(f"{section} FAILED: {results[section]['traceback']}", flush=True)
        results.setdefault("seconds", {})[section] = round(time.perf_counter() - start, 1)
        save()
    print(f"gpu_megatron_check: {'ok' if not failed else f'{failed} failed'}; {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
