"""Records handed to a kafka-python producer in bulk: one pass per list, one outcome per batch.

``KafkaProducer.send`` costs the egress ~10 us of CPU per record while it works off a backlog
(a py-spy profile): argument checks, a size estimate, two locks, the partitioner, and a
``FutureRecordMetadata`` per record that the sender thread completes one by one - while writing
the record into its batch (kafka-python's record batch builder) takes ~1.5 us. The egress hands
records over in lists (each 50 ms flush, each checkpoint's cut) and needs to know only whether
all of them reached Kafka, so :meth:`BulkAppender.append` does per list or per partition what
``send`` does per record:

1. Each record's partition: the topic's metadata is waited for once per topic if the producer
   has none (``max_block_ms``, as ``send``), then the egress's ``KeyPartitioner``; a record
   larger than ``max_request_size`` raises ``MessageSizeTooLargeError`` before anything of the
   list is appended, as ``send`` would for it.
2. Per partition, in first-seen order (records of one partition keep their order): the
   partition joins the open transaction (transactional producers, once), then, under the
   accumulator's lock for the partition, the records go into its last open batch, and into new
   batches as batches fill - the same batches ``send`` would build (:func:`write_records` lays
   out their bytes as kafka-python's builder does, in one loop), sent by the producer's own
   sender thread (``linger.ms``, ``flush``), with its retries, idempotence and transactions.
3. The sender thread is woken once if a batch was created or is full, as ``send`` would
   for the first such record (a sleeping sender learns of a new batch's linger only so).

The outcome comes per batch: :class:`Delivery` holds the batches the records went into, and
:func:`flush` flushes the producer and gives each failed batch's error and record count.

A batch that the broker refuses as too large (a topic's ``max.message.bytes`` below the
producer's ``batch.size``) is split by kafka-python 3.0, which hands the batch's per-record
futures to the new batches and never completes the old one; handing them over wakes a
``flush`` waiting on it, which then fails with "Future not done" (with ``send`` as well).
Batches made here create those futures only when kafka-python asks for them
(:class:`_FuturesOnDemand`), so that the flush still wakes, and :func:`flush` turns the error
into :class:`BatchTooLarge`, which names the topic and the setting to change; the producer
stays stuck on the batch, and :func:`abandon` closes it.

This writes into kafka-python's record accumulator, which is not public API; the calls it makes
are those of kafka-python 3.0's ``RecordAccumulator.append``. :func:`bulk_supported` checks the
version and the parts used, and the egress falls back to ``send`` per record (logged) when they
differ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from statefun._kafka import import_kafka, internals_unsupported
from statefun.sdk._wire import varint

import_kafka()  # first: it quiets kafka-python's import-time warnings
from kafka import errors as kafka_errors  # noqa: E402
from kafka.producer.future import FutureRecordMetadata  # noqa: E402
from kafka.producer.producer_batch import ProducerBatch  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafka.record.memory_records import MemoryRecordsBuilder  # noqa: E402
from kafka.structs import TopicPartition  # noqa: E402

__all__ = [
    "BatchTooLarge",
    "BulkAppender",
    "Delivery",
    "abandon",
    "bulk_supported",
    "flush",
    "send_each",
]

log = logging.getLogger(__name__)

#: One record: topic, key (None: no key), value (None: a tombstone), headers (None: none).
Row = tuple[str, "str | None", "bytes | None", "list[tuple[str, bytes]] | None"]
#: Bytes a record adds beyond key, value and headers at most (kafka-python's estimate for
#: one record in a batch of its own: the v2 batch header and the record's varints).
_RECORD_OVERHEAD = 61 + 21
_ACCUMULATOR_PARTS = (
    "_batches",
    "_tp_lock",
    "_incomplete",
    "_appends_in_progress",
    "_closed",
    "config",
)
#: what write_records reads and sets (slots of kafka-python's record builders)
_BUILDER_PARTS = ("_builder", "_next_offset", "_closed", "append")
_BATCH_BUILDER_PARTS = (
    "_buffer",
    "_batch_size",
    "_first_timestamp",
    "_max_timestamp",
    "_num_records",
    "_last_offset",
)
_PRODUCER_PARTS = (
    "_accumulator",
    "_metadata",
    "_sender",
    "_transaction_manager",
    "_wait_on_metadata",
    "_closed",
    "config",
)


def bulk_supported(producer: Any) -> str | None:
    """None if :class:`BulkAppender` can write into ``producer``; else why not."""
    accumulator = getattr(producer, "_accumulator", None)
    unsupported = internals_unsupported(
        "bulk appends",
        [
            ("KafkaProducer.", producer, _PRODUCER_PARTS),
            ("KafkaProducer._accumulator.", accumulator, _ACCUMULATOR_PARTS),
            ("MemoryRecordsBuilder.", MemoryRecordsBuilder, _BUILDER_PARTS),
            ("DefaultRecordBatchBuilder.", DefaultRecordBatchBuilder, _BATCH_BUILDER_PARTS),
        ],
    )
    if unsupported is not None:
        return unsupported
    if producer.config.get("message_version", 2) < 2:
        return "record format v0/v1 (brokers before 0.11)"
    return None


class _FuturesOnDemand:
    """A batch's per-record futures, made when kafka-python asks for one: it does when it
    splits the batch, to hand each record over to the new batches."""

    __slots__ = ("_batch",)

    def __init__(self, batch: ProducerBatch) -> None:
        self._batch = batch

    def __len__(self) -> int:
        return int(self._batch.record_count)

    def __getitem__(self, index: int) -> Any:
        return FutureRecordMetadata(self._batch.produce_future, index, None, None, -1, -1, -1)

    def append(self, future: Any) -> None:
        raise TypeError("records are appended by BulkAppender, not send()")


class BatchTooLarge(ConnectionError):
    """Kafka refused a batch as too large, and kafka-python 3.0 cannot send it split."""


def flush(producer: Any, delivery: Delivery, timeout: float) -> list[tuple[BaseException, int]]:
    """``producer.flush()``, then :meth:`Delivery.failures`; raises :class:`BatchTooLarge`
    when kafka-python split a batch (its flush fails with "Future not done")."""
    try:
        producer.flush(timeout=timeout)
    except kafka_errors.UnknownError as exc:
        split = [b for b in delivery.batches() if not b.is_done]
        if not split:
            raise
        tp = split[0].topic_partition
        raise BatchTooLarge(
            f"Kafka refused a record batch for topic {tp.topic} (partition {tp.partition}) as "
            "too large, and kafka-python cannot send it split: set the egress property "
            "batch.size below the topic's max.message.bytes"
        ) from exc
    return delivery.failures()


def abandon(producer: Any, timeout: float = 5.0) -> None:
    """Close a producer stuck on a split batch: its sender thread stopped first, which fails
    the batches still open (``close`` alone would wait on them, and so would its finalizer)."""
    producer._sender.force_close()
    producer._sender.join(timeout)
    try:
        producer.close(timeout=0)
    except kafka_errors.KafkaError as exc:
        log.debug("closing a stuck Kafka producer: %r", exc)


class Delivery:
    """The batches some records went into (or, sent one by one, their futures); their
    outcome once the producer flushed them."""

    def __init__(self) -> None:
        self._batches: dict[int, ProducerBatch] = {}
        self._futures: list[Any] = []

    def add(self, batch: ProducerBatch) -> None:
        self._batches.setdefault(id(batch), batch)

    def add_future(self, future: Any) -> None:
        self._futures.append(future)

    def batches(self) -> list[ProducerBatch]:
        return list(self._batches.values())

    def update(self, other: Delivery) -> None:
        self._batches.update(other._batches)
        self._futures.extend(other._futures)

    def failures(self) -> list[tuple[BaseException, int]]:
        """(error, records) per failed or unfinished batch or record; empty: every record
        was acknowledged. Call after the producer's ``flush``."""
        failed: list[tuple[BaseException, int]] = []
        for future in self._futures:
            if not future.is_done:
                failed.append((kafka_errors.KafkaTimeoutError("not acknowledged"), 1))
            elif future.failed():
                failed.append((future.exception, 1))
        for batch in self._batches.values():
            future = batch.produce_future
            if future.is_done:
                record_errors = future.value[2] if not future.failed() else None
                if future.failed():
                    failed.append((future.exception, batch.record_count))
                elif record_errors is not None:
                    failed.append((record_errors(0), batch.record_count))
                continue
            failed.append((kafka_errors.KafkaTimeoutError(f"{batch} not acknowledged"), 1))
        return failed


