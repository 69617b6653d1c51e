"""Allocator APIs newer than (or changed since) the supported torch floor are feature-detected:
a missing attribute or keyword gives one reason, logged once, never an exception."""

from __future__ import annotations

import warnings

import pytest
import torch

from memscope.capture import torch_features
from memscope.capture.torch_features import (
    cuda_history_unsupported,
    device_used_unsupported,
    log_once,
    missing_api,
)


def test_this_torch_has_every_allocator_api_memscope_calls():
    assert cuda_history_unsupported() is None
    assert device_used_unsupported() is None


def test_history_api_of_the_pre_2_1_signature_is_refused_by_keyword(monkeypatch):
    def old_record_memory_history(enabled, record_context=True, trace_alloc_max_entries=1):
        raise AssertionError("the guard must not call it")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", old_record_memory_history)
    reason = cuda_history_unsupported()
    assert reason == (
        f"torch.cuda.memory._record_memory_history of torch {torch.__version__} takes no "
        "context, stacks, max_entries"
    )


def test_missing_snapshot_and_mem_get_info_are_named(monkeypatch):
    monkeypatch.delattr(torch.cuda.memory, "_snapshot")
    monkeypatch.delattr(torch.cuda, "mem_get_info")
    assert cuda_history_unsupported() == (
        f"torch.cuda.memory._snapshot is not in torch {torch.__version__}"
    )
    assert (
        device_used_unsupported() == f"torch.cuda.mem_get_info is not in torch {torch.__version__}"
    )


def test_keywords_through_kwargs_or_an_uninspectable_builtin_are_accepted():
    def forwards(enabled="all", **kwargs):
        return None

    assert missing_api(type("M", (), {"f": staticmethod(forwards)}), "m", "f", ("stacks",)) is None
    assert missing_api(torch._C, "torch._C", "_current_graph_task_id", ("anything",)) is None


def test_a_reason_is_logged_once_per_process(monkeypatch):
    monkeypatch.setattr(torch_features, "_logged", set())
    with pytest.warns(RuntimeWarning, match="memscope: torch.cuda.x is not in torch"):
        assert log_once("torch.cuda.x is not in torch") == "torch.cuda.x is not in torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert log_once("torch.cuda.x is not in torch") == "torch.cuda.x is not in torch"
