"""A CUDA allocator snapshot labelled for pytorch.org/memory_viz (plain data in and out).

Each ``alloc`` event and each block allocated at snapshot time gets ``category`` (MemScope's:
parameters, main_params, gradients, optimizer_state, buffers, activations, other), which the
viewer's Active Memory Timeline colours by, and a first stack frame naming the owner or the
phase, module, microbatch, chunk and step of the allocation, which it shows on hover.

Two of the viewer's own rules shape the file (``torch/utils/viz/MemoryViz.js``):

* when any event has a category, ``annotate_snapshot`` appends ``'unknown'`` to a misspelt
  list unless some event already has it, which stops the page; free events, which the
  viewer never colours, carry ``'unknown'`` so that it does;
* frames whose name contains ``_start`` (or a few interpreter names) are hidden, so the
  label frame writes ``_start`` as `` start``.

The result is pickled with protocol 4, the newest the viewer's unpickler reads.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Protocol

from memscope.events.schema import FREE_CATEGORY

LABEL_FILENAME = "memscope"
FREE_ACTIONS = frozenset({"free_requested", "free_completed", "free"})


class Label(Protocol):
    """A category and a one-line description of where an allocation was made."""

    @property
    def category(self) -> str: ...

    @property
    def where(self) -> str: ...


def label_frame(label: Label) -> dict[str, Any]:
    """The stack frame that carries a label (file ``memscope``, line 0)."""
    name = f"{label.category} · {label.where}" if label.where else label.category
    return {"filename": LABEL_FILENAME, "line": 0, "name": name.replace("_start", " start")}


def memory_viz_snapshot(
    snapshot: Mapping[str, Any],
    device: int,
    event_labels: Mapping[int, Label],
    block_labels: Mapping[int, Label],
) -> dict[str, Any]:
    """A labelled deep copy of ``snapshot`` (``device``'s events and blocks labelled)."""
    out = copy.deepcopy(dict(snapshot))
    traces = out.get("device_traces") or []
    trace = traces[device] if device < len(traces) and traces[device] else []
    for i, event in enumerate(trace):
        label = event_labels.get(i)
        if label is not None:
            event["category"] = label.category
            event["frames"] = [label_frame(label), *_own_frames(event)]
        elif event.get("action") in FREE_ACTIONS:
            event["category"] = FREE_CATEGORY
    for segment in out.get("segments") or []:
        if int(segment.get("device", 0)) != device:
            continue
        for block in segment.get("blocks") or []:
            label = block_labels.get(int(block.get("address", -1)))
            if block.get("state") == "active_allocated" and label is not None:
                block["category"] = label.category
                block["frames"] = [label_frame(label), *_own_frames(block)]
                block.setdefault("requested_size", block.get("size", 0))
    return out


def _own_frames(entry: Mapping[str, Any]) -> list[Any]:
    frames = entry.get("frames") or []
    return [
        f for f in frames if not (isinstance(f, Mapping) and f.get("filename") == LABEL_FILENAME)
    ]
