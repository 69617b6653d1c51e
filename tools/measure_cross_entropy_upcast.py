"""What megatron-core's unfused vocab-parallel cross entropy allocates in its forward, by release.

Megatron's GPT loss (``compute_language_model_loss``) hands the 16-bit logits to
``tensor_parallel.vocab_parallel_cross_entropy``. Up to megatron-core 0.7 the caller upcast
them first (``logits.float()``) and ``_VocabParallelCrossEntropy.forward`` subtracted the
maximum out of place; from 0.8 the upcast is inside (``calculate_logits_max``) and the
subtraction in place (megatron/core/tensor_parallel/cross_entropy.py). This script runs the
forward on fp16 ``[s, b, V]`` logits in a one-process gloo group on CPU and prints its peak
above the logits (torch.profiler's memory timeline), in units of the fp32 logits size:

- the installed megatron-core's function, called as its ``compute_language_model_loss``
  calls it (the logits as they are);
- with ``--cross-entropy-py FILE``, another release's ``cross_entropy.py`` (e.g. megatron-core
  0.7.0's, from its wheel), called as that release's caller did (``logits.float()``), loaded
  as a sibling of the installed module so that it uses the installed ``parallel_state`` and
  ``VocabUtility`` (their functions are the same in both).

    python tools/measure_cross_entropy_upcast.py [--cross-entropy-py FILE] [--upcast-first]

The static estimator's terms (``memscope/analysis/static/activations.py``:
``cross_entropy_saved`` plus ``loss_moments``' ``cross_entropy``, less the 16-bit logits) are
checked against these figures by ``tests/test_cross_entropy_release.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure_fused_cross_entropy import _memory_events, _peak_above

SEQ, BATCH, VOCAB = 64, 2, 512


def _cross_entropy(path: str | None) -> Any:
    """``vocab_parallel_cross_entropy`` of the installed megatron-core, or of ``path``."""
    if path is None:
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        return vocab_parallel_cross_entropy
    name = "megatron.core.tensor_parallel._other_release_cross_entropy"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.vocab_parallel_cross_entropy


def _measure_here(path: str | None, upcast_first: bool) -> int:
    """Forward peak above the fp16 logits, in bytes (the second of two runs)."""
    import tempfile

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.profiler import ProfilerActivity, profile

    store = os.path.join(tempfile.mkdtemp(prefix="memscope-ce-"), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    function = _cross_entropy(path)
    torch.manual_seed(0)
    target = torch.randint(0, VOCAB, (SEQ, BATCH))
    peak = 0
    for _ in range(2):
        logits = torch.randn(SEQ, BATCH, VOCAB, dtype=torch.float16, requires_grad=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                     record_shapes=True, with_stack=True) as fwd:  # fmt: skip
            loss = function(logits.float() if upcast_first else logits, target)
        peak = _peak_above(_memory_events(fwd))
        del logits, loss
    return peak


def measure(path: str | None = None, upcast_first: bool = False) -> int:
    """The forward's peak above the logits, measured in a fresh interpreter."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_one"]
    if path is not None:
        cmd += ["--cross-entropy-py", path]
    if upcast_first:
        cmd.append("--upcast-first")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring failed: {proc.stderr[-2000:]}")
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["forward_peak"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cross-entropy-py", default=None)
    parser.add_argument(
        "--upcast-first", action="store_true", help="call it on logits.float() (<= 0.7's caller)"
    )
    parser.add_argument("--_one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._one:
        peak = _measure_here(args.cross_entropy_py, args.upcast_first)
        print(json.dumps({"forward_peak": peak}))
        return 0
    fp32_logits = SEQ * BATCH * VOCAB * 4
    source = args.cross_entropy_py or "installed megatron-core"
    peak = measure(args.cross_entropy_py, args.upcast_first)
    print(f"{source}{' (on logits.float())' if args.upcast_first else ''}: forward peak above "
          f"the fp16 logits {peak} B = {peak / fp32_logits:.3f} fp32 logits "
          f"([{SEQ}, {BATCH}, {VOCAB}])")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
