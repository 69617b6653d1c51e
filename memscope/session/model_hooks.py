"""The hooks a session puts on the model chunks, and how many it put on and took off.

Hooks sit on the model only while they record: a step outside the recording window (past
``--memscope-hook-steps``, before ``--memscope-step-start``, from ``--memscope-step-end`` on)
starts with them taken off, so those steps run the model's own forward and backward with
nothing of MemScope's in them; a later step inside the window puts them back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from memscope.capture.hooks import HookSet
from memscope.capture.safety import FailureLog
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig


class ModelHooks:
    """Module and parameter-gradient hooks of one session (on while steps record)."""

    def __init__(self, config: RuntimeConfig, failures: FailureLog) -> None:
        self.config = config
        self._failures = failures
        self.hooks: HookSet | None = None
        self._target: tuple[MemoryTracer, list[torch.nn.Module]] | None = None
        #: The report's metadata counts: modules and parameters hooked, handles removed,
        #: and how often the hooks were taken off for steps outside the recording window.
        self.counts = {
            "modules_hooked": 0,
            "params_hooked": 0,
            "hook_handles_removed": 0,
            "hooks_suspended": 0,
        }

    def attach(self, tracer: MemoryTracer | None, chunks: Sequence[torch.nn.Module]) -> None:
        """Hook ``chunks`` (once: a second call does nothing until :meth:`remove`)."""
        if tracer is None or not chunks or self._target is not None:
            return
        self._target = (tracer, list(chunks))
        self._put_on()

    def follow_window(self, recording: bool) -> None:
        """A step starts that records module/grad events (``recording``) or does not: put
        the hooks back on, or take them off, accordingly. Never raises: a failure takes
        every hook off for good (recorded under ``module_hooks``); step boundaries go on."""
        if self._target is None:
            return
        try:
            if recording and self.hooks is None:
                self._put_on()
            elif not recording and self.hooks is not None:
                self._take_off()
                self.counts["hooks_suspended"] += 1
        except Exception as exc:
            self._failures.record("module_hooks", exc)
            with contextlib.suppress(Exception):
                self.remove()

    def remove(self) -> None:
        """Take every hook off for good (counted in ``hook_handles_removed``)."""
        self._take_off()
        self._target = None

    def _put_on(self) -> None:
        assert self._target is not None and self.hooks is None
        tracer, chunks = self._target
        self.hooks = HookSet(tracer)  # set first: a failure part-way still removes its handles
        if self.config.hook_modules:
            self.hooks.attach_modules(chunks)
        if self.config.hook_param_grads:
            self.hooks.attach_params(chunks)
        self.counts["modules_hooked"] = len(self.hooks.labels)
        self.counts["params_hooked"] = len(self.hooks.param_names)

    def _take_off(self) -> None:
        if self.hooks is not None:
            self.counts["hook_handles_removed"] += self.hooks.remove()
            self.hooks = None
