"""Module-forward, output-grad and parameter-grad hooks over Megatron model chunks.

Hooks are thin: they look up a precomputed label and call the tracer, inside a try/except
so a failure can never reach the model. Output-grad hooks are registered on each forward's
fresh output tensors (they die with the autograd graph), never on parameters, so nothing
piles up across steps. Parameter hooks are registered once per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.hooks import RemovableHandle

from memscope.events.schema import ROOT_MODULE


@dataclass(frozen=True, slots=True)
class ModuleLabel:
    """How one hooked module is named in events."""

    name: str
    module_class: str
    chunk: int
    is_root: bool


class HookSink(Protocol):
    """What the hooks call; implemented by :class:`memscope.capture.tracer.MemoryTracer`."""

    def module_enter(
        self, label: ModuleLabel, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None: ...

    def module_exit(self, label: ModuleLabel, output: Any) -> list[torch.Tensor]: ...

    def output_grad(
        self, label: ModuleLabel, microbatch: int | None, grad: torch.Tensor
    ) -> None: ...

    def param_grad_ready(self, name: str, grad: torch.Tensor) -> None: ...

    def param_grad_accumulated(self, name: str, param: torch.Tensor) -> None: ...

    def hook_failed(self, family: str, exc: BaseException) -> None: ...

    def family_enabled(self, family: str) -> bool: ...


def module_path(chunk_index: int, name: str, chunks: int) -> str:
    """How events name the module at ``name`` (``""``: the root) in one of ``chunks`` chunks:
    prefixed with its chunk (``chunk1.``) when there are several (virtual pipeline)."""
    full = name or ROOT_MODULE
    return f"chunk{chunk_index}.{full}" if chunks > 1 else full


def unwrap_module(module: torch.nn.Module) -> torch.nn.Module:
    """Strip DDP / Float16Module / FSDP-style wrappers (anything exposing ``.module``)."""
    seen = 0
    while hasattr(module, "module") and isinstance(module.module, torch.nn.Module) and seen < 8:
        module = module.module
        seen += 1
    return module


class HookSet:
    """Registers and removes every hook MemScope adds to a list of model chunks."""

    def __init__(self, sink: HookSink) -> None:
        self._sink = sink
        self.handles: list[RemovableHandle] = []
        self.labels: list[ModuleLabel] = []
        self.param_names: dict[int, str] = {}

    def attach_modules(self, chunks: list[torch.nn.Module]) -> None:
        for chunk_index, chunk in enumerate(chunks):
            for name, module in chunk.named_modules():
                full = module_path(chunk_index, name, len(chunks))
                label = ModuleLabel(full, type(module).__name__, chunk_index, name == "")
                self.labels.append(label)
                self.handles.append(
                    module.register_forward_pre_hook(self._pre_hook(label), with_kwargs=True)
                )
                self.handles.append(
                    module.register_forward_hook(
                        self._post_hook(label), with_kwargs=True, always_call=True
                    )
                )

    def attach_params(self, chunks: list[torch.nn.Module]) -> None:
        multi = len(chunks) > 1
        for chunk_index, chunk in enumerate(chunks):
            for name, param in chunk.named_parameters():
                if id(param) in self.param_names or not param.requires_grad:
                    continue  # tied/shared parameters are hooked once
                full = f"chunk{chunk_index}.{name}" if multi else name
                self.param_names[id(param)] = full
                self.handles.append(param.register_hook(self._param_pre_hook(full)))
                self.handles.append(
                    param.register_post_accumulate_grad_hook(self._param_post_hook(full))
                )

    def remove(self) -> int:
        """Remove every handle this set added; returns how many were removed."""
        removed = 0
        for handle in self.handles:
            handle.remove()
            removed += 1
        self.handles.clear()
        return removed

    # -- hook factories --------------------------------------------------------------------
    # Every hook body runs inside two nets (see :func:`_guarded`), so nothing ever reaches the
    # model, not even a failure of the safety net itself.
    def _pre_hook(self, label: ModuleLabel):  # type: ignore[no-untyped-def]
        sink = self._sink

        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            _guarded(sink, "module_hooks", sink.module_enter, label, args, kwargs)

        return hook

    def _post_hook(self, label: ModuleLabel):  # type: ignore[no-untyped-def]
        sink = self._sink

        def hook(
            module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> None:
            wanting_grads = _guarded(sink, "module_hooks", sink.module_exit, label, output)
            if wanting_grads:
                mb = getattr(sink, "current_microbatch", None)
                _guarded(sink, "output_grad_hooks", self._watch_grads, wanting_grads, label, mb)

        return hook

    def _watch_grads(
        self, tensors: list[torch.Tensor], label: ModuleLabel, microbatch: int | None
    ) -> None:
        for tensor in tensors:
            tensor.register_hook(self._output_grad_hook(label, microbatch))

    def _output_grad_hook(self, label: ModuleLabel, microbatch: int | None):  # type: ignore[no-untyped-def]
        sink = self._sink

        def hook(grad: torch.Tensor) -> None:
            _guarded(sink, "output_grad_hooks", sink.output_grad, label, microbatch, grad)

        return hook

    def _param_pre_hook(self, name: str):  # type: ignore[no-untyped-def]
        sink = self._sink

        def hook(grad: torch.Tensor) -> None:
            _guarded(sink, "param_grad_hooks", sink.param_grad_ready, name, grad)

        return hook

    def _param_post_hook(self, name: str):  # type: ignore[no-untyped-def]
        sink = self._sink

        def hook(param: torch.Tensor) -> None:
            _guarded(sink, "param_grad_hooks", sink.param_grad_accumulated, name, param)

        return hook


def _guarded(sink: HookSink, family: str, call: Any, *args: Any) -> Any:
    """``call(*args)`` if ``family`` is on; a failure is reported to the sink (which turns the
    family off), and a failure of that reporting itself is swallowed. Never raises."""
    try:
        if not sink.family_enabled(family):
            return None
        try:
            return call(*args)
        except Exception as exc:
            sink.hook_failed(family, exc)
    except Exception:
        pass
    return None
