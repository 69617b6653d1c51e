"""Owned address ranges: who holds which bytes of device memory (torch-free data model).

Built on a rank by :class:`memscope.capture.ownership.OwnershipRegistry` from the live model
and optimizer; read by offline analyses (an allocator timeline's blocks are split by it).
Ranges are either disjoint tensors of their own (*leaves*) or *containers* holding leaves
(a DDP buffer and its parameters' views): an address belongs to the narrowest range.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


class OwnerCategory(str, enum.Enum):
    """What an owned range is."""

    PARAMETERS = "parameters"
    MAIN_PARAMS = "main_params"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    BUFFERS = "buffers"  # module buffers, Megatron's global memory buffer


@dataclass(frozen=True, slots=True)
class OwnedRange:
    """Bytes ``[start, end)`` of device memory and who holds them."""

    start: int
    end: int
    owner: str
    category: OwnerCategory
    container: bool = False

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "owner": self.owner,
            "category": self.category.value,
            "container": self.container,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OwnedRange:
        return cls(
            int(d["start"]),
            int(d["end"]),
            str(d["owner"]),
            OwnerCategory(d["category"]),
            bool(d.get("container", False)),
        )


class OwnershipIndex:
    """Lookup over owned ranges: the owner of an address, the split of a block."""

    def __init__(self, ranges: Iterable[OwnedRange] = ()) -> None:
        leaves: dict[tuple[int, int], OwnedRange] = {}
        containers: list[OwnedRange] = []
        for r in ranges:
            if r.container:
                containers.append(r)
            else:
                leaves.setdefault((r.start, r.end), r)  # the first owner of a range keeps it
        kept: list[OwnedRange] = []
        for leaf in sorted(leaves.values(), key=lambda r: (r.start, -r.nbytes)):
            if kept and leaf.start < kept[-1].end:
                continue  # overlaps a leaf already owned (a view of it): the first one keeps it
            kept.append(leaf)
        self._leaves = kept
        self._starts = [r.start for r in self._leaves]
        self._containers = sorted(containers, key=lambda c: c.nbytes)

    @property
    def ranges(self) -> tuple[OwnedRange, ...]:
        """Every range: the leaves, then the containers."""
        return (*self._leaves, *self._containers)

    def owner_at(self, address: int) -> OwnedRange | None:
        """The narrowest range holding ``address``, if any."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and self._leaves[i].start <= address < self._leaves[i].end:
            return self._leaves[i]
        for container in self._containers:  # smallest first
            if container.start <= address < container.end:
                return container
        return None

    def attribute(self, start: int, size: int) -> list[tuple[OwnedRange | None, int]]:
        """Split ``[start, start + size)`` into (owning range or None, bytes): the leaves in
        it, then what containers hold beyond their leaves, then the unowned rest."""
        end = start + size
        out: list[tuple[OwnedRange | None, int]] = []
        covered: list[tuple[int, int]] = []
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        while i < len(self._leaves) and self._leaves[i].start < end:
            leaf = self._leaves[i]
            lo, hi = max(leaf.start, start), min(leaf.end, end)
            if hi > lo:
                out.append((leaf, hi - lo))
                covered.append((lo, hi))
            i += 1
        for container in self._containers:
            lo, hi = max(container.start, start), min(container.end, end)
            if hi <= lo:
                continue
            free = (hi - lo) - sum(max(0, min(b, hi) - max(a, lo)) for a, b in covered)
            if free > 0:
                out.append((container, free))
            covered.append((lo, hi))
        owned = sum(n for _, n in out)
        if size > owned:
            out.append((None, size - owned))
        return out

    def totals(self) -> dict[str, int]:
        """Owned bytes per category (containers count only beyond their leaves)."""
        out = {c.value: 0 for c in OwnerCategory}
        for leaf in self._leaves:
            out[leaf.category.value] += leaf.nbytes
        for container in self._containers:
            for owner, n in self.attribute(container.start, container.nbytes):
                if owner is container:
                    out[container.category.value] += n
        return out
