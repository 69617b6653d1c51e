"""The CUDA allocator's OOM observer: one dispatcher per process, observers held weakly, so a
finished tracing session (and the model and optimizer it references) can be freed.

On the first GPU run (H100, torch 2.11) every traced run in one process kept its model,
gradients and optimizer state alive after ``finalize()``: torch cannot detach an OOM
observer, and the one attached was the session's bound method. These tests stand in for
torch's CUDA-only ``_cuda_attach_out_of_memory_observer`` (no GPU here) with a recorder and
drive the real :class:`CrashGuard`.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from memscope.capture import device
from memscope.session.crash_guard import CrashGuard


@pytest.fixture
def attached(monkeypatch) -> list:
    """What torch was asked to attach (a GPU and torch's hook stood in for)."""
    given: list = []
    monkeypatch.setattr(device, "accelerator_available", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", given.append,
                        raising=False)  # fmt: skip
    monkeypatch.setattr(device, "_observers", [])
    monkeypatch.setattr(device, "_dispatcher_attached", False)
    return given


class _Session:
    """Stands for a tracing session: what the guard calls back, and what it must not keep."""

    def __init__(self) -> None:
        self.failures: list[tuple[bool, str, bool]] = []
        self.model = torch.zeros(1024)

    def on_failure(self, oom: bool, reason: str, final: bool) -> None:
        self.failures.append((oom, reason, final))


def _guard(session: _Session) -> CrashGuard:
    return CrashGuard(session.on_failure, lambda reason: None)


def test_torch_is_given_one_dispatcher_for_every_session(attached):
    first, second = _Session(), _Session()
    guards = [_guard(first), _guard(second)]
    for guard in guards:
        guard.install()
    assert len(attached) == 1
    attached[0](0, 2**30, 5 * 2**30, 2**20)  # the allocator reports a failed allocation
    for session in (first, second):
        assert session.failures == [(True, session.failures[0][1], False)]
        assert "tried to allocate 1073741824 bytes" in session.failures[0][1]
    for guard in guards:
        guard.uninstall()


def test_an_uninstalled_guard_is_no_longer_called(attached):
    session = _Session()
    guard = _guard(session)
    guard.install()
    guard.uninstall()
    attached[0](0, 1, 2, 3)
    assert session.failures == []
    assert device._observers == []


def test_a_finished_session_is_freed(attached):
    session = _Session()
    guard = _guard(session)
    guard.install()
    guard.uninstall()
    alive = weakref.ref(session.model)
    del session, guard
    gc.collect()
    assert alive() is None


def test_an_observer_is_held_weakly(attached):
    session = _Session()
    assert device.attach_oom_observer(session.on_failure)
    alive = weakref.ref(session.model)
    del session
    gc.collect()
    assert alive() is None
    attached[0](0, 1, 2, 3)  # a dead observer is dropped, not called
    assert device._observers == []


def test_an_observer_that_raises_does_not_stop_the_others(attached):
    calls: list[int] = []

    def broken(*_: int) -> None:
        raise RuntimeError("observer bug")

    def working(*args: int) -> None:
        calls.append(args[1])

    assert device.attach_oom_observer(broken) and device.attach_oom_observer(working)
    attached[0](0, 7, 0, 0)
    assert calls == [7]
