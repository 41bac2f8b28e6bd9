"""kafka-python's log lines as the runtime leaves them: a socket that another thread closed
while the network thread read it is one line, not a traceback; other errors keep theirs."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from statefun._kafka import import_kafka

import_kafka()  # (installs the filters)
TRANSPORT = logging.getLogger("kafka.net.transport")


def read_from(sock: Any) -> None:
    try:
        sock.recv(4096)
    except BaseException:
        TRANSPORT.exception("%s: Error receiving network data closing socket", "<transport>")


def test_a_socket_closed_meanwhile_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="kafka.net.transport"):
        read_from(None)
    (record,) = caplog.records
    assert record.exc_info is None and "Traceback" not in caplog.text
    assert record.getMessage() == (
        "<transport>: Error receiving network data closing socket (its socket was closed "
        "meanwhile: 'NoneType' object has no attribute 'recv')"
    )


def test_other_errors_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def recv(self, size: int) -> bytes:
            raise OSError("reset by peer")

    with caplog.at_level(logging.ERROR, logger="kafka.net.transport"):
        read_from(Broken())
    (record,) = caplog.records
    assert record.exc_info is not None and "Traceback" in caplog.text
