"""The snapshot reader is bounded (docs/guarantees.md, "Bad input"): a FIFO or a device is
refused before a byte is read, a tiny pickle that asks for gigabytes is refused before the
unpickler allocates, and any broken pickle, real or fuzzed, is one ``ValueError`` (one line and
exit code 2 through the CLI), never a hang, a ``MemoryError`` or a traceback."""

from __future__ import annotations

import collections
import os
import pickle
import struct
from datetime import timedelta

import pytest
from conftest import PUBLIC_SNAPSHOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memscope.cli import main
from memscope.io.snapshot_reader import read_snapshot

# Each asks the C unpickler for about a TiB (or 4 G memo slots) in a dozen bytes.
HOSTILE = {
    "memo index": b"\x80\x04]r" + struct.pack("<I", 0xFFFFFFF0) + b".",
    "bytes8 length": b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"ab.",
    "frame length": b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"}.",
    "unicode8 length": b"\x80\x04\x8d" + struct.pack("<Q", 1 << 40) + b"a.",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_tiny_pickle_that_asks_for_gigabytes_is_refused_in_one_line(tmp_path, capsys, name):
    path = tmp_path / "memory_snapshot.pickle"
    path.write_bytes(HOSTILE[name])
    assert len(HOSTILE[name]) < 16
    with pytest.raises(ValueError, match="not a readable allocator snapshot"):
        read_snapshot(str(path))
    assert main(["analyze-snapshot", "--snapshot", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_fifo_and_a_device_are_refused_before_reading(tmp_path):
    fifo = tmp_path / "snapshot.pickle"
    os.mkfifo(fifo)  # no writer: reading it would block forever
    with pytest.raises(ValueError, match="is a FIFO"):
        read_snapshot(str(fifo))
    with pytest.raises(ValueError, match="is a character device"):
        read_snapshot("/dev/zero")


def test_a_class_in_the_pickle_is_refused_not_run(tmp_path):
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "x": collections.OrderedDict()}))
    with pytest.raises(ValueError, match="refusing"):
        read_snapshot(str(path))


FUZZ = settings(
    max_examples=40,
    deadline=timedelta(seconds=20),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def real_snapshot() -> bytes:
    """A real CUDA allocator snapshot (a public one, tests/data/README.md)."""
    path = PUBLIC_SNAPSHOT
    with open(path, "rb") as f:
        data = f.read()
    assert read_snapshot(path)["segments"]
    return data


@FUZZ
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=2**31), min_size=1, max_size=4),
    junk=st.binary(max_size=12),
)
def test_mutated_real_snapshots_are_read_or_refused_in_one_error(
    tmp_path, real_snapshot, cuts, junk
):
    data = bytearray(real_snapshot)
    for cut in cuts:  # overwrite a few places with junk, truncate at the last one
        at = cut % len(data)
        data[at : at + len(junk)] = junk
    data = data[: (cuts[-1] % len(data)) + len(junk)] if cuts[-1] % 3 == 0 else data
    path = tmp_path / "fuzzed.pickle"
    path.write_bytes(bytes(data))
    try:
        snapshot = read_snapshot(str(path))
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(snapshot, dict) and "segments" in snapshot
