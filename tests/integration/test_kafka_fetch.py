"""The ingress's lean reader of fetched batches (statefun.ingress._kafka_fetch) on the real
broker: a consumer with it reads the same ConsumerRecords, and ends at the same positions, as
kafka-python's own reader - through compressed batches, transactions committed and aborted
(read_committed and read_uncommitted), headers and nulls, and polls that stop mid-batch; the
ingress uses it when kafka-python fetches (``pystatefun.fetch.client: kafka-python``), and
without it (another kafka-python) still reads, saying why it is slower."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

from statefun._kafka import import_kafka
from statefun.ingress import _kafka_fetch
from statefun.ingress._kafka_fetch import LeanPartitionRecords
from tests.integration.test_kafka_io import (
    Collector,
    admin,  # noqa: F401 (a fixture)
    collect,
    create_topic,
    kafka_source,
    string,
)

kafka = import_kafka()
KafkaConsumer, KafkaProducer, TopicPartition = (
    kafka.KafkaConsumer,
    kafka.KafkaProducer,
    kafka.TopicPartition,
)
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]


def fill(bootstrap: str, topic: str) -> int:
    """Records of every kind the reader meets, over two partitions; how many were sent
    (aborted ones included)."""
    rng = random.Random(11)
    sent = 0

    def records(count: int) -> list[tuple[Any, Any, list[tuple[str, bytes | None]]]]:
        out = []
        for i in range(count):
            key = None if i % 7 == 0 else rng.randbytes(rng.choice([1, 8, 70, 300]))
            value = (
                None
                if i % 9 == 1 and key is not None
                else rng.randbytes(rng.choice([0, 10, 100, 5000]))
            )
            headers = [("h", b"%d" % i), ("empty", b"")] if i % 4 == 0 else []
            out.append((key, value, headers))
        return out

    for compression in (None, "gzip"):
        producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=compression)
        for key, value, headers in records(150):
            producer.send(topic, key=key, value=value, headers=headers, partition=sent % 2)
            sent += 1
        producer.flush()
        producer.close()
    for txn, commit in enumerate((True, False, True)):
        producer = KafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=f"{topic}-tx{txn}", linger_ms=5
        )
        producer.init_transactions()
        producer.begin_transaction()
        for key, value, headers in records(80):
            producer.send(topic, key=key, value=value, headers=headers, partition=sent % 2)
            sent += 1
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
        producer.close()
    return sent


def read(bootstrap: str, topic: str, isolation_level: str, lean: bool) -> tuple[list[Any], Any]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        max_poll_records=7,  # polls stop inside batches
        fetch_max_bytes=20_000,  # fetches end inside the log
    )
    try:
        if lean:
            assert _kafka_fetch.install(consumer) is None
            assert consumer._fetcher.PartitionRecords is LeanPartitionRecords
        partitions = [TopicPartition(topic, p) for p in (0, 1)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        got: list[Any] = []
        for _ in range(2000):
            if all(consumer.position(p) >= ends[p] for p in partitions):
                break
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
        positions = {p.partition: consumer.position(p) for p in partitions}
        return got, positions
    finally:
        consumer.close()


def filled_and_read(
    bootstrap: str,
    admin: Any,  # noqa: F811 (the fixture's client)
    prefix: str,
    isolation_level: str,
) -> tuple[str, int, list[Any], dict[int, int]]:
    """A two-partition topic that :func:`fill` filled, how many records it sent, and what
    kafka-python's own reader reads of it (records, positions)."""
    topic = create_topic(admin, prefix, partitions=2)
    sent = fill(bootstrap, topic)
    theirs, positions = read(bootstrap, topic, isolation_level, lean=False)
    return topic, sent, theirs, positions


def assert_same_records(
    ours: list[Any], theirs: list[Any], sent: int, isolation_level: str
) -> None:
    """Each partition's records alike, and all of :func:`fill`'s that the level lets through."""
    for partition in (0, 1):  # (fetches interleave the partitions as they come)
        assert [r for r in ours if r.partition == partition] == [
            r for r in theirs if r.partition == partition
        ]
    assert len(ours) == (sent - 80 if isolation_level == "read_committed" else sent)


@pytest.mark.parametrize("isolation_level", ["read_committed", "read_uncommitted"])
def test_the_same_records_as_kafka_pythons_reader(
    bootstrap: str,
    admin: Any,  # noqa: F811 (a fixture)
    isolation_level: str,
) -> None:
    topic, sent, theirs, their_positions = filled_and_read(
        bootstrap, admin, "lean-fetch", isolation_level
    )
    ours, our_positions = read(bootstrap, topic, isolation_level, lean=True)
    assert_same_records(ours, theirs, sent, isolation_level)
    assert our_positions == their_positions
    assert {r.partition for r in ours} == {0, 1}
    assert any(r.headers for r in ours) and any(r.value is None for r in ours)


async def test_the_ingress_reads_with_it_and_without_it(
    bootstrap: str,
    admin: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = create_topic(admin, "lean-ingress")
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(30):
        producer.send(topic, key=b"k%d" % (i % 3), value=string(f"v{i}"))
    producer.flush()
    producer.close()
    expected = [("kafka-test/counter", f"k{i % 3}", string(f"v{i}")) for i in range(30)]

    by_kafka_python = {"pystatefun.fetch.client": "kafka-python"}  # (else librdkafka fetches)
    source = kafka_source(bootstrap, topic, startup_position="earliest", properties=by_kafka_python)
    assert await collect(source, Collector(), 30) == expected
    assert source._consumer._fetcher.PartitionRecords is LeanPartitionRecords
    await source.close()

    monkeypatch.setattr(kafka, "__version__", "3.9.0")
    with caplog.at_level(logging.WARNING, logger="statefun.ingress.kafka"):
        source = kafka_source(
            bootstrap, topic, startup_position="earliest", properties=by_kafka_python
        )
        assert await collect(source, Collector(), 30) == expected
    assert source._consumer._fetcher.PartitionRecords is not LeanPartitionRecords
    await source.close()
    assert any("kafka-python's own reader" in r.getMessage() for r in caplog.records)
    assert any("3.9.0" in r.getMessage() for r in caplog.records)
