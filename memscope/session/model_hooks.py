"""The hooks a session puts on the model chunks, and how many it put on and took off."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memscope.capture.hooks import HookSet
from memscope.capture.tracer import MemoryTracer
from memscope.config import RuntimeConfig


class ModelHooks:
    """Module and parameter-gradient hooks of one session (once attached, until removed)."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.hooks: HookSet | None = None
        #: The report's metadata counts: modules and parameters hooked, handles removed.
        self.counts = {"modules_hooked": 0, "params_hooked": 0, "hook_handles_removed": 0}

    def attach(self, tracer: MemoryTracer | None, chunks: Sequence[torch.nn.Module]) -> None:
        """Hook ``chunks`` (once: while hooks are on, a second call does nothing)."""
        if tracer is None or not chunks or self.hooks is not None:
            return
        self.hooks = HookSet(tracer)
        if self.config.hook_modules:
            self.hooks.attach_modules(list(chunks))
        if self.config.hook_param_grads:
            self.hooks.attach_params(list(chunks))
        self.counts["modules_hooked"] = len(self.hooks.labels)
        self.counts["params_hooked"] = len(self.hooks.param_names)

    def remove(self) -> None:
        """Take every hook off (counted in ``hook_handles_removed``)."""
        if self.hooks is not None:
            self.counts["hook_handles_removed"] += self.hooks.remove()
            self.hooks = None
