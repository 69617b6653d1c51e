"""A backend declares its name in its own ``register()``: selecting it by name needs no
edit of ``config.py``, and an unknown name falls back to ``auto`` with one warning."""

from __future__ import annotations

import argparse
import json
import warnings

import pytest
import torch

from memscope.capture.backends import registry
from memscope.capture.backends.base import BackendCapabilities, MemoryBackend, MemorySample
from memscope.capture.backends.host import host_rss_bytes
from memscope.config import RuntimeConfig
from memscope.integrations.megatron.args import add_memscope_args
from memscope.integrations.torch import MemScopeTorchRuntime


class HostRssBackend(MemoryBackend):
    """A small real backend, not part of MemScope: this process's resident set size."""

    name = "host_rss"

    def __init__(self) -> None:
        self._peak = host_rss_bytes()
        self.samples = 0

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            device_type="cpu",
            exact_categories=False,
            true_peak=False,
            peak_context=False,
            can_synchronize=False,
            distinct_reserved=False,
        )

    def sample(self, detailed: bool = False) -> MemorySample:
        self.samples += 1
        now = host_rss_bytes()
        self._peak = max(self._peak, now)
        return MemorySample(now, now, self._peak, self._peak)

    def reset_peak(self) -> None:
        self._peak = host_rss_bytes()


def register() -> None:
    """What a backend module's ``register()`` does: the one place its name is written."""
    registry.register_backend(
        registry.BackendSpec(
            name=HostRssBackend.name,
            factory=lambda options: HostRssBackend(),
            is_available=lambda: True,
            auto_priority=0,  # never auto's pick
        )
    )


@pytest.fixture
def host_rss_registered(monkeypatch):
    """The toy backend registered for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register()


def _train(ms: MemScopeTorchRuntime, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for step in range(2):
        with ms.step(step):
            model(torch.ones(8, 16)).square().mean().backward()
            with ms.optimizer_step():
                opt.step()
            opt.zero_grad()


def _traced_report(tmp_path, backend: str) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemScopeTorchRuntime(model, opt, outdir=str(tmp_path), backend=backend) as ms:
        _train(ms, model, opt)
    assert ms.report_path is not None
    with open(ms.report_path, encoding="utf-8") as f:
        return json.load(f)


def test_a_registered_backend_is_selected_by_name(tmp_path, host_rss_registered):
    assert "host_rss" in registry.backend_choices()
    assert registry.resolve_backend_name("auto") != "host_rss"  # priority 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = _traced_report(tmp_path, "host_rss")
    assert not [w for w in caught if "backend" in str(w.message)]
    assert report["metadata"]["backend"] == "host_rss"
    assert report["metadata"]["config"]["backend"] == "host_rss"
    assert report["metadata"]["steps_completed"] == 2
    assert not [w for w in report["warnings"] if "backend" in w]
    # its readings are the figures: a process's RSS (a torch process holds well over 50 MiB),
    # where the storage backend would count this model's few KiB of tensors
    assert report["steps"][-1]["allocated_end"] > 50 * 2**20
    assert report["peak"]["memory_bytes"] >= report["steps"][0]["allocated_start"]


def test_the_flag_takes_a_registered_name_without_a_config_edit(host_rss_registered):
    parser = add_memscope_args(argparse.ArgumentParser())
    args = parser.parse_args(["--memscope", "--memscope-backend", "host_rss"])
    cfg = RuntimeConfig.from_megatron_args(args)
    assert cfg.backend == "host_rss" and cfg.notes == []


def test_the_flag_with_a_name_registered_nowhere_is_auto_said_once():
    args = add_memscope_args(argparse.ArgumentParser()).parse_args(["--memscope-backend", "tpu"])
    with pytest.warns(UserWarning) as caught:
        cfg = RuntimeConfig.from_megatron_args(args)
    assert cfg.backend == "auto"
    assert [str(w.message) for w in caught] == cfg.notes
    assert len(cfg.notes) == 1 and "('auto', 'cuda', 'storage'), not 'tpu'" in cfg.notes[0]


def test_a_name_registered_nowhere_falls_back_to_auto_with_one_warning(tmp_path):
    with pytest.warns(UserWarning) as caught:
        report = _traced_report(tmp_path, "tpu")
    about_backend = [str(w.message) for w in caught if "backend" in str(w.message)]
    assert len(about_backend) == 1
    line = about_backend[0]
    assert "not 'tpu'" in line and "('auto', 'cuda', 'storage')" in line
    assert "using the default (backend='auto')" in line
    assert [w for w in report["warnings"] if "backend" in w] == [line]
    assert report["metadata"]["backend"] == registry.resolve_backend_name("auto")
    assert report["metadata"]["config"]["backend"] == "auto"
    assert report["metadata"]["steps_completed"] == 2
