"""A Kafka ingress's records fetched by librdkafka (the ``confluent-kafka`` package).

The Kafka ingress keeps kafka-python for its control plane: topic metadata, start offsets,
seeks, commits to its consumer group. Fetching is the data plane, and there kafka-python works
in Python under the GIL: its network thread and the record parsing took about a third of the
runtime's GIL samples at 2,000 records/s and about a fifth while it worked off a backlog.
:class:`Fetcher` hands that to librdkafka, whose threads fetch, check and parse record batches
in C: a consumer with partitions assigned at the ingress's offsets (no group membership, no
commits), read by ``consume``. The ingress gets librdkafka's own messages: a run of valid ones
is read where it is (:func:`message_run`, the hot path: no object per record beside its
message), and any other record becomes the ``ConsumerRecord`` kafka-python gives
(:func:`to_record`), so dead letters and what they say do not depend on the client.

Only a plain connection is handed over: :func:`fetch_config` translates the few consumer
properties that shape fetching and answers why not for any other (TLS, SASL, ...), and the
ingress then fetches with kafka-python as before (as it does with the property
``pystatefun.fetch.client: kafka-python``). Settings that differ between the clients are
pinned to the Java client's defaults (``isolation.level`` read_uncommitted, CRCs checked).
librdkafka's own log lines go to this module's logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import confluent_kafka

from statefun._exceptions import ConfigurationError
from statefun._kafka import import_kafka, librdkafka_config
from statefun._kafka._throttle import Throttle
from statefun.ingress._kafka_fetch import header_size
from statefun.ingress._kafka_runs import Fields, messages
from statefun.sdk._types import TypedValue

import_kafka()  # first: it quiets kafka-python's import-time warnings
from kafka.consumer.fetcher import ConsumerRecord  # noqa: E402

__all__ = ["FETCH_CLIENT", "MESSAGE", "Fetcher", "fetch_config", "message_run", "to_record"]

log = logging.getLogger(__name__)

_new_record = tuple.__new__  # a ConsumerRecord without namedtuple's keyword-taking __new__

#: the ingress property that chooses the client that fetches: librdkafka (where the other
#: properties allow it) or kafka-python
FETCH_CLIENT = "pystatefun.fetch.client"

#: Java consumer properties that only shape fetching, and their librdkafka names
_FETCH_PROPERTIES = {
    "client.id": "client.id",
    "isolation.level": "isolation.level",
    "fetch.min.bytes": "fetch.min.bytes",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "fetch.max.bytes": "fetch.max.bytes",
    "max.partition.fetch.bytes": "max.partition.fetch.bytes",
    "check.crcs": "check.crcs",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
}
#: properties the ingress reads itself or that change nothing here
_OWN_PROPERTIES = frozenset({"max.poll.records", "auto.offset.reset", "group.id"})
#: librdkafka's timestamp types -> kafka-python's (create time 0, log append time 1)
_TIMESTAMP_TYPES = {0: 0, 1: 0, 2: 1}
#: records fetched ahead of the ingress: at most this many KiB, and this many per partition
_READ_AHEAD_KIB = 8192
_READ_AHEAD_RECORDS = 10_000


def fetch_config(
    bootstrap_servers: str,
    group_id: str | None,
    properties: Mapping[str, str],
    owner: str,
    auto_offset_reset: str = "latest",
) -> dict[str, Any] | str:
    """librdkafka settings for fetching with these consumer properties, or why not;
    ``auto_offset_reset``: where an offset out of range goes, as in kafka-python."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        # required by the client; nothing joins the group or commits to it from here
        "group.id": group_id or f"pystatefun-{owner}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "allow.auto.create.topics": False,
        "auto.offset.reset": auto_offset_reset,  # earliest | latest
        "isolation.level": "read_uncommitted",  # (librdkafka's default is read_committed)
        "check.crcs": True,
        # read ahead bounded (librdkafka's defaults: 64 MiB, 100,000 records per partition)
        "queued.max.messages.kbytes": _READ_AHEAD_KIB,
        "queued.min.messages": _READ_AHEAD_RECORDS,
        # when that much waits, look again this soon (librdkafka's default 1 s held a backlog's
        # drain to about one bound per second)
        "fetch.queue.backoff.ms": 5,
        "logger": log,
    }
    return librdkafka_config(
        properties, FETCH_CLIENT, _FETCH_PROPERTIES, _OWN_PROPERTIES, config, f"ingress {owner}"
    )


