"""Fetched Kafka record batches turned into records in one tight pass per batch.

kafka-python 3.0 turns each record of a fetch response into a ``ConsumerRecord`` through a
generator that, per record, reads it into a ``DefaultRecord`` (a property per field), copies key
and value twice (a bytearray slice, then ``bytes``), calls the deserializer hook twice, sums the
header sizes and builds the namedtuple with keywords: with the consumer's other work, 4.0 us of
CPU per small record (``bench/kafka_consumer.py``), about a quarter of the runtime's CPU while
it works off a backlog on one hot key (a py-spy profile of
``bench/statefun_jvm_vs_pystatefun.py``).

:class:`LeanPartitionRecords` takes the place of kafka-python's ``Fetcher.PartitionRecords`` in
the ingress's consumer (:func:`install`) and gives the same ``ConsumerRecord`` values, field for
field (the integration tests compare both against a real broker): 1.6 us per small record
with the consumer's other work (2.5x less). Per fetched partition, batch by batch:

1. The batch's CRC is checked (``check_crcs``, as kafka-python does).
2. Batches of record format v0/v1 (brokers before 0.11) go through kafka-python's own record
   reader; the rest is v2.
3. The batch's leader epoch becomes the partition's. Under ``read_committed``, a transactional
   batch whose transaction the broker reported aborted is skipped, and an abort marker ends
   the skipping for its producer - with kafka-python's own helpers for that bookkeeping.
4. Control batches (transaction markers) are skipped; the next fetch offset moves past them.
5. The batch is decompressed if it is compressed (kafka-python's codecs), then its records are
   read in one loop over the batch's bytes: varints with a one- and two-byte fast path, key and
   value sliced once from a ``bytes`` copy of the batch, sizes checked against each record's
   length prefix and the batch's end (a mismatch is a ``CorruptRecordError`` naming the
   partition and the offset).
6. Records are handed out one at a time, moving the next fetch offset past each - the consumer
   may stop mid-batch (``max_poll_records``) and reads the offset to know its position.

After the last batch the next fetch offset is that batch's end (compaction may have removed its
last records), and the partition's records are drained as kafka-python does.

Consumers with deserializers keep kafka-python's path (the ingress uses none). This reads
private parts of kafka-python (``Fetcher.PartitionRecords`` and a v2 batch's buffer);
:func:`lean_supported` checks the version and the parts used, and :func:`install` leaves a
consumer as it is, and says why, when they differ.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from statefun._kafka import import_kafka, internals_unsupported

import_kafka()  # first: it quiets kafka-python's import-time warnings
from kafka.consumer.fetcher import ConsumerRecord, Fetcher, IsolationLevel  # noqa: E402
from kafka.errors import CorruptRecordError  # noqa: E402
from kafka.record.default_records import DefaultRecordBatch  # noqa: E402

__all__ = ["LeanPartitionRecords", "header_size", "install", "lean_supported"]

log = logging.getLogger(__name__)

_new_record = tuple.__new__  # a ConsumerRecord without namedtuple's keyword-taking __new__
_BATCH_PARTS = ("_buffer", "_pos", "_num_records", "_maybe_uncompress")
_PARTITION_RECORDS_PARTS = (
    "_consume_aborted_transactions_up_to",
    "_contains_abort_marker",
    "_is_batch_aborted",
    "_maybe_skip_record",
    "drain",
)
#: the fields read by position: a ConsumerRecord is built from a tuple (``_new_record``)
_RECORD_FIELDS = (
    "topic",
    "partition",
    "leader_epoch",
    "offset",
    "timestamp",
    "timestamp_type",
    "key",
    "value",
    "headers",
    "checksum",
    "serialized_key_size",
    "serialized_value_size",
    "serialized_header_size",
)


def lean_supported(consumer: Any) -> str | None:
    """None if :func:`install` can give ``consumer`` lean record batches; else why not."""
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(fetcher, "PartitionRecords", None)
    if fetcher is not None and base is not Fetcher.PartitionRecords:
        return "the consumer reads batches with another class already"
    unsupported = internals_unsupported(
        "the lean batch reader",
        [
            ("KafkaConsumer.", consumer, ("_fetcher", "config")),
            ("Fetcher.PartitionRecords.", Fetcher.PartitionRecords, _PARTITION_RECORDS_PARTS),
            ("DefaultRecordBatch.", DefaultRecordBatch, _BATCH_PARTS),  # (slots included)
        ],
    )
    if unsupported is not None:
        return unsupported
    if tuple(ConsumerRecord._fields) != _RECORD_FIELDS:
        return f"kafka-python's ConsumerRecord has other fields: {ConsumerRecord._fields}"
    config = consumer.config
    if config.get("key_deserializer") or config.get("value_deserializer"):
        return "the consumer has deserializers"
    return None


def install(consumer: Any) -> str | None:
    """Gives ``consumer`` lean record batches; None if done, else why not (nothing changed)."""
    unsupported = lean_supported(consumer)
    if unsupported is None:
        consumer._fetcher.PartitionRecords = LeanPartitionRecords
    return unsupported


class LeanPartitionRecords(Fetcher.PartitionRecords):  # type: ignore[misc]
    """kafka-python's records of one fetched partition, read batch by batch in one pass."""

    def _unpack_records(
        self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any
    ) -> Iterator[Any]:
        if key_deserializer is not None or value_deserializer is not None:
            yield from super()._unpack_records(tp, records, key_deserializer, value_deserializer)
            return
        try:
            last = None
            while (batch := records.next_batch()) is not None:
                last = batch
                # 1. the batch's checksum
                if self.check_crcs and not batch.validate_crc():
                    raise CorruptRecordError(
                        f"Record batch of partition {_tp_name(tp)} at offset {batch.base_offset}: "
                        "failed crc check"
                    )
                # 2. record formats v0/v1
                if batch.magic != 2:
                    yield from self._legacy(tp, batch)
                    continue
                # 3. aborted transactions; 4. control batches
                self.leader_epoch = batch.leader_epoch
                if self._skipped(batch):
                    self.next_fetch_offset = batch.next_offset
                    continue
                # 5. the records, read in one pass
                found, size = _read_batch(tp, batch, self.leader_epoch)
                self.records_read += len(found)
                self.bytes_read += size
                # 6. handed out one at a time
                for record in found:
                    self.next_fetch_offset = record[3] + 1
                    yield record
            if last is not None and last.magic == 2:
                self.next_fetch_offset = last.next_offset
            self.drain()
        except StopIteration as exc:  # a generator would turn it into its own end
            log.exception("StopIteration while reading records of %s", tp)
            raise RuntimeError(f"StopIteration while reading records of {tp}") from exc

    def _skipped(self, batch: Any) -> bool:
        """Whether a v2 batch is left out: a control batch, or one of an aborted transaction."""
        if self.isolation_level == IsolationLevel.READ_COMMITTED and batch.has_producer_id():
            self._consume_aborted_transactions_up_to(batch.last_offset)
            if self._contains_abort_marker(batch):
                self.aborted_producer_ids.discard(batch.producer_id)
            elif self._is_batch_aborted(batch):
                log.debug(
                    "%s: skipping aborted batch of producer %s, offsets %s to %s",
                    _tp_name(self.topic_partition),
                    batch.producer_id,
                    batch.base_offset,
                    batch.last_offset,
                )
                return True
        return bool(batch.is_control_batch)

    def _legacy(self, tp: Any, batch: Any) -> Iterator[Any]:
        """Records of format v0/v1, read by kafka-python."""
        for record in batch:
            if self.check_crcs and not record.validate_crc():
                raise CorruptRecordError(
                    f"Record of partition {_tp_name(tp)} at offset {record.offset}: "
                    "failed crc check"
                )
            self.records_read += 1
            self.bytes_read += record.size_in_bytes
            self.next_fetch_offset = record.offset + 1
            yield _consumer_record(
                tp,
                self.leader_epoch,
                record.offset,
                record.timestamp,
                record.timestamp_type,
                record.key,
                record.value,
                record.headers,
                record.checksum,
            )


