"""Backends declare capabilities through one interface and a registry; the tracer obeys them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from memscope.capture.backends import (
    backend_choices,
    backend_names,
    create_backend,
    resolve_backend_name,
)
from memscope.config import RuntimeConfig

CAPTURE = Path(__file__).resolve().parent.parent / "memscope" / "capture"


def test_the_configuration_accepts_exactly_the_registered_backends():
    assert backend_choices() == ("auto", *backend_names()) == ("auto", "cuda", "storage")
    for name in backend_choices():
        assert RuntimeConfig(backend=name).validate().backend == name
    with pytest.raises(ValueError, match=r"one of \('auto', 'cuda', 'storage'\), not 'tpu'"):
        RuntimeConfig(backend="tpu").validate()


def test_auto_picks_the_exact_storage_backend_without_a_gpu():
    if torch.cuda.is_available():
        assert resolve_backend_name("auto") == "cuda"
    else:
        assert resolve_backend_name("auto") == "storage"
        caps = create_backend("auto").capabilities
        assert caps.device_type == "cpu" and caps.exact_categories and caps.peak_context
        assert not caps.can_synchronize and not caps.distinct_reserved


def test_an_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="must be one of"):
        resolve_backend_name("tpu")


def test_storage_backend_offers_a_categorizer_and_cuda_needs_a_gpu():
    storage = create_backend("storage")
    assert type(storage.categorizer()).__name__ == "StorageCategorizer"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            create_backend("cuda")


@pytest.mark.parametrize(
    "module",
    [
        "tracer.py",
        "event_emitter.py",
        "training_context.py",
        "step_recorder.py",
        "category_policy.py",
        "hooks.py",
    ],
)
def test_device_agnostic_capture_modules_hold_no_backend_type_checks(module):
    tree = ast.parse((CAPTURE / module).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "cuda":
            raise AssertionError(f"{module}:{node.lineno} touches torch.cuda")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            assert not any("Backend" in n for n in names), f"{module}:{node.lineno}"
        if isinstance(node, ast.Compare) and any(
            isinstance(n, ast.Attribute) and n.attr == "name" for n in ast.walk(node.left)
        ):
            raise AssertionError(f"{module}:{node.lineno} compares a backend name")
