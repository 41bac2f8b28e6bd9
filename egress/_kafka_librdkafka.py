"""A Kafka egress's records sent by librdkafka (the ``confluent-kafka`` package).

kafka-python builds record batches and speaks to the broker in Python, under the GIL that the
event loop needs: on a hot-key backlog the egress's producer thread and kafka-python's network
thread held it in about a sixth of the samples. :class:`Sender` hands records to librdkafka
instead, whose threads batch, compress and send them in C; the egress keeps its records,
flushes and checkpoints as they are, and only the producer thread's calls change.

Only the egress's plain producer (``at-least-once``, ``none``) is handed over: exactly-once's
transactions, markers and recovery stay kafka-python's. Only a plain connection too:
:func:`produce_config` translates the few producer properties that shape sending and answers
why not for any other (TLS, SASL, ...), and the egress then sends with kafka-python as before
(as it does with the property ``pystatefun.produce.client: kafka-python``). Settings follow
kafka-python's and the Java client's defaults where librdkafka's differ (``acks`` all with
idempotence, a delivery timeout of 120 s, Java's murmur2 partitioning of keys), and the records
librdkafka holds are bounded. librdkafka's own log lines go to this module's logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import confluent_kafka

from statefun._compiled import hot_loops
from statefun._exceptions import ConfigurationError
from statefun._kafka import librdkafka_config
from statefun._kafka._throttle import Throttle

__all__ = ["PRODUCE_CLIENT", "Sender", "produce_config"]

log = logging.getLogger(__name__)

#: One record: topic, key (None: no key), value (None: a tombstone), headers (None: none).
Row = tuple[str, "str | None", "bytes | None", "list[tuple[str, bytes]] | None"]

#: the egress property that chooses the client that sends: librdkafka (where the other
#: properties allow it) or kafka-python
PRODUCE_CLIENT = "pystatefun.produce.client"

#: Java producer properties that only shape sending, and their librdkafka names
_PRODUCE_PROPERTIES = {
    "acks": "acks",
    "batch.size": "batch.size",
    "client.id": "client.id",
    "compression.type": "compression.type",
    "delivery.timeout.ms": "delivery.timeout.ms",
    "enable.idempotence": "enable.idempotence",
    "linger.ms": "linger.ms",
    "max.in.flight.requests.per.connection": "max.in.flight.requests.per.connection",
    "max.request.size": "message.max.bytes",
    "request.timeout.ms": "request.timeout.ms",
    "retries": "retries",
    "retry.backoff.ms": "retry.backoff.ms",
    "send.buffer.bytes": "socket.send.buffer.bytes",
}
#: librdkafka's names for some of those in its errors -> the Java property
_SAID_AS = {
    "queue.buffering.max.ms": "linger.ms",
    "message.timeout.ms": "delivery.timeout.ms",
    "message.send.max.retries": "retries",
    "message.max.bytes": "max.request.size",
    "socket.send.buffer.bytes": "send.buffer.bytes",
}
#: Sender.send's loop, compiled (statefun/_hotloops.c), when built; what it leaves to the code
#: here when ``produce`` raises it
_produce_rows: (
    Callable[[Any, list[Row], int, tuple[type[BaseException], ...]], tuple[int, Any]] | None
) = None if hot_loops is None else hot_loops.produce_rows
_REFUSED = (BufferError, confluent_kafka.KafkaException)

#: properties of the exactly-once producers only: they change nothing here
_OWN_PROPERTIES = frozenset({"transactional.id", "transaction.timeout.ms"})
#: records librdkafka holds before a send waits for room (its defaults: 100,000 and 1 GiB)
_QUEUE_RECORDS = 100_000
_QUEUE_KIB = 65_536


def produce_config(
    bootstrap_servers: str,
    properties: Mapping[str, str],
    owner: str,
    linger_ms: int,
    batch_bytes: int,
) -> dict[str, Any] | str:
    """librdkafka settings for sending with these producer properties, or why not;
    ``linger_ms`` and ``batch_bytes`` unless the properties set them."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": linger_ms,
        "batch.size": batch_bytes,
        "acks": "all",
        "delivery.timeout.ms": 120_000,
        # Java's default partitioner for keyed records (murmur2 of the key bytes); records
        # without a key spread over the partitions
        "partitioner": "murmur2_random",
        "queue.buffering.max.messages": _QUEUE_RECORDS,
        "queue.buffering.max.kbytes": _QUEUE_KIB,
        # a delivery report (a Python call) only for a record that failed
        "delivery.report.only.error": True,
        "logger": log,
    }
    translated = librdkafka_config(
        properties, PRODUCE_CLIENT, _PRODUCE_PROPERTIES, _OWN_PROPERTIES, config, owner
    )
    if isinstance(translated, str):
        return translated
    # idempotence as the Java client has it: on unless set, or unless acks is not all
    if "enable.idempotence" not in config:
        config["enable.idempotence"] = str(config["acks"]).strip().lower() in ("all", "-1")
    return config


