"""Process-level safety nets so a dying training process still leaves a report.

``CrashGuard`` chains ``sys.excepthook`` (uncaught exceptions, OOM included), registers an
``atexit`` handler (exit without ``finalize()``), takes SIGTERM when nobody else handles it
(torchrun stops the surviving workers with SIGTERM), and attaches the CUDA allocator's OOM
observer (through :mod:`memscope.capture.device`). Each calls back into the session;
everything is undone by :meth:`uninstall`. None of them keeps a finished session alive: the
OOM observer is held weakly and detached (``capture/device.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from memscope.capture.device import attach_oom_observer, detach_oom_observer

logger = logging.getLogger("memscope")

#: ``on_failure(oom, reason, final)``: the training failed (``final``: the exception that ends
#: the run; not final: the allocator's OOM observer, before the exception is raised).
OnFailure = Callable[[bool, str, bool], None]


class CrashGuard:
    """Installs and removes the process-level handlers of one tracing session, and turns a
    training failure into one call of ``on_failure`` per exception."""

    def __init__(self, on_failure: OnFailure, on_exit: Callable[[str], None]) -> None:
        self._on_failure = on_failure
        self._on_exit = on_exit
        self._exception: BaseException | None = None
        self._prev_excepthook: Any = None
        self._prev_sigterm: Any = None
        self.installed = False

    def install(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._atexit)
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                current = signal.getsignal(signal.SIGTERM)
                if current in (signal.SIG_DFL, None):
                    self._prev_sigterm = current
                    signal.signal(signal.SIGTERM, self._sigterm)
        attach_oom_observer(self._cuda_oom)  # on a GPU whose torch has the hook
        self.installed = True

    def uninstall(self) -> None:
        if not self.installed:
            return
        self.installed = False
        detach_oom_observer(self._cuda_oom)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        atexit.unregister(self._atexit)
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None

    def record(self, exc: BaseException) -> None:
        """A training failure (OOM or other); the same exception reported again (by an outer
        handler, then the excepthook) changes nothing. Never raises."""
        if exc is self._exception:
            return
        self._exception = exc
        try:
            reason = f"{type(exc).__name__}: {exc}"[:2000]
        except Exception:  # an exception that cannot be printed is still named
            reason = type(exc).__name__
        self._report(isinstance(exc, torch.OutOfMemoryError), reason, True)

    def _report(self, oom: bool, reason: str, final: bool) -> None:
        try:
            self._on_failure(oom, reason, final)
        except Exception as inner:
            logger.warning("memscope: could not write the crash report: %s", inner)

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        self.record(exc)
        hook = self._prev_excepthook or sys.__excepthook__
        hook(exc_type, exc, tb)

    def _atexit(self) -> None:
        self._on_exit("the process exited before finalize() was called")

    def _sigterm(self, signum: int, frame: Any) -> None:
        self._on_exit("terminated by SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _cuda_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        if not self.installed:
            return
        reason = (
            f"CUDA out of memory on device {device}: tried to allocate {alloc} bytes with "
            f"{device_alloc} allocated and {device_free} free"
        )
        self._report(True, reason, False)
