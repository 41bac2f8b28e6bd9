"""Replies of HTTP request-reply calls between workers: their ids, records and reader.

A ``/call`` waits on one worker's connection, while its function runs on the worker that owns
the function's key group. The call's message carries the caller
``pystatefun.http/reply:<request id>`` where the request id names the *instance* holding the
connection: ``<instance>.<ingress index>-<sequence>``, the instance being 16 hex digits drawn
once per worker process (``new_instance``). A restarted worker is a new instance, so a reply
for a connection its previous process held matches nobody.

The worker that runs the function holds the reply until its next checkpoint; at the cut a reply
for another instance becomes a record of the job's replies topic in the checkpoint's
transaction (``reply_row``), so it exists for ``read_committed`` readers only once the
checkpoint committed (``reply_release=on-checkpoint``). Records are keyed
``<partition>:<instance>`` with the partition ``replies_partition(instance)``: each worker reads
only the partition of its own instance (``RepliesReader``, from the end it found at start) and
completes the calls whose request id is its own. A reply for its own instance never leaves the
worker: it is released in memory after the commit.

A call whose message goes to the dead letters (on the function's worker) gets a record of its
own, ``[2, request id, reason]``, travelling the same way: the caller's 422.

Decoding is strict and total: a record that is not a reply (``ReplyRecordError``) is skipped
with a rate-limited log line by the reader; it never stops the worker.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from statefun._exceptions import UndeliverableError
from statefun._kafka import import_kafka
from statefun._kafka._throttle import Throttle
from statefun.cluster._config import ClusterConfig
from statefun.egress.kafka import Row
from statefun.sdk._types import TypedValue

__all__ = [
    "RateLimitedLog",
    "RepliesReader",
    "ReplyRecordError",
    "decode_reply",
    "instance_of",
    "new_instance",
    "replies_partition",
    "reply_row",
    "request_prefix",
]

log = logging.getLogger(__name__)

#: a request id made by ``request_prefix``: instance, ingress index, sequence
_REQUEST_ID = re.compile(r"([0-9a-f]{16})\.[0-9]+-[0-9]+")
_VERSION = 1
#: the first field of a record saying the call's message went to the dead letters
_UNDELIVERABLE = 2
#: the reader logs at most one line per kind of trouble this often
_LOG_EVERY_S = 10.0


class ReplyRecordError(ValueError):
    """A replies-topic record that is not a reply (its one-line reason)."""


def new_instance() -> str:
    """A fresh instance id for this worker process: 16 hex digits."""
    return os.urandom(8).hex()


def request_prefix(instance: str, ingress_index: int) -> str:
    """What the HTTP ingress ``ingress_index`` of ``instance`` puts before ``-<sequence>``."""
    return f"{instance}.{ingress_index}"


def instance_of(request_id: str) -> str | None:
    """The instance a request id names; None: not a request id of a clustered ingress."""
    match = _REQUEST_ID.fullmatch(request_id)
    return match.group(1) if match else None


def replies_partition(config: ClusterConfig, instance: str) -> int:
    """The replies topic's partition that carries the replies for ``instance``."""
    return zlib.crc32(instance.encode("ascii")) % config.partitions


def reply_row(config: ClusterConfig, request_id: str, value: Any) -> Row:
    """The reply ``value`` to ``request_id`` as a replies-topic record: a typed value, or an
    ``UndeliverableError`` (the call's message went to the dead letters: a 422). Raises
    ReplyRecordError when ``request_id`` names no instance."""
    instance = instance_of(request_id)
    if instance is None:
        raise ReplyRecordError(f"reply to {request_id!r}: not a clustered request id")
    key = f"{replies_partition(config, instance)}:{instance}"
    if isinstance(value, UndeliverableError):
        body: list[Any] = [_UNDELIVERABLE, request_id, str(value)]
    else:
        has_value = bool(value.has_value)
        body = [_VERSION, request_id, str(value.typename), has_value, bytes(value.value or b"")]
    return (config.replies_topic, key, bytes(msgpack.packb(body, use_bin_type=True)), None)


