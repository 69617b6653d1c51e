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
from dataclasses import dataclass, field
from typing import Any

from memscope.events.ownership import OwnedRange, OwnershipIndex
from memscope.events.schema import ContextMarker

MARKERS_SUFFIX = ".markers.jsonl"
OWNERS_SUFFIX = ".owners.json"
#: Largest snapshot read (the ring is bounded by ``max_entries``; this bounds a wrong file).
MAX_SNAPSHOT_BYTES = 4 << 30


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: not a plain-data snapshot")


def read_snapshot(path: str) -> dict[str, Any]:
    """The snapshot dict of ``path``; ``ValueError`` saying what is wrong with the file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise ValueError(f"{path}: larger than {MAX_SNAPSHOT_BYTES >> 30} GiB; not read")
    try:
        snapshot = _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not a readable allocator snapshot ({exc})") from None
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
