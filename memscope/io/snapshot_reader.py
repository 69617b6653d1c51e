"""Reading a CUDA allocator snapshot and MemScope's side files, without torch.

A snapshot (``torch.cuda.memory._dump_snapshot``) is a pickle of plain dicts, lists, strings
and numbers. It is read with an unpickler that refuses every class (no code from the file is
ever run), so a file that is not such a snapshot is an error, not an execution. Beside it a
MemScope run writes the training-context markers (``*.markers.jsonl``) and the ownership
ranges (``*.owners.json``) of that rank.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
from dataclasses import dataclass, field
from typing import Any

from memscope.events.bounded_input import InputRefused, read_regular
from memscope.events.ownership import OwnedRange, OwnershipIndex
from memscope.events.schema import ContextMarker

MARKERS_SUFFIX = ".markers.jsonl"
OWNERS_SUFFIX = ".owners.json"
#: Largest snapshot read (the ring is bounded by ``max_entries``; this bounds a wrong file).
MAX_SNAPSHOT_BYTES = 4 << 30


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: not a plain-data snapshot")


#: Up to this size a pickle's opcodes are checked before unpickling (about 3 s per 10 MiB).
PRESCAN_BYTES = 64 << 20
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_UNPICKLE_ERRORS = (
    pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
    AttributeError, OverflowError, RecursionError, MemoryError, UnicodeDecodeError,
)  # fmt: skip


def _prescan(data: bytes) -> None:
    """Refuse a pickle whose opcodes ask for more than the file holds: a memo index beyond
    the number of opcodes read so far, or a frame longer than what is left. The C
    unpickler of Python before the fix of CPython issue 115952 allocates such sizes up
    front, so a 12-byte file could ask for gigabytes."""
    for count, (opcode, arg, pos) in enumerate(pickletools.genops(data)):
        if opcode.name in _MEMO_PUTS and isinstance(arg, int) and arg > count:
            raise ValueError(f"memo index {arg} at byte {pos} is beyond what the file holds")
        if opcode.name == "FRAME" and isinstance(arg, int) and arg > len(data) - (pos or 0):
            raise ValueError(f"a frame of {arg} bytes at byte {pos} is longer than the file")


def read_snapshot(path: str) -> dict[str, Any]:
    """The snapshot dict of ``path``; ``ValueError`` saying what is wrong with the file.

    Only a regular file is read (a FIFO or a device is refused before a byte is read), of at
    most :data:`MAX_SNAPSHOT_BYTES`; a pickle up to :data:`PRESCAN_BYTES` has its opcodes
    checked first; nothing in the file runs code, and any failure to unpickle (a truncated
    file, an exhausted memory) is one ``ValueError``."""
    try:
        data = read_regular(path, MAX_SNAPSHOT_BYTES)
    except InputRefused as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        if len(data) <= PRESCAN_BYTES:
            _prescan(data)
        snapshot = _PlainUnpickler(io.BytesIO(data)).load()
    except _UNPICKLE_ERRORS as exc:
        reason = f"{type(exc).__name__}" + (f": {exc}" if str(exc) else "")
        raise ValueError(f"{path}: not a readable allocator snapshot ({reason})") from None
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        raise ValueError(f"{path}: not an allocator snapshot (no 'segments')")
    if not isinstance(snapshot.get("device_traces", []), list):
        raise ValueError(f"{path}: malformed snapshot (device_traces is not a list)")
    return snapshot


def read_markers(path: str) -> list[ContextMarker]:
    """Context markers, one JSON object per line."""
    out: list[ContextMarker] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(ContextMarker.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: line {n}: not a context marker ({exc})") from None
    return out


def read_owners(path: str) -> OwnershipIndex:
    """Ownership ranges written beside a snapshot (``{"ranges": [...]}``)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return OwnershipIndex(OwnedRange.from_dict(r) for r in data["ranges"])
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not an ownership file ({exc})") from None


def side_files(snapshot_path: str) -> tuple[str, str]:
    """Where a run writes a snapshot's ownership ranges and context markers."""
    stem = os.path.splitext(snapshot_path)[0]
    return stem + OWNERS_SUFFIX, stem + MARKERS_SUFFIX


@dataclass
class SnapshotBundle:
    """A snapshot with the side files found for it (``None``: not given and not present)."""

    snapshot: dict[str, Any]
    owners: OwnershipIndex | None = None
    markers: list[ContextMarker] = field(default_factory=list)


def read_snapshot_bundle(
    path: str, owners_path: str | None, markers_path: str | None
) -> SnapshotBundle:
    """The snapshot and the side files named (each ``None`` is skipped); ``ValueError`` as
    in the readers above."""
    return SnapshotBundle(
        read_snapshot(path),
        read_owners(owners_path) if owners_path else None,
        read_markers(markers_path) if markers_path else [],
    )
