"""Reads back what a real W&B run in offline mode wrote (test-only).

An offline run keeps its records in ``wandb/offline-run-*/run-*.wandb``: W&B's 7-byte file
header (``:W&B``, magic 0xBEE1, version), then LevelDB's log format (32 KiB blocks; each
chunk a 7-byte header: CRC-32, little-endian length, type FULL=1 / FIRST=2 / MIDDLE=3 /
LAST=4; a block tail shorter than a header is padding), each record a serialized
``wandb.proto.wandb_internal_pb2.Record``. wandb 0.31 no longer ships a Python reader (its
core is Go), so this one reads the format as wandb's own writer lays it out.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import time
from typing import Any

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(data: bytes) -> list[bytes]:
    ident, magic, version = struct.unpack("<4sHB", data[:_HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a .wandb file"
    out: list[bytes] = []
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # padding at the block's end
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:  # zero-filled rest of the last block
            break
        body = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            out.append(body)
        elif kind == _FIRST:
            pending = body
        elif kind == _MIDDLE:
            pending += body
        elif kind == _LAST:
            out.append(pending + body)
            pending = b""
    return out


def offline_history(
    wandb_dir: str, expect_exit: bool = True, wait_s: float = 30.0
) -> list[dict[str, Any]]:
    """Every history row the offline run under ``wandb_dir`` (its ``dir=``) committed, in
    order, as {key: value} (the row's ``_step`` included).

    wandb's core writes the file from its own process: on a busy machine the records can
    reach the disk after ``run.finish()`` returned. With ``expect_exit`` the file is read
    again (for at most ``wait_s``) until the run's exit record is in it."""
    deadline = time.monotonic() + wait_s
    while True:
        rows, exited = _read_history(wandb_dir)
        if exited or not expect_exit or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _read_history(wandb_dir: str) -> tuple[list[dict[str, Any]], bool]:
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    with open(path, "rb") as f:
        data = f.read()
    rows, exited = [], False
    for raw in _records(data):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        exited = exited or kind == "exit"
        if kind == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows, exited
