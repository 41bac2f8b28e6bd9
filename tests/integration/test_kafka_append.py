"""Bulk appends to kafka-python's producer (statefun.egress._kafka_append) on the real broker
(the egress's exactly-once producers, and its plain one with ``pystatefun.produce.client:
kafka-python``): the same partitions and order as ``send``, one outcome per batch, batches the
broker splits or refuses, and the egress's fallback to ``send``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from statefun._kafka import import_kafka
from statefun.egress import _kafka_append
from statefun.egress._kafka_append import (
    BatchTooLarge,
    BulkAppender,
    Row,
    bulk_supported,
    flush,
    send_each,
)
from statefun.egress._kafka_librdkafka import PRODUCE_CLIENT
from statefun.egress._kafka_partitioner import KeyPartitioner
from statefun.egress.kafka import KafkaSink
from tests.integration.test_kafka_io import (
    EGRESS,
    by_partition,
    consume,
    kafka_record,
    unique,
    values,
)

kafka = import_kafka()  # quiets kafka-python's import-time warnings
KafkaAdminClient, KafkaProducer = kafka.KafkaAdminClient, kafka.KafkaProducer
NewTopic, MessageSizeTooLargeError = kafka.admin.NewTopic, kafka.errors.MessageSizeTooLargeError
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]


def topic_with(bootstrap: str, prefix: str, partitions: int = 1, **configs: str) -> str:
    name = unique(prefix)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(
                    name,
                    partitions,
                    1,
                    topic_configs={k.replace("_", "."): v for k, v in configs.items()},
                )
            ]
        )
    finally:
        admin.close()
    return name


@pytest.fixture
def producer(bootstrap: str) -> Iterator[Any]:
    made = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=20,
        batch_size=256 * 1024,
        partitioner=KeyPartitioner(),
    )
    try:
        yield made
    finally:
        made.close(timeout=10)


def appender(producer: Any) -> BulkAppender:
    assert bulk_supported(producer) is None
    return BulkAppender(producer, producer.config["partitioner"])


def test_bulk_appends_place_and_order_records_as_send_does(bootstrap: str, producer: Any) -> None:
    """Keyed records land on send()'s partitions, in order per partition; unkeyed ones
    somewhere; headers kept. Rows of several topics in one list."""
    bulk, each = topic_with(bootstrap, "bulk", 3), topic_with(bootstrap, "each", 3)

    def rows(topic: str) -> list[Row]:
        keyed: list[Row] = [
            (topic, f"k{key}", f"{key}/{n}".encode(), None) for n in range(5) for key in range(20)
        ]
        unkeyed: list[Row] = [(topic, None, f"free/{n}".encode(), None) for n in range(5)]
        headed: list[Row] = [(topic, "h", b"with headers", [("a", b"1"), ("b", b"")])]
        return keyed + unkeyed + headed

    sent = appender(producer).append(rows(bulk))
    reference = send_each(producer, rows(each))
    producer.flush(timeout=30)
    assert sent.failures() == [] and reference.failures() == []
    ours, theirs = by_partition(bootstrap, bulk), by_partition(bootstrap, each)

    def keyed(placed: dict[int, list[tuple[Any, ...]]]) -> dict[int, list[tuple[Any, ...]]]:
        return {p: [r for r in got if r[0] is not None] for p, got in placed.items()}

    assert keyed(ours) == keyed(theirs)
    everything = [r for got in ours.values() for r in got]
    assert len(everything) == 106
    assert sorted(r[1] for r in everything if r[0] is None) == [
        f"free/{n}".encode() for n in range(5)
    ]
    assert (b"h", b"with headers", (("a", b"1"), ("b", b""))) in everything


def test_runs_of_one_key_keep_to_their_topic_and_partition(bootstrap: str, producer: Any) -> None:
    """A row with the topic and key of the row before it goes where that one went (a hot
    key's records): only while both are the same, and never for rows without a key."""

    def rows(first: str, second: str) -> list[Row]:
        out: list[Row] = [(first, "hot", f"a{n}".encode(), None) for n in range(30)]
        out += [(second, "hot", f"b{n}".encode(), None) for n in range(10)]  # other topic
        out += [(first, None, f"free{n}".encode(), None) for n in range(3)]
        out += [(first, "hot", f"c{n}".encode(), None) for n in range(10)]
        out += [(first, "cold", f"d{n}".encode(), None) for n in range(10)]
        return out

    topics = [topic_with(bootstrap, name, 3) for name in ("runs", "runs2", "ref", "ref2")]
    sent = appender(producer).append(rows(topics[0], topics[1]))
    reference = send_each(producer, rows(topics[2], topics[3]))
    producer.flush(timeout=30)
    assert sent.failures() == [] and reference.failures() == []

    def keyed(topic: str) -> dict[int, list[tuple[Any, ...]]]:  # unkeyed ones go anywhere
        placed = by_partition(bootstrap, topic)
        found = {p: [r for r in got if r[0] is not None] for p, got in placed.items()}
        return {p: got for p, got in found.items() if got}

    assert keyed(topics[0]) == keyed(topics[2])
    assert keyed(topics[1]) == keyed(topics[3])
    assert sum(len(got) for got in by_partition(bootstrap, topics[0]).values()) == 53


def test_one_list_to_several_topics(bootstrap: str, producer: Any) -> None:
    first, second = topic_with(bootstrap, "one"), topic_with(bootstrap, "two")
    rows: list[Row] = [(first if n % 2 else second, None, str(n).encode(), None) for n in range(40)]
    sent = appender(producer).append(rows)
    producer.flush(timeout=30)
    assert sent.failures() == []
    assert values(consume(bootstrap, first)) == [str(n) for n in range(1, 40, 2)]
    assert values(consume(bootstrap, second)) == [str(n) for n in range(0, 40, 2)]


async def test_a_batch_the_broker_finds_too_large_fails_at_once_naming_the_setting(
    bootstrap: str,
) -> None:
    """The topic takes batches of at most 4 KiB; the egress's hold up to 256 KiB. kafka-python
    3.0 splits such a batch and never completes it (its producer stays stuck on it): the
    egress's flush fails at once, not after its timeout, names the setting, keeps the records,
    and leaves the stuck producer behind."""
    topic = topic_with(bootstrap, "split", max_message_bytes="4096")
    sink = KafkaSink(
        EGRESS, bootstrap, "at-least-once", properties={PRODUCE_CLIENT: "kafka-python"}
    )
    for n in range(100):
        sink.write(kafka_record(topic, f"{n:04d}" + "x" * 200, key="k"))
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=f"topic {topic} .* batch.size below") as raised:
        await sink.flush()
    assert isinstance(raised.value.__cause__, BatchTooLarge)
    assert time.monotonic() - started < 30
    assert sink.backlog() == 100 and sink._producers.plain is None
    sink._buffer.clear()  # else close() would try them again, with the same outcome
    await sink.close()