def _tp_name(tp: Any) -> str:
    """A topic partition as Kafka's tools write it: topic-partition."""
    return f"{tp.topic}-{tp.partition}"


def header_size(headers: list[tuple[str, bytes | None]]) -> int:
    """A record's ``serialized_header_size`` as kafka-python gives it (-1: no headers)."""
    if not headers:
        return -1
    return sum(len(k.encode("utf-8")) + (len(v) if v is not None else 0) for k, v in headers)


def _consumer_record(
    tp: Any,
    epoch: int,
    offset: int,
    timestamp: int,
    timestamp_type: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
    checksum: int | None,
) -> Any:
    return _new_record(
        ConsumerRecord,
        (
            tp.topic,
            tp.partition,
            epoch,
            offset,
            timestamp,
            timestamp_type,
            key,
            value,
            headers,
            checksum,
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            header_size(headers),
        ),
    )


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos`` of any length: (value, position after it)."""
    shift = 0
    raw = 0
    while True:
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes at byte {pos}")


def _read_batch(tp: Any, batch: Any, epoch: int) -> tuple[list[Any], int]:
    """The ConsumerRecords of a v2 batch, and the bytes they took.

    The record layout (Kafka's record format v2): length (varint), attributes (int8), timestamp
    delta (varlong), offset delta (varint), key length (varint) and key, value length (varint)
    and value, header count (varint), then per header a key length, key (UTF-8), value length
    and value. Lengths of -1 stand for null. Varints are zigzag-encoded.
    """
    batch._maybe_uncompress()
    data = bytes(batch._buffer)
    start = pos = batch._pos
    count = batch._num_records
    topic, partition = tp.topic, tp.partition
    base_offset = batch.base_offset
    timestamp_type = batch.timestamp_type
    log_append = timestamp_type == DefaultRecordBatch.LOG_APPEND_TIME
    first_ts = batch.max_timestamp if log_append else batch.first_timestamp
    found: list[Any] = []
    append = found.append
    offset = base_offset
    try:
        for _ in range(count):
            # Each varint: one byte (values -64..63) and two bytes inline, longer ones by
            # _varint (a call per field would add ~0.3 us per record, 15% of this loop; for
            # the record length, 18% of this loop's samples in a profile of records of ~70
            # bytes before it had the two-byte path).
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:  # records of 64 bytes to 8 KiB
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                length = (raw >> 1) ^ -(raw & 1)
                pos += 2
            else:
                length, pos = _varint(data, pos)
            end = pos + length
            pos += 1  # attributes: unused in v2 records
            b = data[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                ts_delta = (raw >> 1) ^ -(raw & 1)
                pos += 2
            else:
                ts_delta, pos = _varint(data, pos)
            b = data[pos]
            if b < 0x80:
                offset = base_offset + ((b >> 1) ^ -(b & 1))
                pos += 1
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                offset = base_offset + ((raw >> 1) ^ -(raw & 1))
                pos += 2
            else:
                delta, pos = _varint(data, pos)
                offset = base_offset + delta
            b = data[pos]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                size, pos = _varint(data, pos)
            if size >= 0:
                key: bytes | None = data[pos : pos + size]
                key_size = size
                pos += size
            else:
                key, key_size = None, -1
            b = data[pos]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                size = (raw >> 1) ^ -(raw & 1)
                pos += 2
            else:
                size, pos = _varint(data, pos)
            if size >= 0:
                value: bytes | None = data[pos : pos + size]
                value_size = size
                pos += size
            else:
                value, value_size = None, -1
            b = data[pos]
            if b == 0:
                headers: list[tuple[str, bytes | None]] = []
                headers_size = -1
                pos += 1
            else:
                headers, pos = _read_headers(data, pos, tp, offset)
                headers_size = header_size(headers)
            if pos != end:
                raise CorruptRecordError(
                    f"Record of partition {_tp_name(tp)} at offset {offset}: its length says "
                    f"{length} bytes, its fields take {length + pos - end}"
                )
            append(
                _new_record(
                    ConsumerRecord,
                    (
                        topic,
                        partition,
                        epoch,
                        offset,
                        first_ts if log_append else first_ts + ts_delta,
                        timestamp_type,
                        key,
                        value,
                        headers,
                        None,
                        key_size,
                        value_size,
                        headers_size,
                    ),
                )
            )
    except (IndexError, ValueError) as exc:
        raise CorruptRecordError(
            f"Record batch of partition {_tp_name(tp)} at offset {base_offset}: cut short or "
            f"garbled after offset {offset} ({exc})"
        ) from exc
    if pos != len(data):
        raise CorruptRecordError(
            f"Record batch of partition {_tp_name(tp)} at offset {base_offset}: "
            f"{len(data) - pos} bytes left after its {count} records"
        )
    return found, pos - start


def _read_headers(
    data: bytes, pos: int, tp: Any, offset: int
) -> tuple[list[tuple[str, bytes | None]], int]:
    count, pos = _varint(data, pos)
    if count < 0:
        raise CorruptRecordError(
            f"Record of partition {_tp_name(tp)} at offset {offset}: {count} headers"
        )
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        size, pos = _varint(data, pos)
        if size < 0:
            raise CorruptRecordError(
                f"Record of partition {_tp_name(tp)} at offset {offset}: a header key of "
                f"length {size}"
            )
        name = data[pos : pos + size].decode("utf-8")
        pos += size
        size, pos = _varint(data, pos)
        if size >= 0:
            headers.append((name, data[pos : pos + size]))
            pos += size
        else:
            headers.append((name, None))
    return headers, pos
