"""The Kafka sink's producers and their transactions, on the sink's producer thread.

``KafkaSink`` (``kafka.py``) keeps the records and the checkpoint protocol on the event loop
and hands every producer call to one thread, in call order; this is what runs there: a plain
producer (at-least-once, none) and the two transactional producers of the exactly-once
slots, records handed over a list at a time (``_kafka_append.py``; the plain producer's to
librdkafka where the properties allow it, ``_kafka_librdkafka.py``), transactions begun,
sealed (acknowledged), committed with their marker, aborted at close, and the recovery of
sealed transactions from a checkpoint. See the docstring of ``kafka.py`` for the protocol.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from statefun._exceptions import UnavailableError
from statefun._kafka import import_kafka
from statefun._kafka._throttle import Throttle

if TYPE_CHECKING:
    from statefun.egress._kafka_librdkafka import Sender

__all__ = ["SLOTS", "Producers", "Row", "Transaction"]

log = logging.getLogger("statefun.egress.kafka")

#: One record to produce: topic, key (None: no key), value (None: a tombstone, for compacted
#: topics), headers (None: none).
Row = tuple[str, str | None, bytes | None, list[tuple[str, bytes]] | None]
#: A sealed exactly-once transaction: checkpoint id, lineage (the sealing sink's id), rows.
Transaction = tuple[int, str, list[Row]]
#: the exactly-once producer slots (``transactional.id`` ``<base>-0`` and ``<base>-1``)
SLOTS = (0, 1)
_SEND_TIMEOUT_S = 120.0
#: How long ``close`` waits for the abort of a transaction still open.
_ABORT_TIMEOUT_S = 5.0


class Producers:
    """The producers of one Kafka sink. Every method runs on the sink's producer thread."""

    def __init__(
        self,
        egress_id: str,
        bootstrap_servers: str,
        transactional_id: str,
        plain_config: dict[str, Any],
        transactional_config: dict[str, Any],
        consumer_config: dict[str, Any],
        send_offsets: Callable[[Any, int, str, str], None],
        send_config: dict[str, Any] | str,
    ) -> None:
        self.egress_id = egress_id
        self.bootstrap_servers = bootstrap_servers
        #: the base of the producers' transactional ids (and of the marker group's name)
        self.transactional_id = transactional_id
        self.transactional_ids = tuple(f"{transactional_id}-{slot}" for slot in SLOTS)
        self.commit_group = consumer_config["group_id"]
        self._plain_config = plain_config
        self._transactional_config = transactional_config
        self._consumer_config = consumer_config
        #: (producer, checkpoint id, lineage, marker topic): the offsets a transaction commits
        #: with its records (the sink's, which subclasses may replace)
        self._send_offsets = send_offsets
        self.plain: Any = None  # KafkaProducer (at-least-once, none)
        #: librdkafka's settings for the plain producer's records, or why kafka-python sends
        #: them (_kafka_librdkafka.py)
        self._send_config = send_config
        self.sender: Sender | None = None  # the plain producer on librdkafka
        #: semantic none: records that failed, one line per 10 s at most
        self._dropped = Throttle()
        self._dropped_reason = ""  # the last failure's
        self._tx_producers: list[Any] = [None for _ in SLOTS]  # KafkaProducer per slot
        self._tx_open = [False for _ in SLOTS]  # a transaction begun, not committed
        self._tx_sent: list[Any] = [None for _ in SLOTS]  # Delivery of each open transaction
        # (producer, its BulkAppender) by id(producer); a producer without one: send_each
        self._appenders: dict[int, tuple[Any, Any]] = {}
        self._failed: BaseException | None = None  # a transaction failed: nothing more commits

    def _new_producer(self, config: dict[str, Any]) -> Any:
        kafka = import_kafka()
        from statefun.egress._kafka_append import BulkAppender, bulk_supported

        try:
            producer = kafka.KafkaProducer(**config)
        except kafka.errors.KafkaError as exc:
            raise UnavailableError(
                f"egress {self.egress_id}: cannot reach Kafka at {self.bootstrap_servers}: {exc}"
            ) from exc
        unsupported = bulk_supported(producer)
        if unsupported is None:
            self._appenders[id(producer)] = (
                producer,
                BulkAppender(producer, config["partitioner"]),
            )
        else:
            log.warning(
                "egress %s: records go to Kafka one send() at a time (slower): %s",
                self.egress_id,
                unsupported,
            )
        return producer

    def _hand_over(self, producer: Any, rows: list[Row]) -> Any:
        """``rows`` to ``producer``: their Delivery (statefun.egress._kafka_append)."""
        from statefun.egress._kafka_append import send_each

        entry = self._appenders.get(id(producer))
        if entry is None or entry[0] is not producer:
            return send_each(producer, rows)
        return entry[1].append(rows)

    def _plain_producer(self) -> Any:
        if self.plain is None:
            self.plain = self._new_producer(self._plain_config)
            log.info(
                "egress %s: records sent by kafka-python: %s", self.egress_id, self._send_config
            )
        return self.plain

    def _transactional_producer(self, transactional_id: str) -> Any:
        """A producer with ``transactional_id`` after ``init_transactions``: that fences an
        older producer with this id, aborts its open transaction, or waits until its prepared
        commit is complete."""
        producer = self._new_producer(
            {**self._transactional_config, "transactional_id": transactional_id}
        )
        try:
            producer.init_transactions()
        except BaseException:
            _close_quietly(producer, 0)
            raise
        return producer

    def _tx_producer(self, slot: int) -> Any:
        if self._failed is not None:
            raise ConnectionError(
                f"egress {self.egress_id}: a Kafka transaction failed: nothing more is "
                f"committed until the job restarts from its checkpoint ({self._failed!r})"
            ) from self._failed
        producer = self._tx_producers[slot]
        if producer is None:
            producer = self._transactional_producer(self.transactional_ids[slot])
            self._tx_producers[slot] = producer
        return producer

    def init_transactional(self) -> None:
        for slot in SLOTS:
            self._tx_producer(slot)

    def _begin(self, slot: int) -> Any:
        """Slot ``slot``'s producer, in a transaction."""
        producer = self._tx_producer(slot)
        if not self._tx_open[slot]:
            from statefun.egress._kafka_append import Delivery

            producer.begin_transaction()
            self._tx_open[slot] = True
            self._tx_sent[slot] = Delivery()
        return producer

    def _tx_wait(self, producer: Any, slot: int) -> None:
        """Wait until the broker acknowledged every record of slot ``slot``'s transaction."""
        from statefun.egress._kafka_append import flush

        failures = flush(producer, self._tx_sent[slot], _SEND_TIMEOUT_S)
        if failures:
            raise ConnectionError(
                f"egress {self.egress_id}: {sum(n for _, n in failures)} record(s) of a "
                f"transaction not acknowledged by Kafka: {failures[0][0]!r}"
            )

    def tx_send(self, slot: int, rows: list[Row], wait: bool) -> None:
        """Produce ``rows`` into slot ``slot``'s transaction (begun if need be); with ``wait``,
        wait for the acknowledgements of all of its records."""
        try:
            producer = self._begin(slot)
            if rows:
                self._tx_sent[slot].update(self._hand_over(producer, rows))
            if wait:
                self._tx_wait(producer, slot)
        except BaseException as exc:
            self._fail(exc)
            raise

    def tx_commit(
        self, slot: int, checkpoint_id: int, lineage: str, marker_topic: str, unsent: list[Row]
    ) -> None:
        """Produce ``unsent`` into slot ``slot``'s transaction, add its offsets (the marker),
        commit."""
        self.tx_send(slot, unsent, True)
        try:
            producer = self._tx_producers[slot]
            self._send_offsets(producer, checkpoint_id, lineage, marker_topic)
            producer.commit_transaction()
            self._tx_open[slot] = False
        except BaseException as exc:
            self._fail(exc)
            raise

    def _fail(self, error: BaseException) -> None:
        """A transaction failed: its records may be lost, so none may commit any more (a new
        producer would abort it and commit only what comes next). The producers stay, for
        ``close`` to abort their transactions."""
        if self._failed is None:
            self._failed = error
            log.error("egress %s: a Kafka transaction failed: %r", self.egress_id, error)

    def _sender(self) -> Sender:
        if self.sender is None:
            from statefun.egress._kafka_librdkafka import Sender

            assert isinstance(self._send_config, dict)
            self.sender = Sender(self.egress_id, self._send_config)
            log.info("egress %s: records sent by librdkafka", self.egress_id)
        return self.sender

    def produce(self, rows: list[Row], wait: bool) -> None:
        """Send ``rows``; with ``wait``, wait for their acknowledgements (ConnectionError if
        any failed). The plain producer: librdkafka's where the properties allow it."""
        if isinstance(self._send_config, dict):
            self._send(rows, wait)
            return
        producer = self._plain_producer()
        if not wait:
            try:
                self._hand_over(producer, rows)
            except Exception as exc:
                log.error(
                    "egress %s: %d record(s) dropped (semantic none): %r",
                    self.egress_id,
                    len(rows),
                    exc,
                )
            return
        from statefun.egress._kafka_append import BatchTooLarge, abandon, flush

        try:
            failures = flush(producer, self._hand_over(producer, rows), _SEND_TIMEOUT_S)
        except BatchTooLarge as exc:  # the producer stays stuck on that batch: a new one
            self.plain = None
            self._appenders.pop(id(producer), None)
            abandon(producer)
            raise ConnectionError(f"egress {self.egress_id}: {exc}") from exc
        if failures:
            raise ConnectionError(
                f"egress {self.egress_id}: {sum(n for _, n in failures)} of {len(rows)} "
                f"record(s) not acknowledged by Kafka: {failures[0][0]!r}"
            )

    def _send(self, rows: list[Row], wait: bool) -> None:
        sender = self._sender()
        if wait:
            sender.send(rows)
            failures = sender.wait(_SEND_TIMEOUT_S)
            if failures:
                raise ConnectionError(
                    f"egress {self.egress_id}: {sum(n for _, n in failures)} of {len(rows)} "
                    f"record(s) not acknowledged by Kafka: {_text(failures[0][0])}"
                )
            return
        try:
            sender.send(rows)
        except ConnectionError as exc:
            log.error("egress %s: records dropped (semantic none): %s", self.egress_id, exc)
        failures = sender.failures()
        if failures:
            self._dropped_reason = _text(failures[0][0])
        # (also without new failures: drops held back are told once their line is due)
        dropped = self._dropped.count(sum(n for _, n in failures))
        if dropped:
            log.error(
                "egress %s: %d record(s) dropped (semantic none) since the last line: %s",
                self.egress_id,
                dropped,
                self._dropped_reason,
            )

    def recover_transactions(self, transactions: list[Transaction], slot: int, legacy: bool) -> int:
        """Commit the transactions (oldest first) that did not reach Kafka; how many."""
        kafka = import_kafka()
        # init_transactions first (start() did, unless it was not called): a commit in
        # progress completes, an open transaction is aborted.
        self.init_transactional()
        if legacy:  # the single transactional id of the runs before the two slots
            _close_quietly(self._transactional_producer(self.transactional_id), 10)
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
            self.tx_commit(slot, cid, lineage, rows[0][0], rows)
        return len(transactions) - done

    def close(self) -> None:
        for slot in SLOTS:
            producer, self._tx_producers[slot] = self._tx_producers[slot], None
            if producer is None:
                continue
            self._appenders.pop(id(producer), None)
            if self._tx_open[slot]:
                self._abort(producer, slot)
            _close_quietly(producer, 10)
        producer, self.plain = self.plain, None
        if producer is not None:
            self._appenders.pop(id(producer), None)
            producer.close(timeout=10)
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.close(10)

    def _abort(self, producer: Any, slot: int) -> None:
        """Abort slot ``slot``'s open transaction, so that readers need not wait for its
        timeout. With the producer's own epoch: a producer that a newer run fenced fails here
        and fences nobody. abort_transaction has no timeout: it runs on a daemon thread."""
        self._tx_open[slot] = False

        def abort() -> None:
            try:
                producer.abort_transaction()
            except Exception as exc:
                log.debug("egress %s: aborting an open transaction: %r", self.egress_id, exc)

        thread = threading.Thread(target=abort, name=f"{self.egress_id}-abort", daemon=True)
        thread.start()
        thread.join(_ABORT_TIMEOUT_S)
        if thread.is_alive():
            log.warning(
                "egress %s: the open transaction of %s could not be aborted in %.0f s; the "
                "broker aborts it after transaction.timeout.ms, or the next run does",
                self.egress_id,
                self.transactional_ids[slot],
                _ABORT_TIMEOUT_S,
            )


def _text(error: Any) -> str:
    """An error as one line: librdkafka's text, else its repr."""
    return str(error.str()) if hasattr(error, "str") else repr(error)


def _close_quietly(producer: Any, timeout: float) -> None:
    from statefun.egress._kafka_append import abandon

    try:
        producer.close(timeout=timeout)
    except Exception as exc:  # e.g. stuck on a split batch: its finalizer would fail too
        log.debug("closing a Kafka producer: %r", exc)
        abandon(producer)
