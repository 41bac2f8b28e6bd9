"""One kind of log line at most once per interval, counting what it stands for (errors that
repeat: Kafka fetch failures, a broker out of reach, records dropped, bad records of the
cluster's topics)."""

from __future__ import annotations

import time

__all__ = ["Throttle"]


class Throttle:
    """Counts events; :meth:`count` says when a line about them may be logged - at most once
    per ``interval_s``, the first at once - and how many events it stands for."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last = float("-inf")
        self._count = 0

    def count(self, events: int = 1) -> int:
        """Add ``events``; the count to log now (counting starts again), or 0: not yet, or
        nothing to log (``count(0)`` asks only whether events held back are due)."""
        self._count += events
        if not self._count:
            return 0
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return 0
        self._last = now
        counted, self._count = self._count, 0
        return counted
