"""The exchange between workers, and each worker's transactions.

**Records of the internal topics** name their partition in their key: ``"<partition>:..."``.
``InternalPartitioner`` reads it there (other topics, the Kafka egress's, keep Kafka's default
partitioning), so the records go through the Kafka egress's bulk path unchanged.

* exchange: key ``<partition>:<typename>\\x1f<id>``, value the message (msgpack, the
  checkpoint's encoding of a message: ``checkpoint/_codec.py``);
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
    "InternalPartitioner",
    "WorkerTransactions",
    "decode_message",
    "decode_messages",
    "exchange_row",
    "partition_in_key",
]

_SEPARATOR = "\x1f"

log = logging.getLogger(__name__)


def partition_in_key(key: bytes) -> int:
    """The partition an internal topic's record key names."""
    return int(key[: key.index(b":")])


#: one packer for the event loop's encodings (``packb`` makes a packer per call)
_PACK = msgpack.Packer(use_bin_type=True).pack


def exchange_row(config: ClusterConfig, key_group: int, envelope: Envelope) -> Row:
    """``envelope``, for the worker that owns ``key_group``, as an exchange record."""
    key = f"{key_group * config.partitions // config.max_parallelism}:{envelope.typename}"
    return (
        config.exchange_topic,
        f"{key}{_SEPARATOR}{envelope.id}",
        _PACK(envelope_row(envelope)),
        None,
    )


def decode_message(value: bytes) -> Envelope:
    """An exchange record's value as the message it carries."""
    return envelope_from_row(msgpack.unpackb(value, raw=False))


def decode_messages(values: list[bytes]) -> list[Envelope]:
    """Exchange records' values as their messages, in order (one unpacker for them all)."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(1 << 20, 2 * sum(map(len, values))))
    unpacker.feed(b"".join(values))
    return [envelope_from_row(row) for row in unpacker]


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
