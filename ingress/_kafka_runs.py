"""A run of Kafka records as messages: the Kafka ingress's hot path, for either fetch client.

The ingress routes a polled batch in runs: consecutive records of one partition whose topic has
one target. Each fetch client's records are read where they are (kafka-python's
``ConsumerRecord``s, librdkafka's messages) into (key, value) pairs, and :func:`messages` turns
the valid prefix of those into (function id, typed value), stopping at the first record that
cannot become a message (the ingress then says why, from that record).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from statefun.sdk._types import TypedValue

__all__ = ["messages"]

_new_object = object.__new__


def messages(
    pairs: list[tuple[bytes, bytes]],
    value_type: str,
    validate: Callable[[bytes], Any] | None,
) -> list[tuple[str, TypedValue]]:
    """(id, value) for each (key, value) up to the first whose key is not UTF-8 or whose
    value ``validate`` refuses."""
    run: list[tuple[str, TypedValue]] = []
    append = run.append
    new_object = _new_object
    last_key: bytes | None = None  # a run of one key (one hot key) decodes it once: one id
    id_ = ""
    for key, value in pairs:
        try:
            if key != last_key:
                id_ = key.decode("utf-8")
                last_key = key
            if validate is not None:
                validate(value)
        except (UnicodeDecodeError, DecodeError, ValueError, TypeError):
            break
        typed = new_object(TypedValue)  # TypedValue(value_type, value) without its __init__
        typed.typename = value_type
        typed.has_value = True  # (value is not None)
        typed.value = value
        append((id_, typed))
    return run
