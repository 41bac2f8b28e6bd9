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
* ``exactly-once`` (``transactional``): a two-phase commit, as Flink's Kafka sink does. Records
  are produced as they come - on each ``flush``, which the job calls every 50 ms - into an
  open Kafka transaction, invisible to
  ``read_committed`` readers. ``pre_commit(N)`` (the cut) seals the records written since the
  previous cut as transaction N: it hands the last of them to N's producer and has it wait for
  the broker's acknowledgements, and it returns every sealed, uncommitted transaction's rows as
  the checkpoint's state. ``commit(N)`` only adds a marker - offset N, with the sink instance's
  random *lineage* id as metadata, for the consumer group ``<base>-commits`` on partition 0 of
  the transaction's first topic - and commits the Kafka transaction.

  **Two producers.** Records written after the cut of N belong to N+1 and must not enter N's
  Kafka transaction (committing N would show them), yet they are produced while N waits for
  its checkpoint. A Kafka producer has one transaction at a time, so the sink keeps two
  transactional producers, *slots* 0 and 1 (``transactional.id`` ``<base>-0`` and
  ``<base>-1``; base: the ``transactional.id`` property, else ``<egress id>-pystatefun``), and
  the transaction that fills after a cut takes the slot that no sealed transaction holds.
  Checkpoints never overlap (N+1 is cut only after N committed), so the slots simply alternate
  and two are enough. If a checkpoint fails after its cut and the job goes on (a savepoint to a
  bad folder), a cut can find both slots sealed: the new transaction's records then wait in
  memory until a commit frees a slot (they are never put into a sealed transaction), and
  ``commit(M)`` commits the sealed transactions up to M one by one, oldest first. A pool of
  producers per checkpoint (Flink's) would do too, but each new transactional id costs an
  ``init_transactions`` and a broker-side entry; ids that are always the same two are also
  the ones the next run must fence.

  Waiting for the acknowledgements at the cut puts every record of N in the log before any of
  N+1 (both producers run on one thread, in call order): a ``read_committed`` reader stops at
  the first record of a transaction still open, so N+1's open transaction cannot hide a late
  record of N once N commits.

  **Recovery.** ``start`` creates both producers; ``init_transactions`` fences a previous
  process's producers with the same ids, aborting their open transactions (N+1's records:
  produced again by the replay) or waiting for a commit that was under way. ``recover(state)``
  then reads the markers: a marker of the same lineage at N or later means transaction N
  reached Kafka (one sink instance commits in checkpoint order); otherwise its rows, from the
  checkpoint, are produced and committed now. kafka-python cannot resume another process's
  transaction, so the marker is what makes a commit that a crash interrupted exactly-once.
  Lineages keep checkpoint ids of different runs apart (ids may start again). A state written
  before the two slots existed (no ``format``) also has the old single id ``<base>`` fenced.

  **Failures.** A producer call or a record that fails in a transaction marks the sink
  failed: nothing more is produced or committed (a new producer would abort the transaction
  and commit the rest without the lost records), and ``commit`` raises, so the job stops and
  restarts from its last checkpoint. ``close`` aborts transactions still open, with the
  producers' own epoch, so a zombie never fences a newer run.

The producers are blocking: every producer call runs on one dedicated thread, in call order.
The plain producer (at-least-once, none) is librdkafka's where the properties allow it
(``_kafka_librdkafka.py``: its threads batch and send in C); the transactional ones, and the
plain one otherwise, are kafka-python's. Records go to a kafka-python producer a list at a
time, appended to its batches in one pass with one outcome per batch
(``statefun.egress._kafka_append``), not a ``send`` and a future per record; the producers and
their transactions are ``_kafka_producers.py``, what runs on that thread.
See docs/kafka.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

from google.protobuf.message import DecodeError

from statefun._compiled import hot_loops
from statefun._exceptions import ConfigurationError
from statefun._kafka import DEAD_LETTER_TOPIC, import_kafka, kafka_client_config
from statefun._kafka._dead_letters import headers
from statefun._kafka._yaml import parse_egress
from statefun.connectors import ConnectorContext, ConnectorKind
from statefun.egress._kafka_producers import SLOTS, Producers, Row, Transaction
from statefun.egress.base import EgressRecord, Sink
from statefun.module._specs import KafkaEgressSpec
from statefun.sdk._proto import egress_pb2
from statefun.sdk._wire import ONE_BYTE, varint