def decode_reply(key: bytes | None, value: bytes | None) -> tuple[str, str, Any]:
    """(instance, request id, reply) of a replies-topic record, the reply a typed value or an
    ``UndeliverableError``; ReplyRecordError when it is not a reply."""
    if value is None:
        raise ReplyRecordError("a record without a value")
    try:
        fields = msgpack.unpackb(value, raw=False)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ReplyRecordError(f"not msgpack ({type(exc).__name__})") from None
    reply: Any
    if isinstance(fields, list) and len(fields) == 3 and fields[0] == _UNDELIVERABLE:
        _, request_id, reason = fields
        if not isinstance(reason, str):
            raise ReplyRecordError("its dead letter's reason is not text")
        reply = UndeliverableError(reason)
    elif isinstance(fields, list) and len(fields) == 5 and fields[0] == _VERSION:
        _, request_id, typename, has_value, body = fields
        if not isinstance(typename, str) or not typename:
            raise ReplyRecordError("its typename is not text")
        if not isinstance(has_value, bool) or not isinstance(body, bytes):
            raise ReplyRecordError("its value is not bytes")
        reply = TypedValue(typename, body if has_value else None)
    else:
        raise ReplyRecordError("not a reply record (a reply of 5 fields or a dead letter of 3)")
    if not isinstance(request_id, str):
        raise ReplyRecordError("its request id is not text")
    instance = instance_of(request_id)
    if instance is None:
        raise ReplyRecordError(f"{request_id[:80]!r} is not a clustered request id")
    if key is not None and not key.endswith(b":" + instance.encode("ascii")):
        raise ReplyRecordError(f"its key does not name instance {instance}")
    return instance, request_id, reply


class RateLimitedLog:
    """A warning at most once per ``_LOG_EVERY_S``, with the count of those it stood for."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._throttle = Throttle(_LOG_EVERY_S)

    def warn(self, detail: str) -> None:
        count = self._throttle.count()
        if count:
            more = f" (and {count - 1} more since the last line)" if count > 1 else ""
            log.warning("cluster: %s: %s%s", self.what, detail, more)


class RepliesReader:
    """Reads this instance's partition of the replies topic ``read_committed``, in a thread of
    its own, and hands each reply for ``instance`` to ``deliver(request_id, value)`` (called on
    that thread: hand it to the loop there). ``start`` returns once the reader's position is
    fixed at the end of the partition, so no reply committed after it is missed."""

    def __init__(
        self,
        config: ClusterConfig,
        instance: str,
        deliver: Callable[[str, Any], None],
        poll_ms: int = 100,
    ) -> None:
        self.config = config
        self.instance = instance
        self._deliver = deliver
        self._poll_ms = poll_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self.bad = RateLimitedLog("a record of the replies topic is not a reply; skipped")
        self.read = 0

    def start(self) -> None:
        """Blocking (call in a worker thread): connect, fix the start, begin polling."""
        kafka = import_kafka()
        consumer = kafka.KafkaConsumer(
            bootstrap_servers=self.config.bootstrap_servers,
            client_id=f"pystatefun-{self.config.worker_id}-replies",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=self._poll_ms,
        )
        partition = kafka.TopicPartition(
            self.config.replies_topic, replies_partition(self.config, self.instance)
        )
        consumer.assign([partition])
        consumer.seek_to_end(partition)
        consumer.position(partition)  # resolves the lazy seek now, before any call is sent
        self._consumer = consumer
        self._thread = threading.Thread(target=self._poll, name="pystatefun-replies", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        consumer = self._consumer
        while not self._stop.is_set():
            try:
                batches = consumer.poll(timeout_ms=self._poll_ms)
            except Exception as exc:  # a broker away for a while: the next poll retries
                self.bad.warn(f"polling the replies topic failed: {exc}")
                time.sleep(self._poll_ms / 1000)
                continue
            for records in batches.values():
                for record in records:
                    self.handle(record.key, record.value)

    def handle(self, key: bytes | None, value: bytes | None) -> None:
        """One record: this instance's reply to ``deliver``; others' skipped, bad ones logged."""
        try:
            instance, request_id, reply = decode_reply(key, value)
        except ReplyRecordError as exc:
            self.bad.warn(str(exc))
            return
        if instance == self.instance:
            self.read += 1
            self._deliver(request_id, reply)

    def close(self) -> None:
        """Blocking: stop polling and close the consumer."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._consumer is not None:
            self._consumer.close()