class BulkAppender:
    """Appends lists of records to one producer's record accumulator (see the module doc)."""

    def __init__(self, producer: Any, partitioner: Any) -> None:
        self._producer = producer
        self._accumulator = producer._accumulator
        self._partitioner = partitioner
        config = self._accumulator.config
        self._batch_args = (config["message_version"], config["compression_attrs"])
        self._batch_size = config["batch_size"]
        self._max_request_size = producer.config["max_request_size"]
        self._max_block_ms = producer.config["max_block_ms"]
        self._transactions = producer._transaction_manager
        self._partitions: dict[tuple[str, int], TopicPartition] = {}

    def append(self, rows: Iterable[Row]) -> Delivery:
        """Append ``rows`` (see the module doc); the batches they went into."""
        by_partition = self._group(rows)
        accumulator = self._accumulator
        if accumulator._closed or self._producer._closed:
            raise kafka_errors.IllegalStateError("the Kafka producer is closed")
        delivery = Delivery()
        timestamp = int(time.time() * 1000)
        wake = False
        accumulator._appends_in_progress.increment()
        try:
            for tp, records in by_partition.items():
                if self._transactions is not None and self._transactions.is_transactional():
                    self._transactions.maybe_add_partition_to_transaction(tp)
                wake |= self._append_partition(tp, records, timestamp, delivery)
        finally:
            accumulator._appends_in_progress.decrement()
        if wake:
            self._producer._sender.wakeup()
        return delivery

    def _group(self, rows: Iterable[Row]) -> dict[TopicPartition, list[tuple[Any, ...]]]:
        """Step 1: the records per partition, encoded, in order; size checked."""
        metadata = self._producer._metadata
        partition = self._partitioner.partition
        partitions = self._partitions
        limit = self._max_request_size - _RECORD_OVERHEAD
        remembered = getattr(self._partitioner, "remembered", None)
        counts: dict[str, int] = {}  # partitions per topic, read once per list
        grouped: dict[TopicPartition, list[tuple[Any, ...]]] = {}
        # a keyed row like the one before it (a hot key's records) goes where that one went
        last_topic: str | None = None
        last_key: str | None = None
        key_bytes: bytes | None = None
        records: list[tuple[Any, ...]] = []
        for topic, key, value, headers in rows:
            if key is None or key != last_key or topic != last_topic:
                count = counts.get(topic)
                if count is None:
                    if metadata.partitions_for_topic(topic) is None:
                        self._producer._wait_on_metadata(topic, self._max_block_ms)
                    count = counts[topic] = len(metadata.partitions_for_topic(topic) or ())
                key_bytes = None if key is None else key.encode("utf-8")
                number = None
                if remembered is not None and key_bytes is not None:
                    number = remembered(topic, key_bytes, count)
                if number is None:
                    number = partition(topic, None, key_bytes, None, None, metadata)
                tp = partitions.get((topic, number))
                if tp is None:
                    tp = partitions[(topic, number)] = TopicPartition(topic, number)
                found = grouped.get(tp)
                if found is None:
                    found = grouped[tp] = []
                records, last_topic, last_key = found, topic, key
            size = (0 if value is None else len(value)) + (
                0 if key_bytes is None else len(key_bytes)
            )
            if headers:
                size += sum(len(name) + len(data) for name, data in headers)
            if size > limit:
                raise kafka_errors.MessageSizeTooLargeError(
                    f"a record for topic {topic} is {size + _RECORD_OVERHEAD} bytes, more "
                    f"than max.request.size ({self._max_request_size})"
                )
            records.append((key_bytes, value, headers or ()))  # (): shared, not a new list per row
        return grouped

    def _append_partition(
        self,
        tp: TopicPartition,
        records: Sequence[tuple[Any, ...]],
        timestamp: int,
        delivery: Delivery,
    ) -> bool:
        """Step 2: ``records`` into ``tp``'s batches; True if one was created or is full."""
        accumulator = self._accumulator
        now = time.monotonic()
        with accumulator._tp_lock(tp):
            queue = accumulator._batches[tp]
            batch = queue[-1] if queue else None
            if batch is not None:
                delivery.add(batch)
            created = False
            done, count = 0, len(records)
            if batch is not None:
                done = write_records(batch.records, records, done, timestamp)
            while done < count:
                batch = self._new_batch(tp, now)  # none, or full: the sender takes it
                queue.append(batch)
                created = True
                accumulator._incomplete.add(batch)
                delivery.add(batch)
                wrote = write_records(batch.records, records, done, timestamp)
                if wrote == done:
                    raise kafka_errors.IllegalStateError(f"{tp}: an empty batch refused a record")
                done = wrote
            if batch is None:
                return False
            batch.last_append = now
            return len(queue) > 1 or created or bool(batch.records.is_full())

    def _new_batch(self, tp: TopicPartition, now: float) -> ProducerBatch:
        records = MemoryRecordsBuilder(*self._batch_args, self._batch_size)
        batch = ProducerBatch(tp, records, now=now)
        batch._record_futures = _FuturesOnDemand(batch)
        return batch


