"""One rank calling the real ``train_step`` of a (patched or pristine) FlagScale 0.8.0 tree on CPU.

    python flagscale_train_step_worker.py TREE VARIANT OUTDIR     (env RANK, WORLD_SIZE,
                                                                   MASTER_PORT, PP, TARGET)

TARGET ``flagscale`` (default) calls ``flagscale.train.train.train_step``; ``megatron-lm`` the
bundled upstream ``megatron.training.training.train_step`` (no spiky-loss path there, so its
step 2 is a normal step).

VARIANT: ``on`` (patched, ``--memscope``), ``off`` (patched, memscope installed, flag not
given), ``missing`` (patched, the ``memscope...training_hooks`` import made to fail as if
MemScope were not installed), ``pristine`` (unpatched tree). Runs four steps through the real
``flagscale.train.train.train_step`` with FlagScale's bundled Megatron-LM (its ``megatron.core``
shadows the installed one in this process): real argument parser, timers, rerun state machine,
spiky-loss detector, GPTModel, DistributedDataParallel, Megatron optimizer, scheduler and
pipeline schedule. The steps take the four return paths:

    0, 1  normal (last stage / stage before the last)
    2     FlagScale's spiky-loss skip (detector's previous loss set to 1e-6)
    3     rerun state machine exit (validate_results mode, persistent error injected)

Writes ``OUTDIR/rank<N>.json``: each step's return value as plain JSON, whether this rank is
the last pipeline stage, and the sum of the trained parameters.

STUBS (GPU only): the modules in ``STUBBED`` see ``torch`` through ``CpuTorch``
(tests/harness/megatron_ddp_cpu.py), which
maps ``device="cuda"`` / ``torch.cuda.current_device()`` to the CPU and makes the CUDA RNG
state calls no-ops (there is no CUDA generator on a CPU build); ``memscope.demo``'s
``init_process`` applies its labelled CPU shims to the pipeline schedules. Collectives run on
FlagScale's own ``cpu:gloo`` path. Everything else is the real code.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import warnings
from typing import Any

TREE, VARIANT, OUTDIR = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path[:0] = [os.path.join(TREE, "third_party", "Megatron-LM"), TREE]
warnings.filterwarnings("ignore")

import torch  # noqa: E402

HOOKS_MODULE = "memscope.integrations.megatron.training_hooks"


class _BlockHooks:
    """Meta-path finder making ``import memscope...training_hooks`` fail ("not installed")."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == HOOKS_MODULE:
            raise ImportError(f"{name} blocked: simulating MemScope not installed")


TARGET = os.environ.get("TARGET", "flagscale")
TRAINING_MODULE = {
    "flagscale": "flagscale.train.train",
    "megatron-lm": "megatron.training.training",
}
STUBBED = (
    TRAINING_MODULE[TARGET],  # FlagScale: torch.tensor(is_spiky_loss, device="cuda")
    "megatron.core.rerun_state_machine",  # flags all-reduced as CUDA tensors, CUDA RNG state
    "megatron.core.distributed.param_and_grad_buffer",  # grad buffers on current_device()
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.optimizer.optimizer",  # FP32Optimizer's loss-scale tensor
    "megatron.core.optimizer.clip_grads",  # grad-norm accumulator
    "megatron.core.utils",  # the local (no apex) multi-tensor L2 norm's result
    "megatron.training.utils",  # cross-model-parallel reductions of the step's results
)