class Fetcher:
    """One librdkafka consumer for an ingress's assigned partitions; used by one thread at a
    time (the ingress's consumer thread), except :meth:`highwater`."""

    def __init__(self, ingress_id: str, config: Mapping[str, Any]) -> None:
        self.ingress_id = ingress_id
        try:
            self._consumer = confluent_kafka.Consumer(dict(config))
        except confluent_kafka.KafkaException as exc:  # (only fetch settings: no secrets)
            raise ConfigurationError(f"ingress {ingress_id}: {exc.args[0].str()}") from None
        self._assigned: list[tuple[str, int]] = []
        #: records that could not be fetched: one line per 10 s at most
        self._errors = Throttle()

    def assign(
        self,
        partitions: Iterable[tuple[str, int]],
        starts: Mapping[tuple[str, int], int],
        positions: Mapping[tuple[str, int], int],
    ) -> None:
        """Fetch ``partitions``: those in ``starts`` from there, the others from the record
        after the last one handed out (else from ``positions``)."""
        partition_type = confluent_kafka.TopicPartition
        wanted = list(partitions)
        current: dict[tuple[str, int], int] = {}
        if self._assigned:
            for tp in self._consumer.position([partition_type(t, p) for t, p in self._assigned]):
                if tp.offset >= 0:
                    current[(tp.topic, tp.partition)] = tp.offset
        offsets = []
        for key in wanted:
            offset = starts.get(key, current.get(key, positions.get(key)))
            if offset is None:
                offset = confluent_kafka.OFFSET_BEGINNING
            offsets.append(partition_type(key[0], key[1], offset))
        self._consumer.assign(offsets)
        self._assigned = wanted

    def poll(self, max_records: int, timeout_s: float) -> list[Any]:
        """Up to ``max_records`` records as librdkafka's messages (:func:`to_record` makes a
        ``ConsumerRecord`` of one, :func:`message_run` reads a run of them), waiting up to
        ``timeout_s`` for the first."""
        consumer = self._consumer
        # what is fetched already, at once; else the first record to come, and what came with
        # it (``consume`` alone would wait for ``max_records`` or the timeout: latency)
        messages = consumer.consume(max_records, 0)
        if not messages:
            first = consumer.poll(timeout_s)
            if first is None:
                return []
            messages = (
                [first, *consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]
            )
        for message in messages:
            if message.error() is not None:
                return self._without_errors(messages)
        return messages

    def _without_errors(self, messages: list[Any]) -> list[Any]:
        records = []
        for message in messages:
            if message.error() is None:
                records.append(message)
            else:
                self._failed(message)
        return records

    def _failed(self, message: Any) -> None:
        failures = self._errors.count()
        if not failures:
            return
        where = f"{message.topic()}/{message.partition()}" if message.topic() else "the consumer"
        log.warning(
            "ingress %s: fetching %s failed (%d failure(s) since the last line): %s",
            self.ingress_id,
            where,
            failures,
            message.error(),
        )

    def highwater(self, topic: str, partition: int) -> int | None:
        """The partition's end as last fetched (None: not fetched yet)."""
        tp = confluent_kafka.TopicPartition(topic, partition)
        found = self._consumer.get_watermark_offsets(tp, cached=True)
        high = None if found is None else found[1]
        return None if high is None or high < 0 else int(high)

    def close(self) -> None:
        self._consumer.close()


#: the type of the records :meth:`Fetcher.poll` returns
MESSAGE = confluent_kafka.Message


def to_record(message: Any) -> Any:
    """The kafka-python ``ConsumerRecord`` of a librdkafka message (the same fields)."""
    key, value = message.key(), message.value()
    kind, timestamp = message.timestamp()
    headers: Any = message.headers()
    return _new_record(
        ConsumerRecord,
        (
            message.topic(),
            message.partition(),
            -1,
            message.offset(),
            timestamp,
            _TIMESTAMP_TYPES.get(kind, 0),
            key,
            value,
            headers or [],
            None,
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            header_size(headers),
        ),
    )


#: how the ingress's run reader reads a librdkafka message (its methods, called unbound)
_FIELDS = Fields(MESSAGE.key, MESSAGE.value, MESSAGE.partition, MESSAGE.topic)


def message_run(
    batch: list[Any],
    start: int,
    value_type: str,
    validate: Callable[[bytes], Any] | None,
) -> list[tuple[str, TypedValue]]:
    """The (id, value) of each message from ``start`` on, up to the first that is not valid
    or is of another partition: the ingress's run (``_kafka_runs.py``) read from librdkafka's
    messages where they are (no ``ConsumerRecord`` per message; on the hot path)."""
    return messages(batch, start, _FIELDS, value_type, validate)
