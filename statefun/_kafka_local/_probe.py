"""Whether a Kafka broker answers at host:port: one Metadata request in the plain Kafka
protocol over a socket.

kafka-python is a dependency, yet this probe speaks the protocol itself (ApiVersions, then
Metadata for no topics, about 60 lines): it fails at once when nothing listens (one refused
connect, where a kafka-python client retries until its own timeouts and logs each attempt),
starts no client threads, and ``statefun kafka status`` and the broker's start-up wait run
it many times a second.
"""

from __future__ import annotations

import socket
import struct

from statefun._kafka_local._jars import KafkaBrokerError

__all__ = ["probe", "probe_metadata"]


def probe(host: str, port: int, timeout: float = 5.0) -> int:
    """The number of brokers the Kafka broker at host:port reports in a metadata answer.

    Raises OSError when nothing listens there, KafkaBrokerError when it does not answer as a
    Kafka broker."""
    return probe_metadata(host, port, timeout)


def probe_metadata(host: str, port: int, timeout: float) -> int:
    """The number of brokers a Metadata request to host:port reports.

    Plain Kafka protocol over a socket (stdlib only, so it works without any client library):
    ApiVersions v0 to learn the versions the broker speaks, then Metadata at the highest
    non-flexible version (1..8) it supports, for no topics. Raises OSError or
    KafkaBrokerError when the broker does not answer properly.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        body = _request(sock, api_key=18, api_version=0, correlation_id=1, body=b"")
        error, count = struct.unpack_from(">hi", body, 0)
        if error != 0:
            raise KafkaBrokerError(f"ApiVersions failed with error code {error}")
        versions = {}
        for index in range(count):
            key, low, high = struct.unpack_from(">hhh", body, 6 + 6 * index)
            versions[key] = (low, high)
        if 3 not in versions:
            raise KafkaBrokerError("the broker does not offer the Metadata API")
        low, high = versions[3]
        version = min(high, 8)
        if version < max(low, 1):
            return 1  # the broker answers, in versions this probe does not parse
        request = struct.pack(">i", 0)  # topics: an empty array
        if version >= 4:
            request += b"\x00"  # allow_auto_topic_creation
        if version >= 8:
            request += b"\x00\x00"  # include cluster / topic authorized operations
        body = _request(sock, api_key=3, api_version=version, correlation_id=2, body=request)
        offset = 4 if version >= 3 else 0  # throttle_time_ms
        (brokers,) = struct.unpack_from(">i", body, offset)
        return int(brokers)


def _request(
    sock: socket.socket, *, api_key: int, api_version: int, correlation_id: int, body: bytes
) -> bytes:
    client_id = b"pystatefun-probe"
    header = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id))
    payload = header + client_id + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", _receive(sock, 4))
    response = _receive(sock, size)
    (answered,) = struct.unpack_from(">i", response, 0)
    if answered != correlation_id:
        raise KafkaBrokerError(f"answer to request {answered}, expected {correlation_id}")
    return response[4:]


def _receive(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks += chunk
    return bytes(chunks)
