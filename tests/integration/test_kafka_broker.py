"""The test broker is a real Kafka 4.x: kafka-python produces, consumes and runs transactions
against it (what the exactly-once egress builds on)."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from statefun._kafka_local._probe import probe_metadata
from statefun._kafka_local.broker import KafkaBroker

with warnings.catch_warnings():
    # kafka-python 3.0 loads its protocol schemas with importlib.resources.read_text/open_text,
    # which Python 3.11 and 3.12 deprecate; the suite turns warnings into errors.
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic
    from kafka.errors import ProducerFencedError
    from kafka.structs import OffsetAndMetadata

pytestmark = pytest.mark.kafka


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def admin(kafka_broker: KafkaBroker) -> Iterator[Any]:
    client = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def topic(admin: Any) -> str:
    name = unique("test")
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    return name


def consume_all(
    bootstrap: str, topic: str, *, isolation_level: str = "read_committed", timeout: float = 30.0
) -> list[tuple[bytes | None, bytes]]:
    """Every (key, value) of partition 0 up to its end offset as seen by ``isolation_level``
    (for read_committed: the last stable offset, so aborted and open transactions are out)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        end = consumer.end_offsets([partition])[partition]
        records: list[tuple[bytes | None, bytes]] = []
        deadline = time.monotonic() + timeout
        while consumer.position(partition) < end:
            assert time.monotonic() < deadline, f"read {len(records)} records, end offset {end}"
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend((record.key, record.value) for record in batch)
        return records
    finally:
        consumer.close()


def transactional_producer(bootstrap: str, transactional_id: str) -> Any:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=transactional_id,
        enable_idempotence=True,
        acks="all",
        max_block_ms=30_000,
    )
    producer.init_transactions()
    return producer


def test_broker_answers_metadata_on_loopback(kafka_broker: KafkaBroker) -> None:
    host, _, port = kafka_broker.bootstrap_servers.partition(",")[0].rpartition(":")
    assert probe_metadata(host, int(port), timeout=5.0) == 1
    log_file = kafka_broker.log_file
    if log_file is not None:  # started here, not external
        assert host == "127.0.0.1"
        assert kafka_broker.is_running
        assert "Kafka Server started" in log_file.read_text(encoding="utf-8")


def test_produce_100_and_consume_read_committed(kafka_broker: KafkaBroker, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, acks="all")
    try:
        for i in range(100):
            producer.send(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode())
        producer.flush(timeout=30)
    finally:
        producer.close()

    records = consume_all(kafka_broker.bootstrap_servers, topic)

    assert [value for _, value in records] == [f"v{i}".encode() for i in range(100)]
    assert [key for key, _ in records] == [f"k{i % 7}".encode() for i in range(100)]


def test_auto_created_topic(kafka_broker: KafkaBroker) -> None:
    name = unique("auto")
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
    try:
        producer.send(name, b"hello").get(timeout=30)
    finally:
        producer.close()
    assert consume_all(kafka_broker.bootstrap_servers, name) == [(None, b"hello")]


def test_transactions_commit_visible_abort_invisible(kafka_broker: KafkaBroker, topic: str) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    producer = transactional_producer(bootstrap, unique("tx"))
    try:
        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, f"committed-{i}".encode())
        producer.commit_transaction()

        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, f"aborted-{i}".encode())
        producer.flush()  # the aborted records do reach the log
        producer.abort_transaction()

        producer.begin_transaction()
        producer.send(topic, b"after-abort")
        producer.commit_transaction()
    finally:
        producer.close()

    committed = [value for _, value in consume_all(bootstrap, topic)]
    assert committed == [f"committed-{i}".encode() for i in range(10)] + [b"after-abort"]

    everything = [
        value for _, value in consume_all(bootstrap, topic, isolation_level="read_uncommitted")
    ]
    assert everything == (
        [f"committed-{i}".encode() for i in range(10)]
        + [f"aborted-{i}".encode() for i in range(10)]
        + [b"after-abort"]
    )


