"""The ingress's lean reader of fetched Kafka batches (statefun.ingress._kafka_fetch) against
kafka-python's own, on batches built in memory: the same ConsumerRecords field for field, the
same fetch positions, and a clear error for garbled bytes. tests/integration/test_kafka_fetch.py
does the same against a real broker (transactions, compression, the consumer itself)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from statefun._kafka import import_kafka
from statefun.ingress import _kafka_fetch
from statefun.ingress._kafka_fetch import LeanPartitionRecords, lean_supported

kafka = import_kafka()
from kafka.consumer.fetcher import Fetcher  # noqa: E402
from kafka.errors import CorruptRecordError  # noqa: E402
from kafka.record.default_records import (  # noqa: E402
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
)
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder  # noqa: E402
from kafka.structs import TopicPartition  # noqa: E402

TP = TopicPartition("topic-a", 3)
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def batch(
    first_offset: int, records: list[Record], compression: int = 0, timestamp: int = 1_700_000
) -> bytes:
    builder = MemoryRecordsBuilder(
        magic=2, compression_type=compression, batch_size=1 << 22, offset=first_offset
    )
    for i, (key, value, headers) in enumerate(records):
        builder.append(timestamp=timestamp + 70 * i, key=key, value=value, headers=headers)
    builder.close()
    return bytes(builder.buffer())


def read_all(cls: Any, data: bytes, fetch_offset: int = 0, take: int = 7) -> tuple[list[Any], Any]:
    part = cls(fetch_offset, TP, MemoryRecords(data))
    out: list[Any] = []
    positions = []
    while part:
        got = part.take(take)
        if not got:
            break
        out += got
        positions.append(part.next_fetch_offset)
        assert part.next_fetch_offset == got[-1].offset + 1 or not part
    return out, (positions, part.next_fetch_offset, part.records_read)


def assert_same(data: bytes, fetch_offset: int = 0, take: int = 7) -> list[Any]:
    theirs, their_positions = read_all(Fetcher.PartitionRecords, data, fetch_offset, take)
    ours, our_positions = read_all(LeanPartitionRecords, data, fetch_offset, take)
    assert ours == theirs
    assert our_positions == their_positions
    return ours


def varied_records(rng: random.Random, count: int) -> list[Record]:
    """Keys and values of sizes that need 1, 2 and 3 varint bytes, nulls, and headers."""
    out: list[Record] = []
    for i in range(count):
        key = None if i % 11 == 0 else rng.randbytes(rng.choice([0, 5, 63, 64, 200, 9000]))
        value = None if i % 13 == 0 else rng.randbytes(rng.choice([0, 1, 40, 8191, 20000]))
        headers: list[tuple[str, bytes | None]] = []
        if i % 5 == 0:
            headers = [("trace", b"x" * (i % 70)), ("\u00e9t\u00e9", None), ("", b"")]
        out.append((key, value, headers))
    return out


def test_small_records_as_kafka_python_reads_them() -> None:
    data = b"".join(
        batch(first, [(b"k%d" % i, b"%08d" % i, []) for i in range(first, first + 250)])
        for first in range(0, 1000, 250)
    )
    records = assert_same(data, take=2000)
    assert [r.offset for r in records] == list(range(1000))
    assert records[5].key == b"k5" and records[5].value == b"00000005"
    assert records[5].timestamp == 1_700_000 + 70 * 5


@pytest.mark.parametrize("compression", [0, 1], ids=["plain", "gzip"])
def test_varied_records_as_kafka_python_reads_them(compression: int) -> None:
    rng = random.Random(7)
    data = batch(0, varied_records(rng, 60), compression) + batch(
        60, varied_records(rng, 40), compression, timestamp=2**40
    )
    records = assert_same(data, take=3)
    assert len(records) == 100
    assert any(r.headers for r in records) and any(r.key is None for r in records)


def test_a_fetch_offset_inside_a_batch_skips_the_records_before_it() -> None:
    data = batch(100, [(b"k", b"v%d" % i, []) for i in range(20)])
    records = assert_same(data, fetch_offset=107)
    assert [r.offset for r in records] == list(range(107, 120))


def test_offsets_far_apart_within_a_batch() -> None:
    """Offset deltas past one and two varint bytes (as compaction can leave them)."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for offset in (0, 1, 63, 64, 8191, 8192, 1_000_000):
        builder.append(offset, timestamp=5, key=b"k", value=b"v", headers=[])
    data = bytes(builder.build())
    theirs = list(DefaultRecordBatch(data))
    records = assert_same(data)
    assert [r.offset for r in records] == [r.offset for r in theirs]


def test_an_empty_fetch() -> None:
    assert assert_same(b"") == []