def _varint(value: int) -> bytes:
    """``value`` (an int64) as a zigzag varint (Kafka's record format v2)."""
    return varint((value << 1) ^ (value >> 63))


#: the zigzag varints of 0..8191 (one or two bytes): record sizes, offset and time deltas
_VARINTS = [_varint(n) for n in range(8192)]


def write_records(
    builder: MemoryRecordsBuilder,
    records: Sequence[tuple[Any, ...]],
    start: int,
    timestamp: int,
) -> int:
    """Writes ``records[start:]`` into ``builder`` while they fit; the index after the last
    one written. An empty batch takes its first record whatever its size (as kafka-python's).

    Each record is laid out as kafka-python's ``DefaultRecordBatchBuilder.append`` lays it out
    (record format v2: length, attributes, timestamp delta, offset delta, key, value, headers),
    without its per-record type checks, metadata object and varint calls; a record with
    headers is appended by kafka-python (dead letters only).
    """
    inner = builder._builder
    if builder._closed:
        return start
    buffer = inner._buffer
    limit = inner._batch_size
    varints = _VARINTS
    offset = builder._next_offset
    ts = b""  # the timestamp delta's varint: known once the batch has a first timestamp
    for index in range(start, len(records)):
        key, value, headers = records[index]
        if headers:
            builder._next_offset = offset
            if builder.append(timestamp, key, value, headers) is None:
                return index
            offset = builder._next_offset
            ts = b""
            continue
        if not ts:
            first = inner._first_timestamp
            delta = 0 if first is None else timestamp - first
            ts = varints[delta] if 0 <= delta < 8192 else _varint(delta)
        if key is None:
            key_part = b"\x01"  # -1: null
        else:
            size = len(key)
            key_part = (varints[size] if size < 8192 else _varint(size)) + key
        if value is None:
            value_part = b"\x01"
        else:
            size = len(value)
            value_part = (varints[size] if size < 8192 else _varint(size)) + value
        offset_part = varints[offset] if offset < 8192 else _varint(offset)
        size = 2 + len(ts) + len(offset_part) + len(key_part) + len(value_part)
        size_part = varints[size] if size < 8192 else _varint(size)
        if inner._num_records:
            if len(buffer) + len(size_part) + size > limit:
                builder._next_offset = offset
                return index
            if inner._max_timestamp < timestamp:
                inner._max_timestamp = timestamp
        else:
            inner._first_timestamp = inner._max_timestamp = timestamp
        buffer += b"".join((size_part, b"\x00", ts, offset_part, key_part, value_part, b"\x00"))
        inner._num_records += 1
        inner._last_offset = offset
        offset += 1
    builder._next_offset = offset
    return len(records)


def send_each(producer: Any, rows: Iterable[Row]) -> Delivery:
    """``rows`` through ``producer.send``, one by one: for producers that
    :func:`bulk_supported` turns down."""
    delivery = Delivery()
    for topic, key, value, headers in rows:
        delivery.add_future(
            producer.send(
                topic,
                key=None if key is None else key.encode("utf-8"),
                value=value,
                headers=None if headers is None else list(headers),
            )
        )
    return delivery
