"""The tiny GPT harness of ``memscope demo``: a small real megatron-core GPT trained on CPU.

* :mod:`memscope.demo.megatron_cpu_shims` -- CPU shims for the few CUDA-only calls in
  megatron-core 0.16.1 (``apply_cpu_shims()``).
* :mod:`memscope.demo.tiny_gpt` -- ``TinyGPTConfig``, model, optimizer and process setup.
* :mod:`memscope.demo.tiny_gpt_training` -- synthetic data, the Megatron-style ``train_step``
  and ``run_training``.
* :mod:`memscope.demo.launcher` -- ``spawn`` (multi-process launch) and ``free_port``.
* :mod:`memscope.demo.traced_training` -- ``traced_worker`` (training with MemScope wired in),
  ``WorkerResult``, the ``TrainingObserver`` protocol and ``megatron_like_args``.

The test suite builds on these; its instrumentation (gradient / parameter digests, hook
counts, injected faults) lives in the repository's ``tests/harness/``, not in this package.
"""
