"""Ports for the servers that tests and benchmarks start: from a parallel worker's own block,
below the kernel's ephemeral range, free when handed out, each in turn."""

from __future__ import annotations

import socket

import pytest

from statefun._testing import ports


def test_each_worker_has_a_block_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        port = ports.free_port()
        assert ports._block_start() <= port < ports._block_start() + ports._BLOCK
        seen[worker] = ports._block_start()
    assert len(set(seen.values())) == 3
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert ports._block_start() == seen["gw0"]
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ephemeral:
        low = int(ephemeral.read().split()[0])
    assert low >= ports._FIRST + ports._BLOCKS * ports._BLOCK


def test_consecutive_ports_are_free_and_not_handed_out_twice_in_a_row() -> None:
    first = ports.free_ports(3)
    for offset in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", first + offset))
    second = ports.free_ports(3)
    assert second not in (first, first + 1, first + 2)


def test_a_port_in_use_is_passed_over() -> None:
    ports.free_port()  # (sets the turn)
    assert ports._turn is not None
    taken = ports._block_start() + ports._turn
    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        assert ports.free_port() != taken