__all__ = ["KAFKA_PRODUCER_RECORD", "KIND", "KafkaSink", "Row"]

log = logging.getLogger(__name__)

KAFKA_PRODUCER_RECORD = "type.googleapis.com/io.statefun.sdk.egress.KafkaProducerRecord"

Semantic = Literal["at-least-once", "exactly-once", "none"]
_T = TypeVar("_T")
#: ``linger.ms`` and ``batch.size`` unless the egress's properties set them. With
#: kafka-python's defaults (0 ms, 16 KiB) under load, ``send`` woke the sender thread every
#: 2nd-3rd record: 19-25 us of CPU per record against 12.5 us with these
#: (bench/kafka_producer.py). The linger costs no latency with a delivery semantic: ``flush``
#: (at-least-once) and the cut (exactly-once) send everything at once.
DEFAULT_LINGER_MS = 20
DEFAULT_BATCH_BYTES = 256 * 1024
_parse_record = egress_pb2.KafkaProducerRecord.FromString
_parse_run = egress_pb2.KafkaProducerRecordRun.FromString
#: KafkaSink.write_many's usual case, compiled (statefun/_hotloops.c), when built
_kafka_rows: Callable[[list[Any], str], list[Row] | None] | None = (
    None if hot_loops is None else hot_loops.kafka_rows
)
#: The exactly-once checkpoint state's ``format``: 2, one transactional id per slot.
_STATE_FORMAT = 2


@dataclass
class _Sealed:
    """An exactly-once transaction sealed at a cut and not committed yet."""

    lineage: str
    rows: list[Row]
    #: the producer slot whose open Kafka transaction holds the rows; None: none yet (no slot
    #: was free), they are produced at the commit
    slot: int | None
    #: the producer thread's work that produces the last rows and waits for their acks
    sent: concurrent.futures.Future[None] | None


