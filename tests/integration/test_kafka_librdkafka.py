"""The Kafka ingress's records fetched by librdkafka (statefun.ingress._kafka_librdkafka) on the
real broker: the same ConsumerRecords as kafka-python's reader gives, through compressed
batches, transactions committed and aborted (read_committed and read_uncommitted), headers and
nulls; the ingress fetches with it by default, seeks it when restored, reports each partition's
lag from it, and falls back to kafka-python (saying why) on request or for properties it does
not hand over."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from statefun._exceptions import ConfigurationError
from statefun.ingress._kafka_librdkafka import FETCH_CLIENT, Fetcher, fetch_config, to_record
from tests.integration.test_kafka_fetch import assert_same_records, filled_and_read
from tests.integration.test_kafka_io import (
    Collector,
    admin,  # noqa: F401 (a fixture)
    collect,
    create_topic,
    kafka_source,
    produce,
    string,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]


def fetch_all(bootstrap: str, topic: str, isolation_level: str, count: int) -> list[Any]:
    config = fetch_config(bootstrap, None, {"isolation.level": isolation_level}, "test")
    assert isinstance(config, dict), config
    fetcher = Fetcher("test", config)
    try:
        fetcher.assign([(topic, 0), (topic, 1)], {(topic, 0): 0, (topic, 1): 0}, {})
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < count:
            assert time.monotonic() < deadline, f"{len(got)} of {count} records"
            got.extend(map(to_record, fetcher.poll(7, 0.2)))  # (small polls stop inside batches)
        got.extend(map(to_record, fetcher.poll(100, 0.5)))  # nothing more
        for partition in (0, 1):
            end = max(r.offset for r in got if r.partition == partition)
            assert fetcher.highwater(topic, partition) > end
        return got
    finally:
        fetcher.close()


@pytest.mark.parametrize("isolation_level", ["read_committed", "read_uncommitted"])
def test_the_same_records_as_kafka_pythons_reader(
    bootstrap: str,
    admin: Any,  # noqa: F811 (a fixture)
    isolation_level: str,
) -> None:
    topic, sent, theirs, _ = filled_and_read(bootstrap, admin, "librdkafka-fetch", isolation_level)
    ours = fetch_all(bootstrap, topic, isolation_level, len(theirs))
    # all fields but the leader epoch, which the ingress does not read
    assert_same_records(
        [r._replace(leader_epoch=None) for r in ours],
        [r._replace(leader_epoch=None) for r in theirs],
        sent,
        isolation_level,
    )
    assert any(r.headers for r in ours) and any(r.value is None for r in ours)


async def test_the_ingress_fetches_with_it_by_default_and_with_kafka_python_if_told(
    bootstrap: str,
    admin: Any,  # noqa: F811 (a fixture)
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = create_topic(admin, "librdkafka-ingress")
    sent = [(f"k{i % 3}", string(f"v{i}")) for i in range(30)]
    await asyncio.to_thread(produce, bootstrap, topic, sent)
    expected = [("kafka-test/counter", key, value) for key, value in sent]

    source = kafka_source(bootstrap, topic, startup_position="earliest")
    assert await collect(source, Collector(), 30) == expected
    assert source._fetcher is not None
    assert source.partition_offsets() == {f"{topic}:0": (30, 0)}  # the lag, as fetched
    await source.close()

    cases = {
        "kafka-python": {FETCH_CLIENT: "kafka-python"},
        "request.timeout.ms": {"request.timeout.ms": "30000"},  # not handed over: TLS, SASL...
    }
    for named, properties in cases.items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="statefun.ingress.kafka"):
            source = kafka_source(
                bootstrap, topic, startup_position="earliest", properties=properties
            )
            assert await collect(source, Collector(), 30) == expected
        assert source._fetcher is None
        await source.close()
        lines = [r.getMessage() for r in caplog.records]
        assert any("fetched by kafka-python" in line and named in line for line in lines), lines


async def test_a_restored_ingress_fetches_from_its_checkpointed_offsets(
    bootstrap: str,
    admin: Any,  # noqa: F811 (a fixture)
) -> None:
    topic = create_topic(admin, "librdkafka-restore", partitions=2)
    sent = [(f"k{i % 5}", string(f"v{i}")) for i in range(40)]
    await asyncio.to_thread(produce, bootstrap, topic, sent)
    everything = sorted(("kafka-test/counter", key, value) for key, value in sent)

    first = kafka_source(bootstrap, topic, startup_position="earliest")
    head = Collector(limit=13)
    await collect(first, head, 13)
    position = first.snapshot_position()
    assert sum(position.values()) == 13  # (what was routed, not what was fetched ahead)
    await first.close()

    second = kafka_source(bootstrap, topic, startup_position="earliest")
    await second.restore_position(position)  # before its start
    tail = Collector()
    await collect(second, tail, 27)
    assert sorted(head.got + tail.got) == everything
    # restored again while started: it fetches from the checkpoint once more
    await second.restore_position(position)
    again = Collector()
    await collect(second, again, 27, start=False)
    assert sorted(again.got) == sorted(tail.got)
    await second.close()


def test_fetch_config_hands_over_only_what_shapes_fetching() -> None:
    config = fetch_config(
        "127.0.0.1:9092",
        "group",
        {
            "fetch.max.wait.ms": "20",
            "isolation.level": "read_committed",
            "security.protocol": "PLAINTEXT",
            "max.poll.records": "500",
            "pystatefun.dead-letter.topic": "dead",
        },
        "in",
    )
    assert isinstance(config, dict)
    assert config["fetch.wait.max.ms"] == "20"
    assert config["isolation.level"] == "read_committed"
    assert config["group.id"] == "group" and config["enable.auto.commit"] is False
    assert "max.poll.records" not in config and "pystatefun.dead-letter.topic" not in config
    defaults = fetch_config("127.0.0.1:9092", None, {}, "in")
    assert isinstance(defaults, dict)
    assert defaults["isolation.level"] == "read_uncommitted"  # the Java client's default
    assert defaults["check.crcs"] is True
    assert defaults["auto.offset.reset"] == "latest"
    earliest = fetch_config("127.0.0.1:9092", None, {}, "in", "earliest")
    assert isinstance(earliest, dict) and earliest["auto.offset.reset"] == "earliest"
    reason = fetch_config("h:1", None, {"security.protocol": "SSL"}, "in")
    assert reason == "property security.protocol is not handed to librdkafka"
    reason = fetch_config("h:1", None, {"sasl.jaas.config": "secret"}, "in")
    assert reason == "property sasl.jaas.config is not handed to librdkafka"  # (no value)
    with pytest.raises(ConfigurationError, match=r"pystatefun\.fetch\.client: expected"):
        fetch_config("h:1", None, {FETCH_CLIENT: "java"}, "in")
    wrong = fetch_config("h:1", None, {"isolation.level": "sometimes"}, "in")
    assert isinstance(wrong, dict)
    with pytest.raises(ConfigurationError, match=r"ingress in: .*isolation\.level"):
        Fetcher("in", wrong)


@pytest.mark.timeout(30)
def test_a_poll_hands_over_what_came_without_waiting_for_a_full_batch(
    bootstrap: str,
    admin: Any,  # noqa: F811 (a fixture)
) -> None:
    topic = create_topic(admin, "librdkafka-prompt")
    produce(bootstrap, topic, [("k", string("one"))])
    config = fetch_config(bootstrap, None, {}, "test")
    assert isinstance(config, dict)
    fetcher = Fetcher("test", config)
    try:
        fetcher.assign([(topic, 0)], {(topic, 0): 0}, {})
        # a batch of 2,000 may take a minute to fill: the one record comes back first
        got = fetcher.poll(2000, 60.0)
        assert [(m.key(), m.offset()) for m in got] == [(b"k", 0)]
    finally:
        fetcher.close()
