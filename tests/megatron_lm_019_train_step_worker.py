"""One process calling the real 0.19-patched Megatron-LM ``train_step`` on CPU.

    python megatron_lm_019_train_step_worker.py PATCHED_TRAINING_PY OUTDIR   (env MASTER_PORT)

Runs under megatron-core 0.19.x (its wheel ships ``megatron/training``; the patched
``training.py`` is loaded inside that package, where its relative imports resolve). Three
steps through the patched ``train_step`` with MemScope on (``--memscope``), with Megatron-LM's
own argument parser, timers, rerun state machine, GPTModel, DistributedDataParallel, Megatron
optimizer, scheduler and pipeline schedule, one rank; the patched ``train`` would call
``memscope_hooks.start`` / ``finalize`` where this calls them. Writes ``OUTDIR/result.json``:
each step's loss and skipped flag.

STUBS (GPU only), as in ``flagscale_train_step_worker.py``: the modules in ``STUBBED`` see
``torch`` through ``CpuTorch`` (tests/harness/megatron_ddp_cpu.py); ``memscope.demo``'s
``init_process`` applies its labelled CPU shims. Everything else is the real code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from typing import Any

PATCHED, OUTDIR = sys.argv[1], sys.argv[2]
warnings.filterwarnings("ignore")

import torch  # noqa: E402

STUBBED = (
    "megatron.core.rerun_state_machine",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.utils",
    "megatron.training.utils",
    "megatron.training.utils.common_utils",  # 0.19: the step's model-parallel reductions
)


def _load_patched() -> Any:
    name = "megatron.training._memscope_patched_training"
    spec = importlib.util.spec_from_file_location(name, PATCHED)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _args() -> Any:
    from megatron.training.arguments import parse_args

    from memscope.integrations.megatron.training_hooks import with_memscope_args

    argv = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32"
    argv += " --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4"
    argv += " --lr 1e-3 --train-iters 3 --clip-grad 0"
    argv += f" --memscope --memscope-outdir {os.path.join(OUTDIR, 'memscope')}"
    sys.argv = ["pretrain_gpt.py", *argv.split()]
    args = parse_args(with_memscope_args(None))
    args.data_parallel_size = 1  # what validate_args derives (it needs a GPU to run)
    args.gtp_weight_remat_size = 1
    args.start_weight_decay = args.end_weight_decay = args.weight_decay
    args.consumed_train_samples = 0
    args.iteration = 0
    return args


def main() -> None:
    training = _load_patched()
    from harness.gpt_step import forward_step
    from harness.megatron_ddp_cpu import redirect_torch  # tests/ is sys.path[0] here
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.rerun_state_machine import (
        RerunDataIterator,
        RerunMode,
        initialize_rerun_state_machine,
    )
    from megatron.training import global_vars

    from memscope.demo.tiny_gpt import TinyGPTConfig, build_model, init_process
    from memscope.demo.tiny_gpt_training import make_data_iterators

    redirect_torch([*STUBBED, training])
    assert training.memscope_hooks is not None

    cfg = TinyGPTConfig(num_layers=2, hidden_size=32, num_attention_heads=4)
    cfg.num_microbatches = 2
    args = _args()
    port = int(os.environ["MASTER_PORT"])
    init_process(0, 1, port, cfg)
    global_vars.set_args(args)
    global_vars._set_timers(args)
    init_num_microbatches_calculator(0, None, 4, 2, 1, False)
    initialize_rerun_state_machine(mode=RerunMode.DISABLED)

    model = [
        DistributedDataParallel(c.config, DistributedDataParallelConfig(), c)
        for c in build_model(cfg)
    ]
    opt_cfg = OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.min_lr, clip_grad=0.0)
    optimizer = get_megatron_optimizer(opt_cfg, model, use_gloo_process_groups=False)
    scheduler = training.get_optimizer_param_scheduler(optimizer)
    config = model[0].config
    config.grad_scale_func = optimizer.scale_loss
    data = RerunDataIterator(make_data_iterators(cfg, dp_rank=0)[0])
    fb_func = get_forward_backward_func()

    training.memscope_hooks.start(args, model, optimizer)  # what the patched train() calls
    results = []
    for step in range(3):
        args.curr_iteration = step
        out = training.train_step(
            forward_step, data, model, optimizer, scheduler, config, fb_func, iteration=step
        )
        loss = out[0].get("lm loss")
        results.append({"loss": float(loss) if loss is not None else None, "skipped": out[1]})
    training.memscope_hooks.finalize()
    with open(os.path.join(OUTDIR, "result.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
