"""The connection slots of an HTTP server: who gives one up at a cap (``_http/slots.py``)."""

from __future__ import annotations

import math

from statefun._http.slots import Slots


class Conn:
    def __init__(self, client: str) -> None:
        self.client = client
        self.wait_since = -math.inf
        self.reading = False  # reading a request: not waiting for a head

    def waits_for_head(self) -> bool:
        return not self.reading


def test_under_the_caps_everyone_gets_in() -> None:
    slots: Slots[Conn] = Slots(4, 4, 1.0)
    assert all(slots.admit(Conn("a"), 0.0) == [] for _ in range(4))
    assert len(slots) == 4


def test_per_client_cap_takes_the_clients_own_longest_waiting_after_a_moment() -> None:
    slots: Slots[Conn] = Slots(100, 2, 1.0)
    first, second = Conn("a"), Conn("a")
    slots.admit(first, 0.0)
    slots.admit(second, 0.1)
    assert slots.admit(Conn("a"), 0.5) is None  # a burst: refused
    assert slots.admit(Conn("b"), 0.5) == []  # another client is not affected
    third = Conn("a")
    assert slots.admit(third, 1.5) == [first]
    assert first not in slots.connections and third in slots.connections


def test_a_connection_reading_a_request_is_skipped_and_relisted_later() -> None:
    slots: Slots[Conn] = Slots(100, 2, 1.0)
    first, second = Conn("a"), Conn("a")
    slots.admit(first, 0.0)
    slots.admit(second, 0.1)
    first.reading = True
    assert slots.admit(Conn("a"), 5.0) == [second]
    first.reading = False
    assert first.wait_since == -math.inf  # its owner lists it again when it waits again
    slots.waiting(first, 5.1)
    assert slots.admit(Conn("a"), 7.0) is not None


def test_at_the_cap_in_all_the_busiest_client_pays_at_once() -> None:
    slots: Slots[Conn] = Slots(4, 10, 1.0)
    crowd = [Conn("a") for _ in range(3)] + [Conn("b")]
    for n, conn in enumerate(crowd):
        slots.admit(conn, n * 0.01)
    assert slots.admit(Conn("c"), 0.1) == [crowd[0]]  # "a" holds 3, "c" none
    # "a" (2) and "b" (1) differ by one: "b" must wait its own turn
    assert slots.admit(Conn("b"), 0.2) is None
    # the busiest client itself: its own longest-waiting, after a moment
    assert slots.admit(Conn("a"), 0.3) is None
    assert slots.admit(Conn("a"), 2.0) == [crowd[1]]


def test_forget_is_idempotent() -> None:
    slots: Slots[Conn] = Slots(4, 4, 1.0)
    conn = Conn("a")
    slots.admit(conn, 0.0)
    slots.forget(conn)
    slots.forget(conn)
    assert len(slots) == 0
    assert slots.admit(Conn("a"), 0.0) == []
