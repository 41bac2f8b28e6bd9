"""The side by side's function server with no runtime in front: the ceiling of a hot key.

With one hot key an address has one batch in flight, so a runtime's records/s is the batch
size over the cycle from one request to the next, and most of each cycle is the function
server's own work (parsing 1,000 invocations, running the counter on each, writing 1,000
egress records). :func:`drive` measures that part alone: one client on a kept-alive
connection sends the hot key's batch (the counter's state and ``batch`` invocations with the
benchmark's record values) to the same ``statefun serve`` process and sends it again as soon
as the whole reply is read, without decoding it. No runtime turns a hot-key batch around
faster on the same machine, so the records/s found here bound every runtime's in the
hot-key backlog phase, and the bound over one runtime's records/s is the most that any other
runtime could show against it there.
"""

from __future__ import annotations

import http.client
import time
from dataclasses import dataclass

from bench._common import cpu_seconds
from statefun.runtime._envelope import Envelope
from statefun.runtime._remote import decode_from_function, encode_to_function
from statefun.sdk import IntType, TypedValue

__all__ = ["Alone", "drive", "hot_key_request"]

COUNTER = "bench/counter"
STAMP_TYPE = "bench/stamp"


@dataclass
class Alone:
    """What :func:`drive` measured."""

    records: int
    wall_s: float
    server_cpu_s: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.wall_s if self.wall_s else 0.0


def hot_key_request(batch: int, topic: str = "bench-alone", count: int = 1) -> bytes:
    """A ToFunction for the hot key: its ``count`` state and ``batch`` invocations whose values
    are the benchmark's (``b"<output topic> <produce time, ns>"``, typed bench/stamp)."""
    now = time.time_ns()
    envelopes = [
        Envelope(COUNTER, "hot", TypedValue(STAMP_TYPE, b"%s %d" % (topic.encode(), now + i)), None)
        for i in range(batch)
    ]
    state = TypedValue(IntType.typename, IntType.serializer().serialize(count))
    return encode_to_function(COUNTER, "hot", [("count", IntType.typename, state)], envelopes)


def drive(port: int, server_pid: int, records: int, batch: int = 1000) -> Alone:
    """Send ``records`` invocations to the function server on ``port``, ``batch`` per request,
    one request at a time; the first reply is checked to hold one egress record per
    invocation (ValueError if not)."""
    batch = max(1, min(batch, records))
    body = hot_key_request(batch)
    headers = {"Content-Type": "application/octet-stream"}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/statefun", body, headers)
        first = connection.getresponse()
        reply = first.read()
        if first.status != 200:
            raise ValueError(f"the function server answered {first.status}: {reply[:200]!r}")
        result = decode_from_function(reply, COUNTER).invocation_result
        if len(result.outgoing_egresses) != batch:
            raise ValueError(
                f"the function server wrote {len(result.outgoing_egresses)} egress records "
                f"for {batch} invocations"
            )
        requests = max(1, records // batch)
        cpu_before = cpu_seconds(server_pid)
        started = time.perf_counter()
        for _ in range(requests):
            connection.request("POST", "/statefun", body, headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise ValueError(f"the function server answered {response.status}")
        wall = time.perf_counter() - started
        return Alone(requests * batch, wall, cpu_seconds(server_pid) - cpu_before)
    finally:
        connection.close()
