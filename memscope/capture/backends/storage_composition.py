"""Where the storage ledger's bytes came from: creation contexts and the live composition.

:class:`CreationContexts` interns what each storage remembers about its birth (the phase,
module, microbatch and chunk running, the Python frames that asked for it, the shape and
dtype of the tensor that made it), so a ledger entry keeps three small integers.
:class:`LiveComposition` keeps the live bytes per (category, creation context, saved by
autograd) and their copy at the window's peak; :func:`group_survivors` groups storages that
outlived their step. All of it is plain bookkeeping: the ledger calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memscope.capture.python_stack import Frame, format_frame
from memscope.events.schema import (
    CAT_ACTIVATIONS,
    CATEGORIES,
    CompositionItem,
    Survivor,
    module_label,
)

#: Composition items kept per peak: the largest, and one remainder per category beyond them.
COMPOSITION_ITEMS = 64
#: Groups of long-lived storages reported per step (see :func:`group_survivors`).
SURVIVOR_ITEMS = 32
#: The context of storages created outside every traced region.
NO_CONTEXT: tuple[Any, ...] = ("", "", None, None)  # phase, module, microbatch, chunk

# (category, creation context, saved by autograd) -> live bytes
CompositionKey = tuple[int, int, bool]


def _intern(table: dict[Any, int], values: list[Any], value: Any) -> int:
    """``value``'s index in ``values`` (``table`` maps each to its index), added if new."""
    found = table.get(value)
    if found is None:
        found = table[value] = len(values)
        values.append(value)
    return found


class CreationContexts:
    """Interned creation contexts, Python stacks and tensor descriptions (index 0: none)."""

    def __init__(self) -> None:
        self._context_ids: dict[tuple[Any, ...], int] = {NO_CONTEXT: 0}
        #: (phase, module, microbatch, chunk) by index
        self.contexts: list[tuple[Any, ...]] = [NO_CONTEXT]
        self._stack_ids: dict[tuple[Frame, ...], int] = {(): 0}
        #: Python frames, innermost first, by index
        self.stacks: list[tuple[Frame, ...]] = [()]
        self._desc_ids: dict[tuple[Any, Any], int] = {(None, None): 0}
        #: (shape, dtype) by index
        self.descs: list[tuple[Any, Any]] = [(None, None)]

    def context_id(self, key: tuple[Any, ...]) -> int:
        return _intern(self._context_ids, self.contexts, key)

    def stack_id(self, frames: tuple[Frame, ...]) -> int:
        return _intern(self._stack_ids, self.stacks, frames)

    def desc_id(self, shape: Any, dtype: Any) -> int:
        return _intern(self._desc_ids, self.descs, (shape, dtype))

    def snapshot_frames(self, context: int, stack: int = 0) -> list[dict[str, Any]]:
        """An allocator-snapshot frame list: one frame naming the phase, module, microbatch
        and chunk, then the recorded Python frames."""
        phase, module, microbatch, chunk = self.contexts[context]
        where = " ".join(
            str(x)
            for x in (
                phase or "setup",
                module_label(module),
                None if microbatch is None else f"microbatch {microbatch}",
                None if chunk is None else f"chunk {chunk}",
            )
            if x is not None
        )
        own = [{"filename": f, "line": n, "name": fn} for f, n, fn in self.stacks[stack]]
        return [{"filename": "memscope", "line": 0, "name": where}, *own]


class LiveComposition:
    """Live bytes per (category, creation context, saved) and their copy at the peak.

    The copy is taken lazily: a new peak only marks it stale (:meth:`peak_reached`), and the
    live set is copied at the first change that is not growth (:meth:`keep_peak`), or when
    the peak's composition is asked for.
    """

    def __init__(self, contexts: CreationContexts) -> None:
        self._contexts = contexts
        self.live: dict[CompositionKey, int] = {}
        self._at_peak: dict[CompositionKey, int] = {}
        self._stale = False
        #: What was live when the capacity limit failed an allocation.
        self.at_failure: tuple[CompositionItem, ...] | None = None

    def count(self, category: int, context: int, nbytes: int, saved: bool = False) -> None:
        key = (category, context, saved)
        left = self.live.get(key, 0) + nbytes
        if left:
            self.live[key] = left
        else:
            self.live.pop(key, None)

    def peak_reached(self) -> None:
        """The live set is now the window's peak."""
        self._stale = True

    def keep_peak(self) -> None:
        """Before the live set changes other than by growing: copy it if it is the peak's."""
        if self._stale:
            self._at_peak = dict(self.live)
            self._stale = False

    def keep_failure(self) -> None:
        """An allocation is about to fail: keep what is live before anything unwinds."""
        self.at_failure = self.items(self.live)

    def peak_items(self) -> tuple[CompositionItem, ...]:
        self.keep_peak()
        return self.items(self._at_peak)

    def items(self, composition: dict[CompositionKey, int]) -> tuple[CompositionItem, ...]:
        """By category x creation context, largest first: the :data:`COMPOSITION_ITEMS`
        largest, then one remainder per category (module ``"(rest)"``)."""
        live = sorted(composition.items(), key=lambda kv: -kv[1])
        contexts = self._contexts.contexts
        items = []
        for (category, context, saved), nbytes in live[:COMPOSITION_ITEMS]:
            phase, module, microbatch, chunk = contexts[context]
            kept = saved if category == CAT_ACTIVATIONS else None
            items.append(
                CompositionItem(
                    CATEGORIES[category], phase, module, microbatch, chunk, nbytes, kept
                )
            )
        rest: dict[int, int] = {}
        for (category, _, _), nbytes in live[COMPOSITION_ITEMS:]:
            rest[category] = rest.get(category, 0) + nbytes
        for category, nbytes in sorted(rest.items(), key=lambda kv: -kv[1]):
            items.append(CompositionItem(CATEGORIES[category], "", "(rest)", None, None, nbytes))
        return tuple(items)


def group_survivors(
    rows: Iterable[tuple[int, int, int, int, int]], contexts: CreationContexts
) -> tuple[Survivor, ...]:
    """Storages given as ``(context, born, nbytes, stack, desc)`` rows, grouped by creation
    context and step: the :data:`SURVIVOR_ITEMS` largest groups, each with the stack and
    shape of its largest storage."""
    # (context, born) -> [bytes, count, largest storage's bytes, its stack, its shape]
    groups: dict[tuple[int, int], list[int]] = {}
    for context, born, nbytes, stack, desc in rows:
        found = groups.setdefault((context, born), [0, 0, -1, 0, 0])
        found[0] += nbytes
        found[1] += 1
        if nbytes > found[2]:
            found[2], found[3], found[4] = nbytes, stack, desc
    largest = sorted(groups.items(), key=lambda kv: -kv[1][0])[:SURVIVOR_ITEMS]
    out = []
    for (context, born), (nbytes, count, _, stack, desc) in largest:
        phase, module, microbatch, chunk = contexts.contexts[context]
        frames = tuple(format_frame(f) for f in contexts.stacks[stack])
        shape, dtype = contexts.descs[desc]
        out.append(
            Survivor(
                phase, module, microbatch, chunk, born, nbytes, count, frames,
                None if shape is None else tuple(shape),
                "" if dtype is None else str(dtype).removeprefix("torch."),
            )
        )  # fmt: skip
    return tuple(out)
