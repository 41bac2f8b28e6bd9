"""A run of Kafka records as messages: the Kafka ingress's hot path, for either fetch client.

The ingress routes a polled batch in runs: consecutive records of one partition whose topic has
one target. :func:`messages` reads a run where its records are (kafka-python's
``ConsumerRecord``s, librdkafka's messages: each client gives its ``Fields``, how to read one),
in one loop, into (function id, typed value), stopping at the first record of another
partition or that cannot become a message (the ingress then says why, from that record).
The same loop compiled (``statefun/_hotloops.c``: ``kafka_run``) stands in for it when built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from statefun._compiled import hot_loops
from statefun.sdk._types import TypedValue

__all__ = ["Fields", "messages", "python_messages"]

_new_object = object.__new__

#: what a record's key decoding or its validation may raise: the run ends before that record
_NOT_A_MESSAGE = (UnicodeDecodeError, DecodeError, ValueError, TypeError)


class Fields(NamedTuple):
    """How a fetch client's record is read: each takes the record (a C-level getter at best:
    an attribute getter, or a method of the record's class)."""

    key: Callable[[Any], Any]  # bytes, or None
    value: Callable[[Any], Any]  # bytes, or None
    partition: Callable[[Any], Any]  # int
    topic: Callable[[Any], Any]  # str


def python_messages(
    batch: list[Any],
    start: int,
    fields: Fields,
    value_type: str,
    validate: Callable[[bytes], Any] | None,
) -> list[tuple[str, TypedValue]]:
    """(id, value) for each record of ``batch`` from ``start`` on, up to the first of another
    topic or partition, without a key or a value, whose key is not UTF-8 or whose value
    ``validate`` refuses."""
    key_of, value_of, partition_of, topic_of = fields
    first = batch[start]
    topic, partition = topic_of(first), partition_of(first)
    run: list[tuple[str, TypedValue]] = []
    append = run.append
    new_object = _new_object
    last_key: bytes | None = None  # a run of one key (one hot key) decodes it once: one id
    id_ = ""
    for index in range(start, len(batch)):
        record = batch[index]
        key, value = key_of(record), value_of(record)
        if key is None or value is None or partition_of(record) != partition:
            break
        if topic_of(record) != topic:  # (a poll's records come grouped by partition)
            break
        try:
            if key != last_key:
                id_ = key.decode("utf-8")
                last_key = key
            if validate is not None:
                validate(value)
        except _NOT_A_MESSAGE:
            break
        typed = new_object(TypedValue)  # TypedValue(value_type, value) without its __init__
        typed.typename = value_type
        typed.has_value = True  # (value is not None)
        typed.value = value
        append((id_, typed))
    return run


if hot_loops is not None:
    _kafka_run: Callable[..., list[tuple[str, TypedValue]]] = hot_loops.kafka_run


def _compiled_messages(
    batch: list[Any],
    start: int,
    fields: Fields,
    value_type: str,
    validate: Callable[[bytes], Any] | None,
) -> list[tuple[str, TypedValue]]:
    """``python_messages``, compiled (the same results)."""
    return _kafka_run(batch, start, *fields, value_type, validate, TypedValue, _NOT_A_MESSAGE)


#: the run reader the ingress calls
messages = python_messages if hot_loops is None else _compiled_messages
