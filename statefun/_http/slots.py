"""Who holds the connection slots of one HTTP server, and who gives one up at a cap.

``Slots`` counts the open connections, in all and per client address, and keeps per client
the connections waiting for a request head (or idle), oldest first. ``admit`` makes room for
a newcomer at a cap by picking a waiting connection to close (the server closes it):

* at the per-client cap, the client's own connection that has waited longest goes, if it
  has waited at least ``min_wait`` (a burst is refused, not churned);
* at the cap in all, the client holding the most connections pays: its longest-waiting one
  goes (however long it waited) if that client holds at least two more than the newcomer's,
  so a few addresses that took every slot do not lock out the others; if the newcomer's
  client is the busiest, its own longest-waiting one goes (after ``min_wait``).

Everything is O(1) except finding the busiest client at the cap in all: one pass over the
clients (at most as many as connections).
"""

from __future__ import annotations

import math
from typing import Generic, Protocol, TypeVar

__all__ = ["Slots", "Slotted"]


class Slotted(Protocol):
    """What ``Slots`` needs of a connection."""

    client: str  # the peer's address
    wait_since: float  # when it was last listed as waiting (``-inf``: not listed)

    def waits_for_head(self) -> bool:
        """Whether it is waiting for a request head (or idle) and not closing."""
        ...


C = TypeVar("C", bound=Slotted)


class Slots(Generic[C]):
    def __init__(self, max_total: int, max_per_client: int, min_wait: float) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.min_wait = min_wait
        self.connections: set[C] = set()
        self._per_client: dict[str, int] = {}
        # A connection stays listed while it reads a request (``pick`` skips it then), and
        # its place may be stale by the little time its owner lets pass between updates.
        self._waiting: dict[str, dict[C, float]] = {}

    def __len__(self) -> int:
        return len(self.connections)

    def admit(self, connection: C, now: float) -> list[C] | None:
        """Count ``connection`` in, listed as waiting since ``now``: the connections to close
        to make room for it (already counted out), or None if there is no room."""
        client = connection.client
        victims: list[C] = []
        if self._per_client.get(client, 0) >= self.max_per_client:
            victim = self._take(client, now, patient=True)
            if victim is None:
                return None
            victims.append(victim)
        if len(self.connections) >= self.max_total:
            mine = self._per_client.get(client, 0)
            busiest = max(self._per_client.items(), key=lambda item: item[1])[0]
            own = busiest == client or self._per_client[busiest] < mine + 2
            victim = self._take(client if own else busiest, now, patient=own)
            if victim is None:
                return None
            victims.append(victim)
        self.connections.add(connection)
        self._per_client[client] = self._per_client.get(client, 0) + 1
        connection.wait_since = now
        self.waiting(connection, now)
        return victims

    def _take(self, client: str, now: float, *, patient: bool) -> C | None:
        """Count out ``client``'s longest-waiting connection (if ``patient``, only if it has
        waited ``min_wait``) and return it; None if there is none."""
        waiting = self._waiting.get(client)
        while True:
            if not waiting:
                return None
            victim, since = next(iter(waiting.items()))
            if victim.waits_for_head():
                break
            self.not_waiting(victim)  # reading a request: listed again when it waits again
        if patient and now - since < self.min_wait:
            return None
        self.forget(victim)
        return victim

    def forget(self, connection: C) -> None:
        """The connection is closed (or closing): count it out. Idempotent."""
        if connection not in self.connections:
            return
        self.connections.discard(connection)
        self.not_waiting(connection)
        client = connection.client
        left = self._per_client.get(client, 1) - 1
        if left:
            self._per_client[client] = left
        else:
            self._per_client.pop(client, None)

    def waiting(self, connection: C, now: float) -> None:
        """The connection waits for a request head since ``now`` (listed last: the newest)."""
        if connection not in self.connections:
            return
        mine = self._waiting.get(connection.client)
        if mine is None:
            mine = self._waiting[connection.client] = {}
        else:
            mine.pop(connection, None)
        mine[connection] = now

    def not_waiting(self, connection: C) -> None:
        connection.wait_since = -math.inf  # listed again as soon as it waits again
        mine = self._waiting.get(connection.client)
        if mine is not None and mine.pop(connection, None) is not None and not mine:
            del self._waiting[connection.client]
