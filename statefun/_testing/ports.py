"""Free TCP ports on 127.0.0.1 for tests and benchmarks that give a server a port of their choice.

A port that ``bind(("127.0.0.1", 0))`` reports free comes from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the range every outgoing
connection on the machine also takes its local port from: between the moment a test learns
that the port is free and the moment its server binds it, a connection of another test running
at the same time (a parallel run, ``pytest -n N``) may take it. The ports here come from below
that range, where the kernel hands out none by itself, and each worker of a parallel run
(``PYTEST_XDIST_WORKER=gwN``, inherited by the processes it starts) has a block of its own.
Within a block, ports are handed out in turn from a random start, each checked free.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading

__all__ = ["free_port", "free_ports"]

_FIRST = 20_000
_BLOCK = 2_000
#: blocks of workers gw0..gw5 (more workers share them): 20000-31999
_BLOCKS = 6

_lock = threading.Lock()
_turn: int | None = None


def _block_start() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return _FIRST + (index % _BLOCKS) * _BLOCK


def _all_free(port: int, count: int) -> bool:
    try:
        with contextlib.ExitStack() as stack:
            for offset in range(count):
                sock = stack.enter_context(socket.socket())
                sock.bind(("127.0.0.1", port + offset))
    except OSError:
        return False
    return True


def free_ports(count: int) -> int:
    """A port P such that P .. P + ``count`` - 1 were all free on 127.0.0.1 a moment ago."""
    global _turn
    start = _block_start()
    with _lock:
        if _turn is None:
            _turn = random.randrange(_BLOCK)
        for _ in range(_BLOCK):
            offset, _turn = _turn, (_turn + count) % _BLOCK
            if offset + count <= _BLOCK and _all_free(start + offset, count):
                return start + offset
    raise RuntimeError(f"no {count} consecutive free port(s) in {start}-{start + _BLOCK - 1}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)
