"""What the Kafka ingress's librdkafka fetcher does with what ``consume`` gives it, without a
broker (tests/integration/test_kafka_librdkafka.py fetches from a real one): errors among the
records are dropped and reported with one rate-limited line, the records keep their order, and
a poll waits only for the first record."""

from __future__ import annotations

import logging
from typing import Any

import confluent_kafka
import pytest

from statefun._kafka import _throttle
from statefun._kafka._throttle import Throttle
from statefun.ingress import _kafka_librdkafka
from statefun.ingress._kafka_librdkafka import Fetcher

ERROR = confluent_kafka.KafkaError(confluent_kafka.KafkaError._TRANSPORT)


def message(offset: int, error: Any = None) -> Any:
    return confluent_kafka.Message(
        topic="in", partition=2, offset=offset, key=b"k", value=b"v%d" % offset, error=error
    )


class Consumer:
    """``consume`` and ``poll`` as librdkafka's consumer answers them, from a script."""

    def __init__(self, batches: list[list[Any]]) -> None:
        self.batches = batches
        self.polls: list[float] = []

    def consume(self, count: int, timeout: float) -> list[Any]:
        assert timeout == 0  # (what is there: never waiting to fill a batch)
        batch = self.batches.pop(0) if self.batches else []
        assert len(batch) <= count
        return batch

    def poll(self, timeout: float) -> Any:
        self.polls.append(timeout)
        batch = self.batches.pop(0) if self.batches else []
        return batch[0] if batch else None


def fetcher(batches: list[list[Any]]) -> Fetcher:
    made = Fetcher.__new__(Fetcher)
    made.ingress_id = "in"
    made._consumer = Consumer(batches)
    made._assigned = [("in", 2)]
    made._errors = Throttle()
    return made


def test_errors_are_dropped_with_one_line_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(_throttle.time, "monotonic", lambda: now[0])
    batches = [[message(0), message(-1, ERROR), message(1)], [message(-1, ERROR), message(2)]]
    source = fetcher(batches)
    with caplog.at_level(logging.WARNING, logger=_kafka_librdkafka.__name__):
        assert [m.offset() for m in source.poll(10, 0.1)] == [0, 1]
        now[0] += 1.0  # within the interval: counted, not logged
        assert [m.offset() for m in source.poll(10, 0.1)] == [2]
        lines = [r.getMessage() for r in caplog.records]
        assert lines == [
            "ingress in: fetching in/2 failed (1 failure(s) since the last line): " + str(ERROR)
        ]
        now[0] += 10.0
        source._consumer.batches = [[message(-1, ERROR)]]
        assert source.poll(10, 0.1) == []
    assert len(caplog.records) == 2
    assert "(2 failure(s) since the last line)" in caplog.records[1].getMessage()


def test_a_poll_waits_for_the_first_record_then_takes_what_came_with_it() -> None:
    first, rest = message(0), [message(1), message(2)]
    # consume finds nothing; poll waits for the first; consume takes what is there
    source = fetcher([[], [first], rest])
    assert [m.offset() for m in source.poll(10, 0.5)] == [0, 1, 2]
    assert source._consumer.polls == [0.5]
    assert fetcher([[], []]).poll(10, 0.5) == []  # nothing within the timeout