def _args(world: int, pp: int) -> Any:
    """Megatron's real parser (FlagScale's bundled copy) + what validate_args would derive."""
    from megatron.training.arguments import parse_args

    provider = None
    if VARIANT in ("on", "off"):
        from memscope.integrations.megatron.training_hooks import with_memscope_args

        provider = with_memscope_args(None)
    argv = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32"
    argv += " --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4"
    argv += " --lr 1e-3 --train-iters 4 --auto-skip-spiky-loss"
    argv += f" --pipeline-model-parallel-size {pp}"
    argv += " --clip-grad 0"  # the norm is still computed; clipping asserts CUDA grads
    if VARIANT == "on":
        argv += f" --memscope --memscope-outdir {os.path.join(OUTDIR, 'memscope')}"
    sys.argv = ["train_gpt.py", *argv.split()]
    args = parse_args(provider)
    args.data_parallel_size = world // pp
    args.start_weight_decay = args.end_weight_decay = args.weight_decay
    args.consumed_train_samples = 0
    args.iteration = 0
    return args


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    pp = int(os.environ.get("PP", "1"))
    if VARIANT == "missing":
        sys.meta_path.insert(0, _BlockHooks())  # type: ignore[arg-type]
    training = importlib.import_module(TRAINING_MODULE[TARGET])
    from flagscale.train.global_vars import get_spiky_loss_detector, set_get_spiky_loss_detector
    from harness.gpt_step import forward_step
    from harness.megatron_ddp_cpu import redirect_torch  # tests/ is sys.path[0] here
    from megatron.core import mpu
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.rerun_state_machine import (
        RerunDataIterator,
        RerunDiagnostic,
        RerunErrorInjector,
        RerunMode,
        get_rerun_state_machine,
        initialize_rerun_state_machine,
    )
    from megatron.training import global_vars

    from memscope.demo.tiny_gpt import TinyGPTConfig, build_model, init_process
    from memscope.demo.tiny_gpt_training import make_data_iterators

    redirect_torch(STUBBED)
    assert (training.__dict__.get("memscope_hooks") is None) == (VARIANT in ("missing", "pristine"))

    cfg = TinyGPTConfig(num_layers=2, hidden_size=32, num_attention_heads=4, pp=pp)
    cfg.num_microbatches = 2
    args = _args(world, pp)
    port = int(os.environ["MASTER_PORT"])
    # FlagScale's own CPU-communication mode: with a "cpu:gloo" group its reductions keep
    # tensors on the CPU (get_device_type_for_comm). init_process reuses this group.
    torch.distributed.init_process_group(
        "cpu:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    init_process(rank, world, port, cfg)
    global_vars.set_args(args)
    global_vars._set_timers(args)
    set_get_spiky_loss_detector(args)
    init_num_microbatches_calculator(rank, None, 4, 2, args.data_parallel_size, False)
    initialize_rerun_state_machine(mode=RerunMode.VALIDATE_RESULTS)

    chunks = build_model(cfg)
    ddp = DistributedDataParallelConfig()
    model = [DistributedDataParallel(c.config, ddp, c) for c in chunks]
    opt_cfg = OptimizerConfig(
        optimizer="adam", lr=args.lr, min_lr=args.min_lr, clip_grad=args.clip_grad
    )
    optimizer = get_megatron_optimizer(opt_cfg, model, use_gloo_process_groups=False)
    scheduler = training.get_optimizer_param_scheduler(optimizer)
    config = model[0].config
    config.grad_scale_func = optimizer.scale_loss
    data = RerunDataIterator(make_data_iterators(cfg, dp_rank=mpu.get_data_parallel_rank())[0])
    fb_func = get_forward_backward_func()

    hooks = training.__dict__.get("memscope_hooks")
    if hooks is not None:  # exactly what the patched train() calls
        hooks.start(args, model, optimizer)
    results = []
    for step in range(4):
        args.curr_iteration = step
        if step == 2 and TARGET == "flagscale":
            get_spiky_loss_detector().last_loss = 1e-6
        if step == 3:
            get_rerun_state_machine().error_injector = RerunErrorInjector(
                1, RerunDiagnostic.PERSISTENT_ERROR
            )
        out = training.train_step(forward_step, data, model, optimizer, scheduler, config, fb_func)
        results.append(_plain(out))
        args.consumed_train_samples += 4
    if hooks is not None:
        hooks.finalize()
    with open(os.path.join(OUTDIR, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        checksum = sum(float(p.double().sum()) for m in model for p in m.parameters())
        last = mpu.is_pipeline_last_stage()
        json.dump({"results": results, "last_stage": last, "param_sum": checksum}, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
