"""The rendezvous ports the launcher picks (``memscope/demo/launcher.py``): distinct, free, and
outside the kernel's ephemeral range, which other processes' connections draw from in the
seconds between choosing a port and listening on it (a clean-clone CI run lost a test to
``EADDRINUSE`` that way while its second pytest run was connecting beside it)."""

from __future__ import annotations

import socket

from memscope.demo import launcher


def test_ports_are_distinct_free_and_below_the_ephemeral_range():
    ports = launcher.free_ports(8)
    assert len(set(ports)) == 8
    low, high = launcher.PORTS_BELOW_EPHEMERAL
    assert all(low <= p < min(high, launcher._ephemeral_low()) for p in ports)
    for port in ports:  # each can be listened on now
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_two_choosers_do_not_draw_the_same_sequence():
    # (a seeded global ``random`` would give two CI runs the same ports)
    assert launcher.free_ports(4) != launcher.free_ports(4)


def test_a_port_in_use_is_never_given(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(launcher, "PORTS_BELOW_EPHEMERAL", (taken, taken + 1))
        monkeypatch.setattr(launcher, "_ephemeral_low", lambda: taken + 1)
        (port,) = launcher.free_ports(1)
    assert port != taken  # the kernel's choice when nothing below the range is free