class KafkaSink(Sink):
    """Produces to Kafka on a dedicated thread: with librdkafka or kafka-python (at-least-once,
    none), with kafka-python's transactions (exactly-once)."""

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
        #: the base of the producers' transactional ids (and of the marker group's name)
        self.transactional_id = props.get("transactional.id") or f"{egress_id}-pystatefun"
        self.commit_group = f"{self.transactional_id}-commits"
        config = kafka_client_config(props, kafka.KafkaProducer.DEFAULT_CONFIG, owner=owner)
        config.pop("transactional_id", None)
        config["bootstrap_servers"] = bootstrap_servers
        config.setdefault("linger_ms", DEFAULT_LINGER_MS)
        config.setdefault("batch_size", DEFAULT_BATCH_BYTES)
        from statefun.egress._kafka_partitioner import KeyPartitioner  # imports kafka

        config["partitioner"] = KeyPartitioner()
        self._plain_config = config
        self._transactional_config = {
            **config,
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
        self._buffer: list[Row] = []  # written, not handed to a producer yet
        self._in_flight: list[Row] = []  # at-least-once: being produced by flush
        # exactly-once, event-loop side. The lineage is this instance's: within it, checkpoint
        # ids only grow and commit in order.
        self._lineage = uuid.uuid4().hex
        self._open: list[Row] = []  # the filling transaction's rows handed to its producer
        self._slot: int | None = 0  # the filling transaction's producer slot; None: none free
        self._pending: dict[int, _Sealed] = {}  # sealed, not committed yet: by checkpoint id
        # the plain producer's records sent by librdkafka where the properties allow it
        # (imported only then: an exactly-once egress, as a cluster worker's, never loads it)
        send_config: dict[str, Any] | str = "exactly-once sends in Kafka transactions"
        if not self.transactional:
            from statefun.egress._kafka_librdkafka import produce_config

            send_config = produce_config(
                bootstrap_servers,
                props,
                owner,
                int(config["linger_ms"]),
                int(config["batch_size"]),
            )
        #: the producers and their transactions: the producer thread's own
        self._producers = Producers(
            egress_id,
            bootstrap_servers,
            self.transactional_id,
            self._plain_config,
            self._transactional_config,
            self._consumer_config,
            self._send_offsets,
            send_config,
        )
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
        return len(self._buffer) + len(self._open) + self.uncommitted

    @property
    def uncommitted(self) -> int:
        """Records in sealed transactions that are not committed yet (exactly-once)."""
        return sum(len(sealed.rows) for sealed in self._pending.values())

    # -- write ------------------------------------------------------------------------------------

    def write(self, record: EgressRecord) -> None:
        self.write_many([record.value])

    def write_many(self, values: list[Any]) -> None:
        """Decode ``values`` into rows for the producer thread, in order; a value that is
        not a KafkaProducerRecord with a topic is rejected (``_reject``).

        The usual case, every value a KafkaProducerRecord, is parsed in one step: the values
        joined as the repeated field of a ``KafkaProducerRecordRun`` (each behind its tag and
        length; a record parses the same inside it as alone), about half the CPU of a parse per
        record. Anything else, or a run that does not parse, goes record by record. When
        built, the same loop compiled (``statefun/_hotloops.c``: ``kafka_rows``) reads the
        usual case first and leaves everything else to the code here."""
        if _kafka_rows is not None:
            rows = _kafka_rows(values, KAFKA_PRODUCER_RECORD)
            if rows is not None:
                self._buffer.extend(rows)
                return
        parts: list[Any] = []
        extend = parts.extend
        one_byte = ONE_BYTE
        for typed in values:
            if typed.typename != KAFKA_PRODUCER_RECORD:
                break
            value = typed.value
            n = len(value)
            extend((b"\x0a", one_byte[n] if n < 128 else varint(n), value))
        else:
            try:
                run = _parse_run(b"".join(parts)).records
            except (DecodeError, TypeError):
                pass  # (which one: the records one by one tell)
            else:
                buffer = self._buffer
                for typed, message in zip(values, run, strict=True):
                    topic = message.topic  # each field read builds a new object: once each
                    if not topic:
                        self._reject(typed, "the KafkaProducerRecord has no topic")
                        continue
                    buffer.append((topic, message.key or None, message.value_bytes, None))
                return
        self._write_each(values)

    def _write_each(self, values: list[Any]) -> None:
        buffer = self._buffer
        for typed in values:
            if typed.typename != KAFKA_PRODUCER_RECORD:
                self._reject(
                    typed,
                    f"a {typed.typename} is not a KafkaProducerRecord (kafka_egress_message)",
                )
                continue
            value = typed.value
            try:
                message = _parse_record(value if type(value) is bytes else bytes(value))
            except (DecodeError, TypeError):
                self._reject(typed, "the KafkaProducerRecord cannot be decoded")
                continue
            topic = message.topic
            if not topic:
                self._reject(typed, "the KafkaProducerRecord has no topic")
                continue
            buffer.append((topic, message.key or None, message.value_bytes, None))

    def write_rows(self, rows: list[Row]) -> None:
        """Records already in the producer's terms (topic, key, value, headers), in order."""
        self._buffer.extend(rows)

    def _reject(self, typed: Any, reason: str) -> None:
        self.rejected += 1
        log.error("egress %s: record skipped: %s", self.egress_id, reason)
        if self.dead_letter_topic is not None:
            extra = headers(egress=self.egress_id, typename=typed.typename, reason=reason)
            self._buffer.append((self.dead_letter_topic, None, bytes(typed.value), extra))

    # -- the producer thread ----------------------------------------------------------------------

    async def start(self) -> None:
        if self.transactional:
            # init_transactions takes seconds the first time: pay it at start, not at the
            # first commit (and fail early if the broker cannot be reached). It also fences the
            # previous run's producers, aborting the transactions they left open.
            await self._call(self._producers.init_transactional)

    def _call(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _send_offsets(
        self, producer: Any, checkpoint_id: int, lineage: str, marker_topic: str
    ) -> None:
        """The offsets transaction ``checkpoint_id`` commits with its records (on the producer
        thread, from ``Producers.tx_commit``): the marker that says it reached Kafka
        (``recover``)."""
        kafka = import_kafka()
        marker = kafka.TopicPartition(marker_topic, 0)
        offsets = {marker: kafka.structs.OffsetAndMetadata(checkpoint_id, lineage, -1)}
        producer.send_offsets_to_transaction(offsets, self.commit_group)

    # -- flush and close --------------------------------------------------------------------------

    async def flush(self) -> None:
        if self.transactional:
            await self._produce_open()
            return
        if not self._buffer:
            return
        rows, self._buffer = self._buffer, []
        if self.semantic == "none":
            await self._call(self._producers.produce, rows, False)
            self.produced += len(rows)
            return
        self._in_flight = rows
        try:
            await self._call(self._producers.produce, rows, True)
        except BaseException:
            self._buffer[:0] = rows  # produced again by the next flush: at least once
            raise
        finally:
            self._in_flight = []
        self.produced += len(rows)

    async def _produce_open(self) -> None:
        """Exactly-once: hand the new records to the filling transaction's producer (they
        stay in memory too, for the checkpoint)."""
        slot = self._slot
        if slot is None or not self._buffer:
            return
        rows, self._buffer = self._buffer, []
        self._open.extend(rows)  # a copy: the producer thread reads ``rows``
        await self._call(self._producers.tx_send, slot, rows, False)

    async def close(self) -> None:
        try:
            if self.transactional:
                waiting = self.backlog()
                if waiting:
                    log.info(
                        "egress %s: %d record(s) of uncommitted transactions not committed; "
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
            await self._call(self._producers.close)
        finally:
            self._executor.shutdown(wait=False)

    # -- checkpoints ------------------------------------------------------------------------------

    def _free_slot(self) -> int | None:
        used = {sealed.slot for sealed in self._pending.values()}
        used.add(self._slot)
        return next((slot for slot in SLOTS if slot not in used), None)

    def _next_slot(self) -> int | None:
        """A slot for the filling transaction: a free one, unless a sealed transaction waits
        for one (it must get the first: it commits first)."""
        if any(sealed.slot is None for sealed in self._pending.values()):
            return None
        return self._free_slot()

    def unsealed(self) -> int:
        return len(self._open) + len(self._buffer) if self.transactional else 0

    def pre_commit(self, checkpoint_id: int) -> Any:
        if not self.transactional:
            unacknowledged = self._in_flight + self._buffer
            return {"records": unacknowledged} if unacknowledged else None
        if self._open or self._buffer:
            rows = self._open + self._buffer
            tail, self._buffer = self._buffer, []
            self._open = []
            slot = self._slot
            sent = None
            if slot is not None:
                # The last rows of N, then the acknowledgements of all of N: on the producer
                # thread, before anything of N+1 (no I/O here).
                sent = self._executor.submit(self._producers.tx_send, slot, tail, True)
            self._pending[checkpoint_id] = _Sealed(self._lineage, rows, slot, sent)
            self._slot = self._next_slot()
        if not self._pending:
            return None
        return {
            "format": _STATE_FORMAT,
            "transactions": [
                [cid, sealed.lineage, sealed.rows] for cid, sealed in sorted(self._pending.items())
            ],
        }

    async def commit(self, checkpoint_id: int) -> None:
        for cid in sorted(c for c in self._pending if c <= checkpoint_id):
            sealed = self._pending[cid]
            if sealed.sent is not None:
                await asyncio.wrap_future(sealed.sent)
            unsent: list[Row] = []
            if sealed.slot is None:
                sealed.slot = self._free_slot()
                if sealed.slot is None:  # cannot happen: the older ones are committed
                    raise RuntimeError(f"egress {self.egress_id}: no producer for {cid}")
                unsent = sealed.rows
            marker_topic = sealed.rows[0][0]
            await self._call(
                self._producers.tx_commit, sealed.slot, cid, sealed.lineage, marker_topic, unsent
            )
            del self._pending[cid]
            self.produced += len(sealed.rows)
            log.debug(
                "egress %s: transaction %d committed (%d record(s))",
                self.egress_id,
                cid,
                len(sealed.rows),
            )
        if self._slot is None:
            self._slot = self._next_slot()

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
            await self._call(self._producers.produce, records, True)
        transactions: list[Transaction] = [
            (int(cid), str(lineage), [_row(r) for r in rows])
            for cid, lineage, rows in state.get("transactions") or []
            if rows
        ]
        if not transactions:
            return
        slot = self._free_slot()
        if slot is None:
            raise RuntimeError(f"egress {self.egress_id}: recover() after a checkpoint's cut")
        legacy = "format" not in state
        committed = await self._call(
            self._producers.recover_transactions, transactions, slot, legacy
        )
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


# -- the connector kind ---------------------------------------------------------------------------


def _build(spec: KafkaEgressSpec, context: ConnectorContext) -> KafkaSink:
    return KafkaSink.from_spec(spec)


def _label(spec: KafkaEgressSpec) -> str:
    return f"kafka egress {spec.id}\n{spec.delivery_semantic}"


KIND = ConnectorKind(
    "io.statefun.kafka.v1/egress",
    "egress",
    KafkaEgressSpec,
    parse_egress,
    _build,
    _label,
    strict=False,
)
