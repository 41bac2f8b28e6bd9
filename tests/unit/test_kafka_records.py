"""The egress's record writer (statefun.egress._kafka_append.write_records) against
kafka-python's own ``append``: byte for byte the same batches, filled to the same point."""

from __future__ import annotations

import random

import pytest

from statefun._kafka import import_kafka
from statefun.egress._kafka_append import write_records

import_kafka()
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder  # noqa: E402

Rows = list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]]


def kafka_pythons(rows: Rows, batch_size: int, timestamps: list[int]) -> list[bytes]:
    batches, builder, index = [], MemoryRecordsBuilder(2, 0, batch_size), 0
    for timestamp, part in zip(timestamps, split(rows, len(timestamps)), strict=True):
        for key, value, headers in part:
            if builder.append(timestamp, key, value, headers or []) is None:
                builder.close()
                batches.append(bytes(builder.buffer()))
                builder = MemoryRecordsBuilder(2, 0, batch_size)
                assert builder.append(timestamp, key, value, headers or []) is not None
            index += 1
    builder.close()
    return [*batches, bytes(builder.buffer())]


def ours(rows: Rows, batch_size: int, timestamps: list[int]) -> list[bytes]:
    batches, builder = [], MemoryRecordsBuilder(2, 0, batch_size)
    for timestamp, part in zip(timestamps, split(rows, len(timestamps)), strict=True):
        done = write_records(builder, part, 0, timestamp)
        while done < len(part):
            builder.close()
            batches.append(bytes(builder.buffer()))
            builder = MemoryRecordsBuilder(2, 0, batch_size)
            wrote = write_records(builder, part, done, timestamp)
            assert wrote > done
            done = wrote
    builder.close()
    return [*batches, bytes(builder.buffer())]


def split(rows: Rows, parts: int) -> list[Rows]:
    size = -(-len(rows) // parts)
    return [rows[i * size : (i + 1) * size] for i in range(parts)]


@pytest.mark.parametrize("batch_size", [100, 4_096, 262_144])
def test_the_same_batches_as_kafka_pythons_append(batch_size: int) -> None:
    rng = random.Random(batch_size)
    rows: Rows = []
    for i in range(12_000):  # offsets past one and two varint bytes in the big batches
        key = None if i % 17 == 0 else b"k%d" % i
        value = None if i % 29 == 1 else rng.randbytes(rng.choice([0, 3, 63, 64, 300, 9_000]))
        headers = [("why", b"dead letter"), ("n", b"%d" % i)] if i % 101 == 0 else None
        rows.append((key, value, headers))
    # later calls write into the same batch with later (and one earlier) timestamps
    timestamps = [1_700_000_000_000, 1_700_000_000_050, 1_700_000_100_000, 1_699_999_999_000]
    theirs = kafka_pythons(rows, batch_size, timestamps)
    mine = ours(rows, batch_size, timestamps)
    assert len(mine) == len(theirs) > (1 if batch_size < 262_144 else 0)
    assert mine == theirs
    read = [r for data in mine for batch in MemoryRecords(data) for r in batch]  # type: ignore[attr-defined]
    assert [(r.key, r.value) for r in read] == [(k, v) for k, v, _ in rows]


def test_a_closed_builder_takes_nothing() -> None:
    builder = MemoryRecordsBuilder(2, 0, 1_000)
    builder.close()
    assert write_records(builder, [(b"k", b"v", None)], 0, 5) == 0
