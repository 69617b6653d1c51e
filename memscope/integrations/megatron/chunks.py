"""The model Megatron hands the runtime: its chunks unwrapped (DDP, Float16Module), and what
is read from them for the report (the model's own settings for the static estimate, the
global layer numbers of a pipeline stage). A failed reading is recorded once and changes
nothing else: the estimate falls back to the args, names stay stage-local."""

from __future__ import annotations

from typing import Any

import torch

from memscope.capture.hooks import unwrap_module
from memscope.capture.safety import FailureLog
from memscope.inputs.inrun import ModelFacts
from memscope.integrations.megatron.layer_numbers import global_layer_numbers
from memscope.integrations.megatron.model_spec import read_model_facts


def unwrap_chunks(model: torch.nn.Module | list[torch.nn.Module]) -> list[Any]:
    """One module or Megatron's list of model chunks (every virtual stage), unwrapped."""
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    return [unwrap_module(c) if isinstance(c, torch.nn.Module) else c for c in chunks]


def read_chunks(
    chunks: list[Any], pp_size: int, failures: FailureLog
) -> tuple[ModelFacts | None, dict[str, int]]:
    """The model's own settings (``None`` when they can't be read) and the global layer
    numbers by event name (only where they differ from the local ones: several stages or
    chunks)."""
    facts, numbers = None, {}
    try:
        facts = read_model_facts(chunks)
    except Exception as exc:  # the estimate falls back to the args alone
        failures.record("model_spec", exc, disable=False)
    if pp_size > 1 or len(chunks) > 1:  # else local = global numbering
        try:
            numbers = global_layer_numbers(chunks)
        except Exception as exc:  # names stay stage-local; tracing goes on
            failures.record("layer_numbers", exc, disable=False)
    return facts, numbers
