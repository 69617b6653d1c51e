"""Run a FlagScale tree's ``flagscale/train/train_gpt.py`` as ``__main__`` up to argument parsing.

    python flagscale_train_gpt_args_worker.py TREE OUT.json -- TRAINING ARGS...

``train_gpt.py`` itself runs unmodified (its imports, its ``__main__`` block, the
``extra_args_provider`` it builds). STUB (needs a GPU): FlagScale's ``pretrain`` is replaced by
a function that does what ``pretrain`` does first, parsing the command line with Megatron's
real ``parse_args`` and the provider it was given, and writes the parsed arguments to OUT.json
instead of initialising CUDA. Exit status 2 (argparse) when the arguments are not accepted.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import warnings
from typing import Any

TREE, OUT = sys.argv[1], sys.argv[2]
TRAINING_ARGS = sys.argv[sys.argv.index("--") + 1 :]
sys.path[:0] = [os.path.join(TREE, "third_party", "Megatron-LM"), TREE]
warnings.filterwarnings("ignore")


def _parse_instead_of_pretrain(*args: Any, **kwargs: Any) -> None:
    from megatron.training.arguments import parse_args

    parsed = parse_args(kwargs["extra_args_provider"])
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(vars(parsed), f, default=str)


def main() -> None:
    import flagscale.train.train as training

    training.pretrain = _parse_instead_of_pretrain
    sys.argv = [os.path.join(TREE, "flagscale", "train", "train_gpt.py"), *TRAINING_ARGS]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