def test_open_transaction_invisible_until_commit(kafka_broker: KafkaBroker, topic: str) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    producer = transactional_producer(bootstrap, unique("tx"))
    try:
        producer.begin_transaction()
        producer.send(topic, b"pending")
        producer.flush()
        assert consume_all(bootstrap, topic) == []
        producer.commit_transaction()
    finally:
        producer.close()
    assert consume_all(bootstrap, topic) == [(None, b"pending")]


def test_new_producer_fences_zombie(kafka_broker: KafkaBroker, topic: str) -> None:
    """A restarted producer with the same transactional.id aborts its predecessor's open
    transaction and fences it: the zombie's commit fails."""
    bootstrap = kafka_broker.bootstrap_servers
    transactional_id = unique("tx")
    zombie = transactional_producer(bootstrap, transactional_id)
    try:
        zombie.begin_transaction()
        zombie.send(topic, b"zombie")
        zombie.flush()

        successor = transactional_producer(bootstrap, transactional_id)
        try:
            successor.begin_transaction()
            successor.send(topic, b"successor")
            successor.commit_transaction()
        finally:
            successor.close()

        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
    finally:
        zombie.close(timeout=5)

    assert [value for _, value in consume_all(bootstrap, topic)] == [b"successor"]


def test_consumed_offsets_commit_with_the_transaction(
    kafka_broker: KafkaBroker, admin: Any, topic: str
) -> None:
    """consume-transform-produce: output records and input offsets commit atomically."""
    bootstrap = kafka_broker.bootstrap_servers
    output = unique("out")
    admin.create_topics([NewTopic(output, num_partitions=1, replication_factor=1)])
    plain = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for i in range(5):
            plain.send(topic, f"in-{i}".encode())
        plain.flush(timeout=30)
    finally:
        plain.close()

    group = unique("group")
    partition = TopicPartition(topic, 0)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = transactional_producer(bootstrap, unique("tx"))
    try:
        consumer.assign([partition])
        inputs: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(inputs) < 5:
            assert time.monotonic() < deadline
            for batch in consumer.poll(timeout_ms=500).values():
                inputs.extend(record.value for record in batch)

        producer.begin_transaction()
        for value in inputs:
            producer.send(output, value.replace(b"in-", b"out-"))
        producer.send_offsets_to_transaction(
            {partition: OffsetAndMetadata(5, "", -1)}, consumer.group_metadata()
        )
        producer.commit_transaction()

        deadline = time.monotonic() + 30
        while (committed := consumer.committed(partition)) != 5:
            assert time.monotonic() < deadline, f"committed offset {committed}"
            time.sleep(0.2)
    finally:
        producer.close()
        consumer.close()

    assert [value for _, value in consume_all(bootstrap, output)] == [
        f"out-{i}".encode() for i in range(5)
    ]


def test_a_transaction_left_open_is_aborted_soon_after_its_timeout(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """A producer that dies inside a transaction holds read_committed readers back until the
    broker aborts the transaction: its timeout, found by a check the helper runs every second
    (Kafka's default, every 10 s, fails this test about half the time)."""
    if kafka_broker.pid is None:
        pytest.skip("an external broker checks for timed-out transactions on its own terms")
    bootstrap = kafka_broker.bootstrap_servers
    dead = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=unique("tx"),
        enable_idempotence=True,
        acks="all",
        transaction_timeout_ms=1000,
    )
    plain = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        dead.init_transactions()
        dead.begin_transaction()
        dead.send(topic, b"open")
        dead.flush()
        plain.send(topic, b"after")
        plain.flush()
        started = time.monotonic()
        seen: list[bytes] = []
        while b"after" not in seen and time.monotonic() < started + 6:  # 1 s + 1 s + margin
            seen = [value for _, value in consume_all(bootstrap, topic, timeout=2)]
            time.sleep(0.2)
        assert seen == [b"after"]
    finally:
        plain.close()
        dead.close(timeout=0)
