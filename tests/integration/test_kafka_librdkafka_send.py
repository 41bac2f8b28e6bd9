"""A Kafka egress's plain producer on librdkafka (statefun.egress._kafka_librdkafka), on the
real broker: the same partitions, order, headers and tombstones as kafka-python's, which client
sends as the properties say, and what fails a flush (a record too large, a record the broker
refuses, a broker out of reach) with the records kept for the next one."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from statefun._exceptions import ConfigurationError
from statefun.egress._kafka_librdkafka import PRODUCE_CLIENT, Sender, produce_config
from statefun.egress.kafka import KafkaSink
from tests.integration.test_kafka_append import topic_with
from tests.integration.test_kafka_io import EGRESS, by_partition, kafka_record

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]

ROWS: list[Any] = [
    *((None, f"k{n % 7}", f"v{n}".encode(), None) for n in range(60)),
    (None, None, b"no key", None),
    (None, "k1", None, None),  # a tombstone
    (None, "k2", b"with headers", [("h1", b"x"), ("h2", b"")]),
]


async def send_all(bootstrap: str, topic: str, properties: dict[str, str]) -> str:
    """Every row, in two flushes; the client that sent them."""
    sink = KafkaSink(EGRESS, bootstrap, "at-least-once", properties=properties)
    await sink.start()
    try:
        sink.write_rows([(topic, *row[1:]) for row in ROWS[:30]])
        await sink.flush()
        sink.write_rows([(topic, *row[1:]) for row in ROWS[30:]])
        await sink.flush()
        assert sink.backlog() == 0 and sink.produced == len(ROWS)
        producers = sink._producers
        assert (producers.sender is None) != (producers.plain is None)
        return "librdkafka" if producers.sender is not None else "kafka-python"
    finally:
        await sink.close()


async def test_the_same_partitions_order_headers_and_tombstones_as_kafka_python(
    bootstrap: str,
) -> None:
    ours, theirs = topic_with(bootstrap, "rd-send", 5), topic_with(bootstrap, "kp-send", 5)
    assert await send_all(bootstrap, ours, {}) == "librdkafka"
    assert await send_all(bootstrap, theirs, {PRODUCE_CLIENT: "kafka-python"}) == "kafka-python"
    got, expected = by_partition(bootstrap, ours), by_partition(bootstrap, theirs)
    keyless = [r[:2] for records in got.values() for r in records if r[0] is None]
    assert keyless == [(None, b"no key")]  # (its partition: any)
    assert {p: [r for r in records if r[0] is not None] for p, records in got.items()} == {
        p: [r for r in records if r[0] is not None] for p, records in expected.items()
    }
    flat = [r for records in got.values() for r in records]
    assert len(flat) == len(ROWS)
    assert (b"k1", None) in [r[:2] for r in flat]
    assert [list(r[2]) for r in flat if r[1] == b"with headers"] == [[("h1", b"x"), ("h2", b"")]]


async def test_a_record_over_max_request_size_fails_the_flush_and_is_kept(
    bootstrap: str,
) -> None:
    topic = topic_with(bootstrap, "rd-huge")
    sink = KafkaSink(EGRESS, bootstrap, "at-least-once", properties={"max.request.size": "10000"})
    try:
        sink.write(kafka_record(topic, "fine"))
        sink.write(kafka_record(topic, "x" * 20_000))
        with pytest.raises(ConnectionError, match=f"record for topic {topic} was refused: .*"):
            await sink.flush()
        assert sink.backlog() == 2  # both again at the next flush: at least once
    finally:
        sink._buffer.clear()
        await sink.close()


async def test_a_record_the_broker_refuses_fails_the_flush_counted(bootstrap: str) -> None:
    topic = topic_with(bootstrap, "rd-refused", max_message_bytes="2048")
    sink = KafkaSink(EGRESS, bootstrap, "at-least-once")
    try:
        sink.write(kafka_record(topic, "B" * 5000, key="k"))
        with pytest.raises(ConnectionError, match=r"1 of 1 record\(s\) not acknowledged by Kafka"):
            await sink.flush()
        assert sink.backlog() == 1
    finally:
        sink._buffer.clear()
        await sink.close()


async def test_a_broker_out_of_reach_fails_the_flush_after_the_delivery_timeout() -> None:
    sink = KafkaSink(
        EGRESS, "127.0.0.1:1", "at-least-once", properties={"delivery.timeout.ms": "1500"}
    )
    try:
        for n in range(3):
            sink.write(kafka_record("nowhere", f"v{n}"))
        started = time.monotonic()
        with pytest.raises(ConnectionError, match=r"3 of 3 record\(s\) not acknowledged by Kafka"):
            await sink.flush()
        assert time.monotonic() - started < 30
        assert sink.backlog() == 3
    finally:
        sink._buffer.clear()
        await sink.close()


async def test_semantic_none_drops_what_fails_with_one_line(caplog: Any) -> None:
    sink = KafkaSink(EGRESS, "127.0.0.1:1", "none", properties={"delivery.timeout.ms": "500"})
    try:
        with caplog.at_level(logging.ERROR, logger="statefun.egress.kafka"):
            for _ in range(2):
                sink.write(kafka_record("nowhere", "v"))
                await sink.flush()  # never raises
            deadline = time.monotonic() + 20
            while "dropped (semantic none)" not in caplog.text:
                assert time.monotonic() < deadline
                time.sleep(0.2)
                sink.write(kafka_record("nowhere", "v"))
                await sink.flush()
        dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 1, dropped  # (rate limited: one line per 10 s)
        assert sink.backlog() == 0
    finally:
        await sink.close()


def test_produce_config_hands_over_only_what_shapes_sending() -> None:
    config = produce_config(
        "b:9092",
        {
            "acks": "1",
            "compression.type": "lz4",
            "max.request.size": "2000000",
            "transactional.id": "t",
            "pystatefun.dead-letter.topic": "dl",
            "security.protocol": "PLAINTEXT",
        },
        "egress e",
        20,
        262144,
    )
    assert isinstance(config, dict)
    assert config["acks"] == "1" and config["enable.idempotence"] is False  # as Java's client
    assert config["compression.type"] == "lz4" and config["message.max.bytes"] == "2000000"
    assert (config["linger.ms"], config["batch.size"]) == (20, 262144)
    assert "transactional.id" not in config and "pystatefun.dead-letter.topic" not in config
    default = produce_config("b:9092", {}, "egress e", 20, 262144)
    assert isinstance(default, dict) and default["enable.idempotence"] is True
    assert produce_config("b", {"security.protocol": "SSL"}, "egress e", 20, 1) == (
        "property security.protocol is not handed to librdkafka"
    )
    assert produce_config("b", {PRODUCE_CLIENT: "kafka-python"}, "egress e", 20, 1) == (
        f"property {PRODUCE_CLIENT} is kafka-python"
    )
    with pytest.raises(ConfigurationError, match=f"egress e: property {PRODUCE_CLIENT}"):
        produce_config("b", {PRODUCE_CLIENT: "java"}, "egress e", 20, 1)
    wrong = produce_config("b", {"linger.ms": "soon"}, "egress e", 20, 1)
    assert isinstance(wrong, dict)
    with pytest.raises(ConfigurationError, match=r"egress out: .*linger\.ms"):
        Sender("out", wrong)
