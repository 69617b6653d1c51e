"""Megatron's global memory buffer (megatron/core/utils.py ``GlobalMemoryBuffer``: grown to its
largest request, never freed) is a run-long buffer in every view of a real megatron-core run:
the per-category totals, what was live at the peak, the allocator history's bands, the step
transitions, never a microbatch's activation nor a leak."""

from __future__ import annotations

import pytest
import torch

from memscope.capture.backends.storage import StorageLedgerBackend
from memscope.events.schema import CAT_ACTIVATIONS, CATEGORIES

LABEL = "global_memory_buffer[mpu, float32]"


def _buffer_bytes(cfg) -> int:
    # the local DotProductAttention's baddbmm output [b * heads, sq, sk] in fp32, the buffer's
    # only use without sequence parallelism (dot_product_attention.py, "mpu")
    return cfg.micro_batch_size * cfg.num_attention_heads * cfg.seq_length**2 * 4


def test_the_ledger_moves_a_run_long_buffer_out_of_the_microbatch_that_made_it():
    ledger = StorageLedgerBackend("cpu")
    ledger.start()
    try:
        categorizer = ledger.categorizer()
        categorizer.set_alloc_category(CAT_ACTIVATIONS)
        scratch = torch.empty(1024)
        categorizer.mark_run_long(scratch, "global_memory_buffer[mpu, float32]")
        categorizer.mark_run_long(scratch, "global_memory_buffer[mpu, float32]")  # idempotent
        totals = ledger.live_bytes_by_category()
        items = ledger.live_composition() or ()
    finally:
        ledger.stop()
    assert totals["buffers"] == 4096 and totals["activations"] == 0
    (item,) = items
    assert (item.category, item.phase, item.module, item.microbatch) == ("buffers", "", LABEL, None)


@pytest.mark.integration  # trains megatron-core in this process (history_run)
def test_megatrons_global_memory_buffer_is_a_run_long_buffer_in_every_view(history_run, small_cfg):
    _, report, _ = history_run
    expected = _buffer_bytes(small_cfg)
    assert "buffers" in CATEGORIES
    # the totals: every step ends with it, as buffers
    assert all(row["categories_end"]["buffers"] == expected for row in report["steps"])
    peak = report["peak"]
    assert peak["categories"]["buffers"] == expected
    # live at the peak: owned by the buffer, not by microbatch 0's attention
    held = [i for i in peak["composition"]["items"] if i["category"] == "buffers"]
    assert [(i["module"], i["phase"], i["microbatch"], i["bytes"]) for i in held] == [
        (LABEL, "", None, expected)]  # fmt: skip
    # the allocator history's bands (held all through the step: one band per category)
    bands = report["allocator_timeline"]["active_memory"]["bands"]
    assert [b["label"] for b in bands if b["category"] == "buffers"] == ["(held all step)"]
    # created once in step 0: one-time growth, never a leak
    transitions = report["step_transitions"]
    first = transitions["transitions"][0]
    assert first["step"] == 0 and first["kind"] == "one_time_growth"
    assert first["category_deltas"]["buffers"] == expected
    assert transitions["leaks"] == []
    # the static comparison sets the estimator's buffer term (activations.py buffer_bytes)
    # against it, like for like
    rows = {c["component"]: c for c in report["comparisons"]["components"]}
    assert rows["buffers"]["static_bytes"] == rows["buffers"]["runtime_bytes"] == expected


def test_megatron_fsdps_own_global_memory_buffer_is_run_long_too():
    from megatron.core.distributed.fsdp.src.megatron_fsdp import utils as fsdp_utils

    from memscope.capture.ownership import run_long_buffers

    before = getattr(fsdp_utils, "_GLOBAL_MEMORY_BUFFER", None)
    # its get_tensor allocates on torch.cuda.current_device(): the tensor it would keep, on CPU
    fsdp_utils._GLOBAL_MEMORY_BUFFER = fsdp_utils.GlobalMemoryBuffer()
    scratch = torch.empty(256, dtype=torch.bfloat16)
    fsdp_utils._GLOBAL_MEMORY_BUFFER.buffer[("fsdp_ag", torch.bfloat16)] = scratch
    try:
        found = dict(run_long_buffers())
    finally:
        fsdp_utils._GLOBAL_MEMORY_BUFFER = before
    assert found["megatron_fsdp.global_memory_buffer[fsdp_ag, bfloat16]"] is scratch
