"""The Kafka egress's producer settings, partitioner and record checks (no broker: nothing
here connects)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statefun.egress._kafka_partitioner import CACHE_SIZE, KeyPartitioner
from statefun.egress.base import EgressRecord
from statefun.egress.kafka import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_LINGER_MS,
    KAFKA_PRODUCER_RECORD,
    KafkaSink,
)
from statefun.sdk import TypedValue
from statefun.sdk._proto import egress_pb2

# murmur2 of these keys as Apache Kafka's Java client computes it (signed 32-bit), from the
# murmur2 test of its Utils; the partition is (hash & 0x7fffffff) % partition count.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


class Cluster:
    """The part of kafka-python's ClusterMetadata a partitioner reads."""

    def __init__(self, **partitions: int) -> None:
        self.counts = dict(partitions)

    def topics(self) -> set[str]:
        return set(self.counts)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.counts.get(topic)
        return None if count is None else set(range(count))

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions_for_topic(topic) or set()


def partition(partitioner: KeyPartitioner, cluster: Cluster, topic: str, key: bytes | None) -> int:
    return partitioner.partition(topic, key, key, b"v", b"v", cluster)


@pytest.mark.parametrize("count", [1, 2, 3, 7, 12])
def test_keyed_records_go_where_the_java_client_puts_them(count: int) -> None:
    partitioner, cluster = KeyPartitioner(), Cluster(t=count)
    for _ in range(2):  # computed, then remembered
        for key, java_hash in JAVA_MURMUR2.items():
            assert partition(partitioner, cluster, "t", key) == (java_hash & 0x7FFFFFFF) % count


def test_a_remembered_partition_follows_the_partition_count() -> None:
    partitioner, cluster = KeyPartitioner(), Cluster(t=3, u=5)
    key = b"a-little-bit-longer-string"
    expected = {n: (JAVA_MURMUR2[key] & 0x7FFFFFFF) % n for n in (3, 5, 11)}
    assert partition(partitioner, cluster, "t", key) == expected[3]
    assert partition(partitioner, cluster, "u", key) == expected[5]  # per topic
    cluster.counts["t"] = 11  # partitions added
    assert partition(partitioner, cluster, "t", key) == expected[11]


def test_records_without_a_key_spread_and_unknown_topics_raise() -> None:
    partitioner, cluster = KeyPartitioner(), Cluster(t=4)
    seen = {partition(partitioner, cluster, "t", None) for _ in range(200)}
    assert seen <= {0, 1, 2, 3} and len(seen) > 1
    with pytest.raises(ValueError, match="not found"):
        partition(partitioner, cluster, "missing", b"k")


def test_the_cache_is_bounded() -> None:
    partitioner, cluster = KeyPartitioner(), Cluster(t=3)
    for i in range(CACHE_SIZE + 10):
        partition(partitioner, cluster, "t", b"k%d" % i)
    assert len(partitioner._cache) <= CACHE_SIZE


def test_producer_defaults_and_properties_that_override_them() -> None:
    sink = KafkaSink("e/out", "127.0.0.1:1", "exactly-once")
    for config in (sink._plain_config, sink._transactional_config):
        assert config["linger_ms"] == DEFAULT_LINGER_MS
        assert config["batch_size"] == DEFAULT_BATCH_BYTES
        assert isinstance(config["partitioner"], KeyPartitioner)
    sink = KafkaSink(
        "e/out", "127.0.0.1:1", "at-least-once", properties={"linger.ms": "0", "batch.size": "1"}
    )
    assert sink._plain_config["linger_ms"] == 0
    assert sink._plain_config["batch_size"] == 1


def test_records_that_are_not_kafka_producer_records_are_rejected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = KafkaSink("e/out", "127.0.0.1:1", "at-least-once")
    good = egress_pb2.KafkaProducerRecord(topic="t", key="k", value_bytes=b"v")
    sink.write(EgressRecord("e/out", TypedValue(KAFKA_PRODUCER_RECORD, good.SerializeToString())))
    for typed in (
        TypedValue("io.statefun.types/string", b"\n\x01x"),
        TypedValue(KAFKA_PRODUCER_RECORD, None),  # no value: an empty record
        TypedValue(KAFKA_PRODUCER_RECORD, b"\xff\xff"),  # not protobuf
        TypedValue(
            KAFKA_PRODUCER_RECORD, egress_pb2.KafkaProducerRecord(key="k").SerializeToString()
        ),
    ):
        sink.write(EgressRecord("e/out", typed))
    assert sink._buffer == [("t", "k", b"v", None)]
    assert sink.rejected == 4
    reasons = [r.getMessage() for r in caplog.records]
    assert any("is not a KafkaProducerRecord" in r for r in reasons)
    assert sum("cannot be decoded" in r for r in reasons) == 1
    assert sum("has no topic" in r for r in reasons) == 2


def _record(topic: str, key: str, value: bytes) -> bytes:
    record = egress_pb2.KafkaProducerRecord(topic=topic, key=key, value_bytes=value)
    return record.SerializeToString()


#: a value an egress may be handed: a record (large or small, with or without topic and key),
#: bytes that are not one, or a value of another type
_values = st.one_of(
    st.builds(
        lambda t, k, v: TypedValue(KAFKA_PRODUCER_RECORD, _record(t, k, v)),
        st.sampled_from(["", "t", "out-" + "x" * 200]),
        st.text(max_size=3),
        st.binary(max_size=300),
    ),
    st.builds(lambda v: TypedValue(KAFKA_PRODUCER_RECORD, v), st.binary(max_size=5)),
    st.just(TypedValue(KAFKA_PRODUCER_RECORD, None)),
    st.just(TypedValue("io.statefun.types/string", b"\n\x01x")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, max_size=20))
def test_a_run_parsed_at_once_gives_what_a_parse_per_record_gives(values: list[TypedValue]) -> None:
    at_once = KafkaSink("e/out", "127.0.0.1:1", "at-least-once")
    each = KafkaSink("e/out", "127.0.0.1:1", "at-least-once")
    at_once.write_many(values)
    each._write_each(values)
    assert at_once._buffer == each._buffer
    assert at_once.rejected == each.rejected


def test_an_exactly_once_egress_never_loads_librdkafka() -> None:
    """Only the plain producer sends with librdkafka: a cluster worker's transactions (an
    exactly-once egress) do without loading it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from statefun.egress.kafka import KafkaSink\n"
        "KafkaSink('e/out', '127.0.0.1:1', 'exactly-once')\n"
        "loaded = 'confluent_kafka' in sys.modules\n"
        "KafkaSink('e/out', '127.0.0.1:1', 'at-least-once')\n"
        "print(loaded, 'confluent_kafka' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
