"""``Throttle``: one line per interval about errors that repeat, counting the ones it held
back, and the ``none`` Kafka egress telling records dropped that were held back even when no
new failure comes (a stand-in for librdkafka's sender, beside the real-broker test in
tests/integration/test_kafka_librdkafka_send.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from statefun._kafka import _throttle
from statefun._kafka._throttle import Throttle
from statefun.egress._kafka_producers import Producers


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [1000.0]
    monkeypatch.setattr(_throttle, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    return clock


def test_the_first_at_once_then_one_count_per_interval(now: list[float]) -> None:
    throttle = Throttle(10.0)
    assert throttle.count() == 1
    now[0] += 1
    assert throttle.count() == 0
    assert throttle.count(3) == 0
    now[0] += 10
    assert throttle.count() == 5  # the four held back and this one


def test_asking_with_nothing_counted_never_holds_the_next_line_back(now: list[float]) -> None:
    throttle = Throttle(10.0)
    assert throttle.count() == 1
    now[0] += 1
    assert throttle.count(2) == 0
    assert throttle.count(0) == 0  # held back, not due yet
    now[0] += 10
    assert throttle.count(0) == 2  # due: told without a new event
    now[0] += 20
    assert throttle.count(0) == 0  # nothing to tell: the clock stays
    assert throttle.count() == 1  # so the next event is told at once


_ERROR = SimpleNamespace(str=lambda: "broker down")  # (librdkafka's KafkaError: its str())


class _Sender:
    """What ``Producers`` calls of librdkafka's sender: failures handed out once."""

    def __init__(self) -> None:
        self.failed: list[tuple[Any, int]] = []

    def send(self, rows: list[Any]) -> None:
        pass

    def failures(self) -> list[tuple[Any, int]]:
        failed, self.failed = self.failed, []
        return failed


def test_records_dropped_and_held_back_are_told_without_a_new_failure(
    now: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    producers = Producers(
        "e/out", "127.0.0.1:1", "e-tx", {}, {}, {"group_id": "g"}, lambda *_: None, {"x": 1}
    )
    sender = producers.sender = _Sender()  # type: ignore[assignment]
    row = ("t", None, b"v", None)
    with caplog.at_level(logging.ERROR, logger="statefun.egress.kafka"):
        sender.failed = [(_ERROR, 2)]
        producers.produce([row], wait=False)
        now[0] += 1
        sender.failed = [(_ERROR, 3)]
        producers.produce([row], wait=False)  # held back
        now[0] += 10
        producers.produce([row], wait=False)  # no new failure: the three are due
    assert [r.getMessage() for r in caplog.records] == [
        "egress e/out: 2 record(s) dropped (semantic none) since the last line: broker down",
        "egress e/out: 3 record(s) dropped (semantic none) since the last line: broker down",
    ]