def test_a_record_the_broker_refuses_fails_its_batch_and_counts_the_records(
    bootstrap: str, producer: Any
) -> None:
    """One outcome per batch: a record over the topic's max.message.bytes (within the
    producer's max.request.size) fails its batch; kafka-python's idempotent producer takes
    that as fatal and fails what comes after too, three records counted as three."""
    topic = topic_with(bootstrap, "refused", max_message_bytes="2048")
    bulk = appender(producer)
    refused = bulk.append([(topic, "k", b"B" * 5000, None)])
    failures = flush(producer, refused, timeout=60)
    assert [(type(error), count) for error, count in failures] == [(MessageSizeTooLargeError, 1)]
    later = bulk.append([(topic, "k", f"small{n}".encode(), None) for n in range(3)])
    assert sum(count for _, count in flush(producer, later, timeout=60)) == 3
    assert values(consume(bootstrap, topic)) == []


def test_a_record_over_max_request_size_raises_before_anything_is_appended(
    bootstrap: str,
) -> None:
    topic = topic_with(bootstrap, "huge")
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, max_request_size=10_000, partitioner=KeyPartitioner()
    )
    try:
        rows: list[Row] = [(topic, None, b"fine", None), (topic, None, b"x" * 20_000, None)]
        with pytest.raises(MessageSizeTooLargeError, match=f"topic {topic} .* max.request.size"):
            appender(producer).append(rows)
        assert not any(producer._accumulator._batches.values())
    finally:
        producer.close(timeout=10)


def test_other_kafka_python_versions_are_turned_down(producer: Any, monkeypatch: Any) -> None:
    assert bulk_supported(producer) is None
    monkeypatch.setattr(kafka, "__version__", "3.1.0")
    assert "kafka-python 3.1.0" in str(bulk_supported(producer))


@pytest.mark.parametrize("semantic", ["at-least-once", "exactly-once"])
async def test_the_egress_falls_back_to_send(
    semantic: Any, bootstrap: str, monkeypatch: Any, caplog: Any
) -> None:
    """A kafka-python whose internals differ: records go through send(), same results."""
    monkeypatch.setattr(_kafka_append, "bulk_supported", lambda producer: "not this one")
    topic = topic_with(bootstrap, "fallback")
    sink = KafkaSink(
        EGRESS,
        bootstrap,
        semantic,
        properties={"transactional.id": unique("fb"), PRODUCE_CLIENT: "kafka-python"},
    )
    with caplog.at_level(logging.WARNING, logger="statefun.egress.kafka"):
        await sink.start()
        try:
            for n in range(10):
                sink.write(kafka_record(topic, f"v{n}", key=f"k{n % 3}"))
            await sink.flush()
            if semantic == "exactly-once":
                sink.pre_commit(1)
                await sink.commit(1)
        finally:
            await sink.close()
    assert sorted(values(consume(bootstrap, topic))) == [f"v{n}" for n in range(10)]
    assert "one send() at a time (slower): not this one" in caplog.text
