"""Counters the runtime keeps as it works, read by ``/metrics`` and ``/status`` when asked.

Plain ``int`` fields on small objects with ``__slots__``: the hot path adds to them (tens of
nanoseconds) and nothing else happens until a scrape reads them (``_metrics.py``), instead of
a call into a metrics library per message. Histograms are fixed buckets of counts, kept the
same way; one is turned into Prometheus's cumulative form only when read.

* ``FunctionStats``: per function type, on its ``EmbeddedFunction``/``RemoteFunction``.
* ``EndpointStats``: per remote endpoint (the origin of its URL), in ``RemoteClient``.
* ``IngressStats``: per ingress, in the ``IngressPort`` each source is given.
* ``LoopLag``: how late the event loop runs a timer.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Sequence

__all__ = [
    "BATCH_BUCKETS",
    "LATENCY_BUCKETS",
    "EndpointStats",
    "FunctionStats",
    "Histogram",
    "IngressStats",
    "LoopLag",
]

#: seconds: from 100 microseconds (an embedded call) to a minute (a remote call's timeout)
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: messages per batch
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    """Observations counted per bucket (``counts[i]``: values <= ``bounds[i]``, above the
    previous bound; the last count is above every bound), with their sum."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus's buckets: (upper bound as text, observations at or below it)."""
        total = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, self.counts, strict=False):
            total += count
            buckets.append((_bound_text(bound), total))
        buckets.append(("+Inf", self.count))
        return buckets

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile (None: no observations;
        the largest bound when it lies above all of them)."""
        if not self.count:
            return None
        rank = q * self.count
        total = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            total += count
            if total >= rank:
                return bound
        return self.bounds[-1]


def _bound_text(bound: float) -> str:
    return repr(float(bound))


class FunctionStats:
    """What one function type did.

    ``invocations``: messages it handled (one invocation per message, as StateFun counts; a
    remote batch of n is n); ``messages_in``: messages handed to it (handled or failed:
    counted as either, no third count on the hot path); ``messages_out``: messages it sent to
    functions, delayed ones included; ``batches``: remote (and asynchronous embedded)
    batches, their sizes in ``batch_sizes``; ``latency``: seconds per batch, and for
    synchronous embedded functions one invocation in ``EMBEDDED_SAMPLE`` (timing each would
    cost the hot path more than the call itself). Written only by the dispatchers that run
    the function, read when asked for; the job's total of invocations is their sum. The
    longest mailbox is kept by the dispatchers (``Dispatcher.mailbox_max``).
    """

    __slots__ = (
        "batch_sizes",
        "batches",
        "failures_retryable",
        "failures_terminal",
        "invocations",
        "latency",
        "messages_out",
    )

    #: synchronous embedded invocations: one in this many is timed (a power of two)
    EMBEDDED_SAMPLE = 16

    def __init__(self) -> None:
        self.invocations = 0
        self.messages_out = 0
        self.failures_retryable = 0
        self.failures_terminal = 0
        self.batches = 0
        self.batch_sizes = Histogram(BATCH_BUCKETS)
        self.latency = Histogram(LATENCY_BUCKETS)

    @property
    def failures(self) -> int:
        return self.failures_retryable + self.failures_terminal

    @property
    def messages_in(self) -> int:
        """Messages handed to the function: those it handled and those that failed."""
        return self.invocations + self.failures


class EndpointStats:
    """Calls to one remote endpoint: ``calls`` started, ``errors`` (calls that failed for
    good), ``retries`` (attempts that failed and were tried again), ``latency`` of the calls
    that succeeded (seconds, retries included), ``in_flight`` (calls under way)."""

    __slots__ = ("calls", "errors", "in_flight", "latency", "retries")

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.retries = 0
        self.in_flight = 0
        self.latency = Histogram(LATENCY_BUCKETS)


class IngressStats:
    """Records one ingress handed to the runtime, and the seconds it waited for room
    (backpressure)."""

    __slots__ = ("blocked_seconds", "records")

    def __init__(self) -> None:
        self.records = 0
        self.blocked_seconds = 0.0


#: seconds late the event loop ran a timer
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag:
    """How late the event loop wakes a task that sleeps ``interval`` at a time: a busy loop
    (a long step, a long GC pause) shows as lag. Four wake-ups a second cost nothing."""

    __slots__ = ("histogram", "interval", "last")

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.last = 0.0
        self.histogram = Histogram(LAG_BUCKETS)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.last = lag = max(0.0, loop.time() - due)
            self.histogram.observe(lag)
