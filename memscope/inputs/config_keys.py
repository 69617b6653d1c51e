"""Warnings about the keys of a training config that the estimator does not read."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from memscope.analysis.static.read_keys import memscope_keys

# Real Megatron-LM / FlagScale 0.8.0 arguments (megatron/training/arguments.py,
# flagscale/train/arguments.py) that look like a key above: never reported as misspelled.
MEGATRON_LOOKALIKES = frozenset(
    [
        "add_position_embedding",
        "model_parallel_size",
        "moe_router_group_topk",
        "moe_z_loss_coeff",
        "vocab_file",
    ]
)
YAML_TYPO_CUTOFF = 0.85  # FlagScale YAMLs hold hundreds of Megatron keys we do not read


def memscope_key_warnings(keys: Iterable[str]) -> list[str]:
    """One warning per ``memscope*`` key that is no MemScope setting (a typo the tracer
    would also not know), with the nearest setting."""
    known = sorted(memscope_keys())
    out = []
    for key in keys:
        if key.startswith("memscope") and key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            out.append(f"config key {key!r} is not a MemScope setting (ignored){hint}")
    return out


def unknown_key_warnings(keys: Iterable[str], known: Iterable[str], yaml: bool) -> list[str]:
    """One warning per key the estimator does not read.

    JSON (``yaml=False``): every unknown key, with the nearest known key when one is close.
    FlagScale YAML: only a key that is very close to a memory-relevant key we read and is no
    Megatron argument we know of (most YAML keys are Megatron's and simply not ours)."""
    known = sorted(set(known) | memscope_keys())
    out = memscope_key_warnings(keys)
    for key in keys:
        if key in known or key.startswith("memscope"):
            continue
        if yaml:
            if key in MEGATRON_LOOKALIKES:
                continue
            near = difflib.get_close_matches(key, known, n=1, cutoff=YAML_TYPO_CUTOFF)
            if near:
                out.append(
                    f"config key {key!r} is not a Megatron argument the estimator reads; did "
                    f"you mean {near[0]!r}? (ignored)"
                )
            continue
        near = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        out.append(f"config key {key!r} is not read by the static estimator (ignored){hint}")
    return out