class Sender:
    """One librdkafka producer for a Kafka egress's records; used by one thread at a time
    (the egress's producer thread)."""

    def __init__(self, egress_id: str, config: Mapping[str, Any]) -> None:
        self.egress_id = egress_id
        self._failed: list[Any] = []  # KafkaErrors of records that failed, since the last look
        self._troubles = Throttle()  # one line per 10 s at most
        settings = {**config, "on_delivery": self._delivered, "error_cb": self._trouble}
        try:
            self._producer = confluent_kafka.Producer(settings)
        except (confluent_kafka.KafkaException, ValueError, TypeError) as exc:
            # (only sending settings: no secrets)
            reason = _reason(exc)
            for theirs, ours in _SAID_AS.items():  # the property's name as the egress has it
                reason = reason.replace(f'"{theirs}"', ours)
            raise ConfigurationError(f"egress {egress_id}: {reason}") from None

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:  # (delivery.report.only.error: only failures come here)
            self._failed.append(error)

    def _trouble(self, error: Any) -> None:
        """librdkafka's errors outside a record (a broker gone, ...): it retries them."""
        count = self._troubles.count()
        if count:
            log.warning(
                "egress %s: Kafka (%d error(s) since the last line): %s",
                self.egress_id,
                count,
                error.str(),
            )

    def send(self, rows: Sequence[Row]) -> None:
        """Hand ``rows`` to librdkafka, in order; waits only while its queue is full. A record
        librdkafka refuses at once (larger than ``max.request.size``, ...) raises
        ConnectionError naming its topic; the rows before it are sent."""
        producer = self._producer
        produce = producer.produce
        compiled = _produce_rows
        listed = rows if isinstance(rows, list) else None
        index, end = 0, len(rows)
        while index < end:
            refused: BaseException | None = None
            if compiled is not None and listed is not None:
                # the rest below, compiled, for rows without headers: it stops at a row with
                # headers (sent below), or at one ``produce`` refused, with what it raised
                index, refused = compiled(produce, listed, index, _REFUSED)
                if index >= end:
                    break
            topic, key, value, headers = rows[index]
            try:
                if refused is not None:
                    raise refused
                if headers is None:
                    produce(topic, value, key)
                else:
                    # (a list of (str, bytes): what it takes, though typed invariant)
                    produce(topic, value, key, headers=headers)  # type: ignore[arg-type]
            except BufferError:  # full: room comes as the broker acknowledges
                producer.poll(0.05)
                continue
            except confluent_kafka.KafkaException as exc:
                raise ConnectionError(
                    f"egress {self.egress_id}: a record for topic {topic} was refused: "
                    f"{_reason(exc)}"
                ) from None
            index += 1

    def wait(self, timeout_s: float) -> list[tuple[Any, int]]:
        """Wait until every record sent is acknowledged or failed (at most ``timeout_s``):
        each failure's error and its count of records, those not done in time included."""
        left = self._producer.flush(timeout_s)
        return self.failures(left)

    def failures(self, unfinished: int = 0) -> list[tuple[Any, int]]:
        """The records that failed since the last look (and ``unfinished`` ones), grouped."""
        self._producer.poll(0)
        failed, self._failed = self._failed, []
        counts: dict[str, tuple[Any, int]] = {}
        for error in failed:
            text = error.str()
            first, count = counts.get(text, (error, 0))
            counts[text] = (first, count + 1)
        grouped = list(counts.values())
        if unfinished:
            grouped.append((TimeoutError("not acknowledged in time"), unfinished))
        return grouped

    def close(self, timeout_s: float) -> None:
        """Send what is queued (up to ``timeout_s``), then drop what is left."""
        left = self._producer.flush(timeout_s)
        if left:
            self._producer.purge()
            log.warning(
                "egress %s: %d record(s) not acknowledged at close were dropped",
                self.egress_id,
                left,
            )


def _reason(exc: BaseException) -> str:
    """librdkafka's own text for an error it raised."""
    first = exc.args[0] if exc.args else exc
    text = first.str() if hasattr(first, "str") else str(first)
    return str(text)
