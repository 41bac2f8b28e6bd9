"""The exchange between workers, and each worker's transactions.

**Records of the internal topics** name their partition in their key: ``"<partition>:..."``.
``InternalPartitioner`` reads it there (other topics, the Kafka egress's, keep Kafka's default
partitioning), so the records go through the Kafka egress's bulk path unchanged.

* exchange: key ``<partition>:m``, value a msgpack array of messages (each the checkpoint's
  encoding of a message: ``checkpoint/_codec.py``), in the order they were sent, for key groups
  of that partition. ``ExchangeBatches`` gathers a worker's messages per partition between
  flushes (up to ``EXCHANGE_BATCH_BYTES`` a record): most of the cost of a message that crosses
  workers is per Kafka record (the producer's append, the broker, the reader's decoding), so a
  record carries many. A record is routed whole, in one loop step, by the worker that reads
  it, so a cut never falls inside one and the committed offset is a record's;
* changelog (``_changelog.py``): an address's state, a partition's cut.

**A worker's transactions** (``WorkerTransactions``) are the Kafka egress's exactly-once sink
(``egress/kafka.py``: two producers alternating, records sealed at a cut, handed over in bulk,
a failed transaction failing the worker), with the worker's stable transactional ids and one
difference at the commit: instead of the egress's marker, the transaction carries the offsets
the worker consumed up to the cut, with the consumer group's metadata (KIP-447). A member of an
older generation - a worker that was paused past its session and lost its partitions - has its
commit refused by the broker, and its records are never seen by ``read_committed`` readers.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import msgpack

from statefun.checkpoint._codec import envelope_from_row, envelope_row
from statefun.cluster._config import ClusterConfig
from statefun.egress._kafka_partitioner import KeyPartitioner
from statefun.egress.kafka import KafkaSink, Row
from statefun.runtime._envelope import Envelope

__all__ = [
    "EXCHANGE_BATCH_BYTES",
    "ExchangeBatches",
    "InternalPartitioner",
    "WorkerTransactions",
    "decode_exchange",
    "exchange_row",
    "partition_in_key",
]

#: an exchange record holds messages up to about this many bytes (a larger message goes alone)
EXCHANGE_BATCH_BYTES = 64 * 1024

log = logging.getLogger(__name__)


def partition_in_key(key: bytes) -> int:
    """The partition an internal topic's record key names."""
    return int(key[: key.index(b":")])


#: one packer for the event loop's encodings (``packb`` makes a packer per call)
_PACKER = msgpack.Packer(use_bin_type=True)
_PACK = _PACKER.pack
_ARRAY_HEADER = _PACKER.pack_array_header


