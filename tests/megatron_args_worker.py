"""Parse Megatron-LM command lines with one Megatron version's own argument parser.

    python megatron_args_worker.py ROOT JOBS.json

JOBS.json is a list of ``{"world_size", "out", "argv"}``: each command line (``argv``, the
training arguments) is parsed as a launch of that world size, its result written to ``out``;
one process parses them all (importing ``megatron.training`` is most of the time).

ROOT is the directories (``os.pathsep``-separated) holding ``megatron/`` and what it imports
(FlagScale's ``third_party/Megatron-LM`` and the FlagScale tree itself), or ``-`` for the
``megatron.training`` that the interpreter has installed (the megatron-core 0.19 wheel ships
it; 0.16.1's does not). Runs that version's real ``parse_args`` and ``validate_args`` and writes
``{"version", "arguments_file", "args"}`` per command line.
STUBS (no GPU, no Transformer Engine here): the device's compute capability and TE's version
check, which ``validate_args`` consults, answer as on an H100 with a recent TE.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings

ROOT, JOBS = sys.argv[1], sys.argv[2]
if ROOT != "-":
    sys.path[:0] = ROOT.split(os.pathsep)
warnings.filterwarnings("ignore")


def main() -> None:
    # What a launcher exports (Megatron's examples set CUDA_DEVICE_MAX_CONNECTIONS=1, which
    # validate_args requires with tensor or context parallelism).
    os.environ.update(RANK="0", LOCAL_RANK="0")
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    os.environ["NO_VCS_VERSION"] = "1"  # package_info would append the cwd's git commit
    with open(JOBS, encoding="utf-8") as f:
        jobs = json.load(f)
    with contextlib.redirect_stdout(io.StringIO()):
        import torch
        from megatron.core import package_info
        from megatron.training import arguments

        torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # STUB: no GPU here
        if hasattr(arguments, "get_device_arch_version"):
            arguments.get_device_arch_version = lambda: 9  # STUB: no GPU here
        if hasattr(arguments, "is_te_min_version"):
            arguments.is_te_min_version = lambda *a, **k: True  # STUB: no Transformer Engine
    for job in jobs:
        os.environ["WORLD_SIZE"] = str(job["world_size"])
        with contextlib.redirect_stdout(io.StringIO()):
            sys.argv = ["pretrain_gpt.py", *job["argv"]]
            args = arguments.parse_args()
            arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        result = {
            "version": package_info.__version__,
            "arguments_file": arguments.__file__,
            "args": json.loads(json.dumps(vars(args), default=str)),
        }
        with open(job["out"], "w", encoding="utf-8") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
