"""The one place that says which live memory is parameters, gradients, optimizer state, ...

The rules, applied only by backends that classify every byte (``exact_categories``):

* parameters and buffers of the model -> ``parameters``;
* each parameter's gradient tensors (``.grad``, and any attribute the framework adapter names,
  e.g. Megatron's ``.main_grad`` view into the DDP grad buffer) -> ``gradients``;
* optimizer state tensors and parameters the optimizer holds that the model does not
  (fp32 master copies) -> ``optimizer_state``; so is whatever the optimizer step creates and
  keeps (Adam's moments on the first step);
* storages created inside module forwards, recomputation and backward -> ``activations``;
  those autograd saves for backward are told apart from temporaries (a pass-through
  ``saved_tensors_hooks`` pair is pushed for the forward-backward phase of each step);
* run-long scratch a framework keeps for the whole run (Megatron's global memory buffer, see
  :func:`memscope.capture.ownership.run_long_buffers`) -> ``buffers``, owned by the buffer
  (``global_memory_buffer[name, dtype]``), not by the module and microbatch that first asked
  for it; checked at every phase end, so a buffer grown in a step is one from that step's end;
* anything else (created between steps, or before tracing started) -> ``other``.

With a backend that cannot classify, every method is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from memscope.capture.backends.base import Categorizer
from memscope.capture.ownership import run_long_buffers
from memscope.events.schema import (
    CAT_ACTIVATIONS,
    CAT_GRADIENTS,
    CAT_OPTIMIZER_STATE,
    CAT_OTHER,
    CAT_PARAMETERS,
    PHASE_OPTIMIZER,
)


class CategoryPolicy:
    """Applies the category rules to a backend's :class:`Categorizer` (or does nothing)."""

    def __init__(
        self, categorizer: Categorizer | None, grad_attributes: Sequence[str] = ("grad",)
    ) -> None:
        self._cat = categorizer
        self._grad_attributes = tuple(grad_attributes)
        self._chunks: list[torch.nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._saved_hooks: Any = None  # the pushed saved_tensors_hooks, while pushed

    @property
    def active(self) -> bool:
        """Whether the backend classifies memory at all."""
        return self._cat is not None

    # -- model and optimizer state ---------------------------------------------------------
    def set_model(self, chunks: Iterable[torch.nn.Module]) -> None:
        """Parameters and buffers as ``parameters``; existing gradients as ``gradients``."""
        self._chunks = list(chunks)
        if self._cat is None:
            return
        for chunk in self._chunks:
            for p in chunk.parameters():
                self._cat.mark(p, CAT_PARAMETERS)
            for b in chunk.buffers():
                self._cat.mark(b, CAT_PARAMETERS)
        self.refresh_gradients()

    def set_optimizers(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """The torch optimizers whose state counts as ``optimizer_state``."""
        self._optimizers = list(optimizers)
        self.refresh_optimizer_state()

    def refresh_gradients(self) -> None:
        """Re-mark every parameter's gradient tensors (they may be new since the last call)."""
        if self._cat is None:
            return
        for chunk in self._chunks:
            for p in chunk.parameters():
                for attr in self._grad_attributes:
                    g = getattr(p, attr, None)
                    if isinstance(g, torch.Tensor):
                        self._cat.mark(g, CAT_GRADIENTS)

    def refresh_optimizer_state(self) -> None:
        """Re-mark optimizer state tensors and master copies of parameters."""
        if self._cat is None or not self._optimizers:
            return
        model_params = {id(p) for c in self._chunks for p in c.parameters()}
        for opt in self._optimizers:
            for state in opt.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        self._cat.mark(value, CAT_OPTIMIZER_STATE)
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in model_params:  # fp32 master copies
                        self._cat.mark(p, CAT_OPTIMIZER_STATE)

    def adopt_untracked(self) -> None:
        """Whatever was allocated before tracing started and is not model state: ``other``
        (run-long buffers: ``buffers``)."""
        if self._cat is not None:
            self.refresh_run_long()
            self._cat.adopt_existing(CAT_OTHER)

    def refresh_run_long(self) -> None:
        """Mark the run-long buffers that exist now (new or grown since the last call)."""
        if self._cat is None:
            return
        for owner, tensor in run_long_buffers():
            self._cat.mark_run_long(tensor, owner)

    # -- the training loop -----------------------------------------------------------------
    def step_started(self) -> None:
        """New storages of the forward-backward passes are activations."""
        if self._cat is not None:
            self.refresh_gradients()
            self._cat.set_alloc_category(CAT_ACTIVATIONS)
            self._push_saved_hooks()

    def _push_saved_hooks(self) -> None:
        """Tell the backend which storages autograd saves; the hooks hand the same storage
        back, so backward computes with the same values and memory is freed as before."""
        if self._saved_hooks is not None:
            return
        cat = self._cat
        assert cat is not None

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            cat.mark_saved(tensor)
            # a detached alias: the same storage and version counter, but no reference back
            # to the graph (returning the tensor itself would make a saved output keep its
            # own grad_fn alive in a cycle, freed only by the garbage collector)
            return tensor.detach()

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, _unpack)
        hooks.__enter__()
        self._saved_hooks = hooks

    def pop_saved_hooks(self) -> None:
        """Take the hooks off (end of the forward-backward phase, or tracing stops)."""
        hooks, self._saved_hooks = self._saved_hooks, None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    def module_entered(self) -> None:
        """A module forward (or its recomputation) allocates activations."""
        if self._cat is not None:
            self._cat.set_alloc_category(CAT_ACTIVATIONS)

    def gradient_accumulated(self, grad: torch.Tensor | None) -> None:
        """A parameter's gradient was just accumulated."""
        if self._cat is not None and grad is not None:
            self._cat.mark(grad, CAT_GRADIENTS)

    def phase_ended(self, phase: str, next_phase: str) -> None:
        """Close ``phase``: the optimizer step's surviving storages become its state."""
        if self._cat is None:
            return
        self.pop_saved_hooks()
        self.refresh_run_long()
        if phase == PHASE_OPTIMIZER:
            self.refresh_optimizer_state()
            self._cat.promote_window(CAT_OPTIMIZER_STATE)
        else:
            self.refresh_gradients()
        self._cat.set_alloc_category(CAT_OTHER)
        if next_phase == PHASE_OPTIMIZER:
            self._cat.open_window()


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