class ExchangeBatches:
    """A worker's messages for the exchange, gathered per partition into records (pure: rows
    out, in the order the messages came per partition)."""

    def __init__(self, config: ClusterConfig) -> None:
        self._topic = config.exchange_topic
        parts, max_p = config.partitions, config.max_parallelism
        #: key group -> its partition
        self._partition = [kg * parts // max_p for kg in range(max_p)]
        #: partition -> the packed messages gathered, and their bytes
        self._open: dict[int, list[bytes]] = {}
        self._bytes: dict[int, int] = {}

    def add(self, key_group: int, envelope: Envelope) -> Row | None:
        """Take ``envelope`` for ``key_group``; a record to write now when its partition's
        batch is full."""
        partition = self._partition[key_group]
        packed = _PACK(envelope_row(envelope))
        batch = self._open.get(partition)
        if batch is None:
            self._open[partition] = [packed]
            self._bytes[partition] = len(packed)
            return None
        size = self._bytes[partition] + len(packed)
        if size > EXCHANGE_BATCH_BYTES:
            self._open[partition] = [packed]
            self._bytes[partition] = len(packed)
            return self._row(partition, batch)
        batch.append(packed)
        self._bytes[partition] = size
        return None

    def rows(self) -> list[Row]:
        """The records of every batch gathered; the batches start again empty."""
        if not self._open:
            return []
        batches, self._open, self._bytes = self._open, {}, {}
        return [self._row(partition, messages) for partition, messages in batches.items()]

    def _row(self, partition: int, messages: list[bytes]) -> Row:
        return (
            self._topic,
            f"{partition}:m",
            _ARRAY_HEADER(len(messages)) + b"".join(messages),
            None,
        )


def exchange_row(config: ClusterConfig, key_group: int, envelope: Envelope) -> Row:
    """``envelope`` alone, for the worker that owns ``key_group``, as an exchange record."""
    batches = ExchangeBatches(config)
    batches.add(key_group, envelope)
    (row,) = batches.rows()
    return row


def decode_exchange(value: bytes) -> list[Envelope]:
    """An exchange record's messages, in order. (A record of one message as its bare encoding,
    as exchange records were before they carried batches, is read too.)"""
    rows = msgpack.unpackb(value, raw=False)
    if rows and isinstance(rows[0], str):  # one message: its first field is its typename
        return [envelope_from_row(rows)]
    return [envelope_from_row(row) for row in rows]


class InternalPartitioner(KeyPartitioner):
    """The partition in the key for the job's internal topics; Kafka's default otherwise."""

    def __init__(self, internal: frozenset[str]) -> None:
        super().__init__()
        self._internal = internal

    def remembered(self, topic: str, serialized_key: bytes, count: int) -> int | None:
        if topic in self._internal:
            return partition_in_key(serialized_key)
        return super().remembered(topic, serialized_key, count)

    def partition(
        self,
        topic: str,
        key: Any,
        serialized_key: bytes | None,
        value: Any,
        serialized_value: Any,
        cluster: Any,
    ) -> int:
        if topic in self._internal and serialized_key is not None:
            return partition_in_key(serialized_key)
        return super().partition(topic, key, serialized_key, value, serialized_value, cluster)


class WorkerTransactions(KafkaSink):
    """One worker's transactional writes: exchange messages, changelog records and egress
    records; each checkpoint's sealed with the offsets consumed up to its cut."""

    def __init__(self, config: ClusterConfig) -> None:
        super().__init__(
            f"cluster {config.job_id}/{config.worker_id}",
            config.bootstrap_servers,
            "exactly-once",
            timedelta(milliseconds=config.transaction_timeout_ms),
            {"transactional.id": config.transactional_base},
        )
        partitioner = InternalPartitioner(
            frozenset((config.exchange_topic, config.changelog_topic, config.replies_topic))
        )
        self._plain_config["partitioner"] = partitioner
        self._transactional_config["partitioner"] = partitioner
        #: checkpoint id -> (offsets consumed up to its cut, the group's metadata at the cut)
        self._offsets: dict[int, tuple[dict[Any, Any], Any]] = {}

    def seal(self, checkpoint_id: int, offsets: dict[Any, Any], group_metadata: Any) -> bool:
        """The cut of ``checkpoint_id``: the rows written so far become its transaction, to
        commit with ``offsets`` ({TopicPartition: OffsetAndMetadata}) as a member of the
        group ``group_metadata`` describes. False: nothing to commit (no rows)."""
        self._offsets[checkpoint_id] = (offsets, group_metadata)
        state = self.pre_commit(checkpoint_id)
        sealed = bool(state) and any(
            cid == checkpoint_id for cid, _, _ in state.get("transactions", ())
        )
        if not sealed:
            del self._offsets[checkpoint_id]
        return sealed

    def _send_offsets(
        self, producer: Any, checkpoint_id: int, lineage: str, marker_topic: str
    ) -> None:
        offsets, group_metadata = self._offsets.pop(checkpoint_id, ({}, None))
        if offsets:
            producer.send_offsets_to_transaction(offsets, group_metadata)

    async def close(self) -> None:
        """Abort what is open (rows after the last checkpoint: the next owner of their key
        groups replays them from that checkpoint) and close the producers."""
        waiting = self.backlog()
        if waiting:
            log.debug("%s: %d row(s) after the last checkpoint dropped", self.egress_id, waiting)
        try:
            await self._call(self._producers.close)
        finally:
            self._executor.shutdown(wait=False)
