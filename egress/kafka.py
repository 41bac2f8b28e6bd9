"""``io.statefun.kafka.v1/egress``: records that functions built with ``kafka_egress_message``.

Each record is a typed value ``type.googleapis.com/io.statefun.sdk.egress.KafkaProducerRecord``
(topic, key, value bytes), produced as StateFun's generic Kafka egress does: an empty key is
no key. A record that is not one is logged and sent to the dead-letter topic if
``pystatefun.dead-letter.topic`` is set; it never stops the job.

``deliverySemantic``:

* ``none``: produced on ``flush`` without waiting for acknowledgements.
* ``at-least-once``: produced on ``flush``, which waits for the acknowledgements (a failure
  raises, and the job stops). ``pre_commit`` returns the records not acknowledged yet and
  ``recover`` produces them again (for a coordinator that calls them on non-transactional
  sinks; today's calls them only on transactional ones, see docs/kafka.md).
* ``exactly-once`` (``transactional``): records wait for the checkpoint. ``pre_commit(N)`` seals
  those written since the last cut as transaction N and returns every sealed, uncommitted
  transaction as the checkpoint's state. ``commit(N)`` produces each of them, oldest first, in
  one Kafka transaction (``transactional.id``: the property, else ``<egress id>-pystatefun``)
  that also commits a marker - offset N, with the sink instance's random *lineage* id as its
  metadata - for the consumer group ``<transactional id>-commits`` on partition 0 of the
  transaction's first topic. ``recover(state)`` reads the markers: a marker of the same lineage
  at N or later means transaction N reached Kafka (one sink instance commits in checkpoint
  order); otherwise it is produced and committed now. kafka-python cannot resume another
  process's transaction, so the marker is what makes a commit that a crash interrupted
  exactly-once. Lineages keep checkpoint ids of different runs apart (ids may start again).

kafka-python is blocking: every producer call runs on one dedicated thread, in call order.
See docs/kafka.md.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Literal, TypeVar

from google.protobuf.message import DecodeError

from statefun._exceptions import ConfigurationError
from statefun.egress.base import EgressRecord, Sink
from statefun.ingress.kafka import DEAD_LETTER_TOPIC, import_kafka, kafka_client_config
from statefun.module._specs import KafkaEgressSpec
from statefun.sdk._proto import egress_pb2

__all__ = ["KAFKA_PRODUCER_RECORD", "KafkaSink"]

log = logging.getLogger(__name__)

KAFKA_PRODUCER_RECORD = "type.googleapis.com/io.statefun.sdk.egress.KafkaProducerRecord"

#: One record to produce: topic, key (None: no key), value, headers (None: none).
Row = tuple[str, str | None, bytes, list[tuple[str, bytes]] | None]
#: A sealed exactly-once transaction: checkpoint id, lineage (the sealing sink's id), rows.
Transaction = tuple[int, str, list[Row]]
Semantic = Literal["at-least-once", "exactly-once", "none"]
_T = TypeVar("_T")
_SEND_TIMEOUT_S = 120.0


class KafkaSink(Sink):
    """Produces to Kafka with kafka-python on a dedicated thread."""

    def __init__(
        self,
        egress_id: str,
        bootstrap_servers: str,
        delivery_semantic: Semantic = "at-least-once",
        transaction_timeout: timedelta = timedelta(minutes=15),
        properties: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(egress_id)
        if delivery_semantic not in ("at-least-once", "exactly-once", "none"):
            raise ConfigurationError(
                f"egress {egress_id}: unknown delivery semantic {delivery_semantic!r}"
            )
        owner = f"egress {egress_id}"
        props = dict(properties or {})
        kafka = import_kafka()
        self.bootstrap_servers = bootstrap_servers
        self.semantic: Semantic = delivery_semantic
        self.transactional = delivery_semantic == "exactly-once"
        self.dead_letter_topic = props.get(DEAD_LETTER_TOPIC) or None
        self.transactional_id = props.get("transactional.id") or f"{egress_id}-pystatefun"
        self.commit_group = f"{self.transactional_id}-commits"
        config = kafka_client_config(props, kafka.KafkaProducer.DEFAULT_CONFIG, owner=owner)
        config.pop("transactional_id", None)
        config["bootstrap_servers"] = bootstrap_servers
        self._plain_config = config
        self._transactional_config = {
            **config,
            "transactional_id": self.transactional_id,
            "enable_idempotence": True,
            "acks": "all",
            "transaction_timeout_ms": int(transaction_timeout.total_seconds() * 1000),
        }
        self._consumer_config = kafka_client_config(
            props, kafka.KafkaConsumer.DEFAULT_CONFIG, owner=owner, warn=False
        )
        self._consumer_config.update(
            bootstrap_servers=bootstrap_servers,
            group_id=self.commit_group,
            enable_auto_commit=False,
        )
        self._buffer: list[Row] = []
        self._in_flight: list[Row] = []  # at-least-once: being produced by flush
        # exactly-once: sealed, not committed yet: checkpoint id -> (lineage, rows). The lineage
        # is this instance's: within it, checkpoint ids only grow and commit in order.
        self._lineage = uuid.uuid4().hex
        self._pending: dict[int, tuple[str, list[Row]]] = {}
        self._producers: dict[bool, Any] = {}  # transactional? -> KafkaProducer
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"kafka-sink-{egress_id}")
        self.produced = 0
        self.rejected = 0

    @classmethod
    def from_spec(cls, spec: KafkaEgressSpec) -> KafkaSink:
        return cls(
            spec.id,
            spec.address,
            spec.delivery_semantic,
            spec.transaction_timeout,
            spec.properties,
        )

    def describe(self) -> str:
        return f"KafkaSink({self.egress_id}, {self.semantic})"

    def backlog(self) -> int:
        return len(self._buffer) + self.uncommitted

    @property
    def uncommitted(self) -> int:
        """Records in sealed transactions that are not committed yet (exactly-once)."""
        return sum(len(rows) for _, rows in self._pending.values())

    # -- write ------------------------------------------------------------------------------------

    def write(self, record: EgressRecord) -> None:
        typed = record.value
        typename = str(typed.typename)
        if typename != KAFKA_PRODUCER_RECORD:
            self._reject(typed, f"a {typename} is not a KafkaProducerRecord (kafka_egress_message)")
            return
        try:
            message = egress_pb2.KafkaProducerRecord.FromString(bytes(typed.value))
        except DecodeError:
            self._reject(typed, "the KafkaProducerRecord cannot be decoded")
            return
        if not message.topic:
            self._reject(typed, "the KafkaProducerRecord has no topic")
            return
        self._buffer.append((message.topic, message.key or None, bytes(message.value_bytes), None))

    def _reject(self, typed: Any, reason: str) -> None:
        self.rejected += 1
        log.error("egress %s: record skipped: %s", self.egress_id, reason)
        if self.dead_letter_topic is not None:
            headers = [
                ("pystatefun.egress", self.egress_id.encode()),
                ("pystatefun.typename", str(typed.typename).encode()),
                ("pystatefun.reason", reason.encode()),
            ]
            self._buffer.append((self.dead_letter_topic, None, bytes(typed.value), headers))

    # -- the producer thread ----------------------------------------------------------------------

    async def start(self) -> None:
        if self.transactional:
            # init_transactions takes seconds the first time: pay it at start, not at the
            # first commit (and fail early if the broker cannot be reached).
            await self._call(self._producer, True)

    def _call(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _producer(self, transactional: bool) -> Any:
        producer = self._producers.get(transactional)
        if producer is None:
            kafka = import_kafka()
            config = self._transactional_config if transactional else self._plain_config
            try:
                producer = kafka.KafkaProducer(**config)
            except kafka.errors.KafkaError as exc:
                raise ConnectionError(
                    f"egress {self.egress_id}: cannot reach Kafka at {self.bootstrap_servers}: "
                    f"{exc}"
                ) from exc
            if transactional:
                # Fences an older producer with this id; aborts its open transaction, or waits
                # until its prepared commit is complete.
                producer.init_transactions()
            self._producers[transactional] = producer
        return producer

    def _drop_producer(self, transactional: bool) -> None:
        producer = self._producers.pop(transactional, None)
        if producer is not None:
            try:
                producer.close(timeout=5)
            except Exception as exc:
                log.debug("egress %s: closing a failed producer: %s", self.egress_id, exc)

    @staticmethod
    def _send(producer: Any, row: Row | list[Any]) -> Any:
        topic, key, value, headers = row
        return producer.send(
            topic,
            key=None if key is None else key.encode("utf-8"),
            value=bytes(value),
            headers=None if headers is None else [(str(n), bytes(v)) for n, v in headers],
        )

    def _produce(self, rows: list[Row], wait: bool) -> None:
        producer = self._producer(False)
        if not wait:
            failed = 0
            for row in rows:
                try:
                    self._send(producer, row)
                except Exception:
                    failed += 1
            if failed:
                log.error("egress %s: %d record(s) dropped (semantic none)", self.egress_id, failed)
            return
        futures = [self._send(producer, row) for row in rows]
        producer.flush(timeout=_SEND_TIMEOUT_S)
        errors = []
        for future in futures:
            try:
                future.get(timeout=0)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise ConnectionError(
                f"egress {self.egress_id}: {len(errors)} of {len(rows)} record(s) not "
                f"acknowledged by Kafka: {errors[0]!r}"
            )

    def _commit_transaction(self, checkpoint_id: int, lineage: str, rows: list[Row]) -> None:
        kafka = import_kafka()
        producer = self._producer(True)
        marker = kafka.TopicPartition(rows[0][0], 0)
        try:
            producer.begin_transaction()
            for row in rows:
                self._send(producer, row)
            offsets = {marker: kafka.structs.OffsetAndMetadata(checkpoint_id, lineage, -1)}
            producer.send_offsets_to_transaction(offsets, self.commit_group)
            producer.commit_transaction()
        except Exception:
            # The next producer's init_transactions aborts whatever this one left open.
            self._drop_producer(True)
            raise

    def _recover_transactions(self, transactions: list[Transaction]) -> int:
        """Commit the transactions (oldest first) that did not reach Kafka; how many."""
        kafka = import_kafka()
        self._producer(True)  # init_transactions first: a commit in progress completes
        consumer = kafka.KafkaConsumer(**self._consumer_config)
        try:
            markers = {}
            for topic in {rows[0][0] for _, _, rows in transactions}:
                markers[topic] = consumer.committed(kafka.TopicPartition(topic, 0), metadata=True)
        finally:
            consumer.close(autocommit=False)
        # Transactions commit in order: the newest one whose marker shows it in Kafka, and
        # every older one, are done. Only markers of the same lineage are compared, so ids that
        # start again from 1 (a fresh checkpoint folder, another run) cannot pass for done.
        done = 0
        for index in range(len(transactions) - 1, -1, -1):
            cid, lineage, rows = transactions[index]
            found = markers[rows[0][0]]
            if found is not None and found.metadata == lineage and found.offset >= cid:
                done = index + 1
                break
        for cid, lineage, rows in transactions[done:]:
            self._commit_transaction(cid, lineage, rows)
        return len(transactions) - done

    def _close_producers(self) -> None:
        for transactional in list(self._producers):
            producer = self._producers.pop(transactional)
            producer.close(timeout=10)

    # -- flush and close --------------------------------------------------------------------------

    async def flush(self) -> None:
        if self.transactional or not self._buffer:
            return
        rows, self._buffer = self._buffer, []
        if self.semantic == "none":
            await self._call(self._produce, rows, False)
            self.produced += len(rows)
            return
        self._in_flight = rows
        try:
            await self._call(self._produce, rows, True)
        except BaseException:
            self._buffer[:0] = rows  # produced again by the next flush: at least once
            raise
        finally:
            self._in_flight = []
        self.produced += len(rows)

    async def close(self) -> None:
        try:
            if self.transactional:
                waiting = len(self._buffer) + self.uncommitted
                if waiting:
                    log.info(
                        "egress %s: %d record(s) of uncommitted transactions not produced; "
                        "after a restart they are recovered or produced again",
                        self.egress_id,
                        waiting,
                    )
            else:
                try:
                    await self.flush()
                except Exception as exc:
                    log.error(
                        "egress %s: %d record(s) not delivered at close: %s",
                        self.egress_id,
                        len(self._buffer),
                        exc,
                    )
            await self._call(self._close_producers)
        finally:
            self._executor.shutdown(wait=False)

    # -- checkpoints ------------------------------------------------------------------------------

    def pre_commit(self, checkpoint_id: int) -> Any:
        if not self.transactional:
            unacknowledged = self._in_flight + self._buffer
            return {"records": unacknowledged} if unacknowledged else None
        if self._buffer:
            self._pending[checkpoint_id] = (self._lineage, self._buffer)
            self._buffer = []
        if not self._pending:
            return None
        return {
            "transactions": [
                [cid, lineage, rows] for cid, (lineage, rows) in sorted(self._pending.items())
            ]
        }

    async def commit(self, checkpoint_id: int) -> None:
        for cid in sorted(c for c in self._pending if c <= checkpoint_id):
            lineage, rows = self._pending[cid]
            await self._call(self._commit_transaction, cid, lineage, rows)
            del self._pending[cid]
            self.produced += len(rows)
            log.debug(
                "egress %s: transaction %d committed (%d record(s))", self.egress_id, cid, len(rows)
            )

    async def recover(self, state: Any) -> None:
        if not state:
            return
        if not isinstance(state, dict):
            raise ConfigurationError(f"egress {self.egress_id}: unknown checkpoint state")
        records = [_row(r) for r in state.get("records") or []]
        if records:
            log.info(
                "egress %s: producing %d record(s) not acknowledged at the checkpoint",
                self.egress_id,
                len(records),
            )
            await self._call(self._produce, records, True)
        transactions: list[Transaction] = [
            (int(cid), str(lineage), [_row(r) for r in rows])
            for cid, lineage, rows in state.get("transactions") or []
            if rows
        ]
        if not transactions:
            return
        committed = await self._call(self._recover_transactions, transactions)
        for cid, _, _ in transactions:
            self._pending.pop(cid, None)
        log.info(
            "egress %s: recovered transaction(s) %s: %d committed now, %d had reached Kafka",
            self.egress_id,
            ", ".join(str(t[0]) for t in transactions),
            committed,
            len(transactions) - committed,
        )


def _row(row: Any) -> Row:
    """A row from a checkpoint (msgpack turns tuples into lists)."""
    topic, key, value, headers = row
    return (
        str(topic),
        None if key is None else str(key),
        bytes(value),
        None if headers is None else [(str(n), bytes(v)) for n, v in headers],
    )
