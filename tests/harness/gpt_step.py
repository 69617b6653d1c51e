"""Test helper: the forward step and loss function the train-step workers hand to a real
Megatron-LM ``train_step``, written as ``pretrain_gpt.py``'s: the loss is validated by the
rerun state machine and returned as (sum, tokens, report)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch


def forward_step(data_iterator: Any, model: Any) -> Any:
    """One microbatch of the tiny GPT's data through ``model``, with its loss function."""
    batch = next(data_iterator)
    output = model(
        batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"]
    )
    return output, partial(loss_func, batch["loss_mask"])


def loss_func(loss_mask: torch.Tensor, output: torch.Tensor) -> Any:
    """As pretrain_gpt's: validated by the rerun state machine, (sum, tokens, report)."""
    from megatron.core.rerun_state_machine import get_rerun_state_machine

    loss = torch.sum(output.float().view(-1) * loss_mask.view(-1))
    num_tokens = loss_mask.sum().to(torch.int)
    get_rerun_state_machine().validate_result(
        result=loss, rejection_func=torch.isnan, message="NaN loss", tolerance=0.0, fatal=True
    )
    report = torch.cat([loss.detach().view(1), num_tokens.view(1)])
    return loss, num_tokens, {"lm loss": report}
