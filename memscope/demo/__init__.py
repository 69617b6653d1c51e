"""Demo / test harness: a tiny real megatron-core GPT trained on CPU with gloo.

* :mod:`memscope.demo.megatron_cpu_shims` -- CPU shims for the few CUDA-only calls in
  megatron-core 0.16.1 (``apply_cpu_shims()``).
* :mod:`memscope.demo.tiny_gpt` -- ``TinyGPTConfig``, ``run_training``, ``spawn``, ...
"""