def test_garbled_records_name_the_partition_and_offset() -> None:
    good = bytearray(batch(40, [(b"key", b"value", [])] * 3))
    header = DefaultRecordBatch.HEADER_STRUCT.size
    good[header] = 0x7E  # the first record's length: 63 bytes, far more than it has
    bad = bytes(good)
    part = LeanPartitionRecords(40, TP, MemoryRecords(bad), check_crcs=False)
    with pytest.raises(CorruptRecordError, match=r"topic-a-3 at offset 40"):
        part.take(10)


def test_a_batch_cut_short_is_refused() -> None:
    whole = batch(0, [(b"key", b"value", [])] * 3)
    header = DefaultRecordBatch.HEADER_STRUCT.size
    # the batch says three records; give it the bytes of two and a half, with a fixed length
    cut = bytearray(whole[: len(whole) - 6])
    cut[8:12] = (len(cut) - 12).to_bytes(4, "big")
    assert len(cut) > header
    part = LeanPartitionRecords(0, TP, MemoryRecords(bytes(cut)), check_crcs=False)
    with pytest.raises(CorruptRecordError, match=r"topic-a-3 at offset 0: cut short"):
        part.take(10)


def test_a_bad_checksum_is_refused() -> None:
    data = bytearray(batch(0, [(b"key", b"value", [])] * 3))
    data[-1] ^= 0xFF
    part = LeanPartitionRecords(0, TP, MemoryRecords(bytes(data)))
    with pytest.raises(CorruptRecordError, match="topic-a-3 at offset 0: failed crc check"):
        part.take(10)


def test_deserializers_keep_kafka_pythons_path() -> None:
    class Upper:
        def deserialize(self, topic: str, headers: Any, data: bytes | None) -> Any:
            return None if data is None else data.upper()

    data = batch(0, [(b"key", b"value", [])])
    part = LeanPartitionRecords(0, TP, MemoryRecords(data), value_deserializer=Upper())
    [record] = part.take(1)
    assert record.value == b"VALUE"


def test_support_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    class Consumer:
        def __init__(self, **config: Any) -> None:
            self.config = {"key_deserializer": None, "value_deserializer": None, **config}
            self._fetcher = type("F", (), {"PartitionRecords": Fetcher.PartitionRecords})()

    assert lean_supported(Consumer()) is None
    consumer = Consumer()
    assert _kafka_fetch.install(consumer) is None
    assert consumer._fetcher.PartitionRecords is LeanPartitionRecords
    why = lean_supported(Consumer(value_deserializer=bytes))
    assert why is not None and "deserializers" in why
    monkeypatch.setattr(kafka, "__version__", "3.1.0")
    untouched = Consumer()
    why = _kafka_fetch.install(untouched)
    assert why is not None and "3.1.0" in why
    assert untouched._fetcher.PartitionRecords is Fetcher.PartitionRecords


def test_records_compacted_away_at_a_batch_end_are_fetched_past() -> None:
    """A v2 batch keeps its last offset when compaction removes its last records: the next
    fetch starts after it, not after the last record left."""
    data = bytearray(batch(10, [(b"k", b"v", [])] * 3))
    base = DefaultRecordBatch(bytes(data)).base_offset
    data[23:27] = (19 - base).to_bytes(4, "big")  # the last offset delta: up to offset 19
    part = LeanPartitionRecords(10, TP, MemoryRecords(bytes(data)), check_crcs=False)
    assert [r.offset for r in part.take(10)] == [10, 11, 12]
    assert part.next_fetch_offset == 20
    theirs = Fetcher.PartitionRecords(10, TP, MemoryRecords(bytes(data)), check_crcs=False)
    theirs.take(10)
    assert theirs.next_fetch_offset == 20


@pytest.mark.parametrize("magic", [0, 1])
def test_old_record_formats_as_kafka_python_reads_them(magic: int) -> None:
    """Batches of brokers before 0.11 (formats v0/v1) go through kafka-python's own reader."""
    builder = MemoryRecordsBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    for i in range(12):
        key = None if i == 3 else b"k%d" % i
        builder.append(timestamp=1_700_000 + i if magic else None, key=key, value=b"v%d" % i)
    builder.close()
    records = assert_same(bytes(builder.buffer()), fetch_offset=2, take=5)
    assert [r.offset for r in records] == list(range(2, 12))
    assert records[1].key is None and records[1].serialized_key_size == -1


def test_a_bad_checksum_of_an_old_record_is_refused() -> None:
    builder = MemoryRecordsBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=5, key=b"key", value=b"value")
    builder.close()
    data = bytearray(builder.buffer())
    data[-1] ^= 0xFF
    part = LeanPartitionRecords(0, TP, MemoryRecords(bytes(data)))
    with pytest.raises(CorruptRecordError, match="topic-a-3 at offset 0: failed crc check"):
        part.take(10)
