"""Delayed messages: a timer service keyed by absolute wall-clock deadlines.

A message sent with ``send_after`` is due at ``now + delay`` (wall clock, as StateFun's
processing time), so after a restart overdue messages fire at once, in deadline order. A
cancellation token is scoped to the address that sent the message, as in StateFun; cancelling
a token removes every pending message that address sent with it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Iterator

from statefun.runtime._envelope import Envelope
from statefun.state.base import AddressKey

__all__ = ["DelayedEntry", "TimerService"]


class DelayedEntry:
    __slots__ = ("cancelled", "deadline_ms", "envelope", "sender", "seq", "token")

    def __init__(
        self, deadline_ms: int, seq: int, envelope: Envelope, sender: AddressKey, token: str
    ) -> None:
        self.deadline_ms = deadline_ms
        self.seq = seq
        self.envelope = envelope
        self.sender = sender
        self.token = token
        self.cancelled = False

    def __lt__(self, other: DelayedEntry) -> bool:
        return (self.deadline_ms, self.seq) < (other.deadline_ms, other.seq)


def now_ms() -> int:
    return int(time.time() * 1000)


class TimerService:
    """Holds delayed messages and hands each one to ``fire`` when it is due."""

    def __init__(self, fire: Callable[[Envelope], None], clock: Callable[[], int] = now_ms) -> None:
        self._fire = fire
        self._clock = clock
        self._heap: list[DelayedEntry] = []
        self._by_token: dict[tuple[AddressKey, str], list[DelayedEntry]] = {}
        self._seq = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_for: int | None = None
        self._live = 0
        self._running = False

    def __len__(self) -> int:
        return self._live

    def start(self) -> None:
        self._running = True
        self._arm()

    def stop(self) -> None:
        self._running = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._armed_for = None

    def schedule(self, delay_ms: int, envelope: Envelope, sender: AddressKey, token: str) -> None:
        self.add(self._clock() + max(0, delay_ms), envelope, sender, token)

    def add(self, deadline_ms: int, envelope: Envelope, sender: AddressKey, token: str) -> None:
        entry = DelayedEntry(deadline_ms, next(self._seq), envelope, sender, token)
        heapq.heappush(self._heap, entry)
        self._live += 1
        if token:
            self._by_token.setdefault((sender, token), []).append(entry)
        if self._armed_for is None or deadline_ms < self._armed_for:
            self._arm()

    def cancel(self, sender: AddressKey, token: str) -> int:
        """Cancel the pending messages ``sender`` sent with ``token``; how many were pending."""
        entries = self._by_token.pop((sender, token), ())
        for entry in entries:
            entry.cancelled = True
        self._live -= len(entries)
        return len(entries)

    def pending(self) -> Iterator[DelayedEntry]:
        """Every pending (not cancelled) entry, in deadline order."""
        return iter(sorted(e for e in self._heap if not e.cancelled))

    def _arm(self) -> None:
        if not self._running:
            return
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._armed_for = None
        if not self._heap:
            return
        deadline = self._heap[0].deadline_ms
        loop = asyncio.get_running_loop()
        delay = max(0.0, (deadline - self._clock()) / 1000.0)
        self._handle = loop.call_later(delay, self._fire_due)
        self._armed_for = deadline

    def _fire_due(self) -> None:
        self._handle = None
        self._armed_for = None
        now = self._clock()
        heap = self._heap
        while heap and (heap[0].cancelled or heap[0].deadline_ms <= now):
            entry = heapq.heappop(heap)
            if entry.cancelled:
                continue
            self._live -= 1
            if entry.token:
                self._forget_token(entry)
            self._fire(entry.envelope)
        self._arm()

    def _forget_token(self, entry: DelayedEntry) -> None:
        key = (entry.sender, entry.token)
        entries = self._by_token.get(key)
        if entries is not None:
            entries[:] = [e for e in entries if e is not entry]
            if not entries:
                del self._by_token[key]
