"""Trains a real single-rank megatron-core GPT with MemScope and dies mid-run on purpose.

Usage: python tests/crash_script.py OUTDIR {oom,exit,sigterm}
No try/except and no finalize(): the report must come from MemScope's excepthook, atexit
or SIGTERM handler. The OOM is raised by a test-only forward hook inside a decoder layer.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from memscope.demo.launcher import free_port
from memscope.demo.tiny_gpt import TinyGPTConfig, build_model, build_optimizer, init_process
from memscope.demo.tiny_gpt_training import make_data_iterators, train_step
from memscope.demo.traced_training import megatron_like_args
from memscope.integrations.megatron import MemScopeMegatronRuntime


def main() -> None:
    outdir, mode = sys.argv[1], sys.argv[2]
    cfg = TinyGPTConfig(num_microbatches=2)
    init_process(0, 1, free_port(), cfg)
    chunks = build_model(cfg)
    optimizer = build_optimizer(chunks, cfg)
    runtime = MemScopeMegatronRuntime.from_megatron_args(
        megatron_like_args(cfg, ["--memscope", "--memscope-outdir", outdir])
    )
    runtime.attach_model(chunks)
    runtime.start()
    iterators = make_data_iterators(cfg)
    train_step(chunks, optimizer, cfg, 0, iterators, runtime)  # one good step

    if mode == "oom":

        def explode(module, args):  # test-only fault, not part of memscope
            raise torch.OutOfMemoryError("simulated: tried to allocate 80.00 GiB")

        chunks[0].decoder.layers[1].register_forward_pre_hook(explode)
    elif mode == "exit":
        sys.exit(3)
    elif mode == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    train_step(chunks, optimizer, cfg, 1, iterators, runtime)


if __name__ == "__main__":
    main()
