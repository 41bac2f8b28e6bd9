"""Idempotency keys on a clustered job's HTTP ingress: the key function and the requests' side.

The decisions are ``_keys.decide`` (pure); this module runs them:

* ``key_functions(retention, clock)``: the embedded function ``pystatefun.http/idempotency``
  that every epoch's job of a worker with an HTTP ingress serves (``FunctionRegistry.add``).
  Its state is the key's record (with the state TTL ``expire_after_write`` = the retention;
  ``retention``, a ``KeyRetention``, deletes expired keys and bounds how many are kept per key
  group, ``_key_retention.py``). Its answers are messages to
  ``pystatefun.http/reply:<request id>`` - replies like a ``/call``'s, held until the
  checkpoint that holds the record commits and carried to the connection's worker by the
  replies topic. A value it cannot read is logged (rate-limited)
  and ignored: the key function never fails the job.
* ``dead_letter_to_key(send)``: the job's hook for a dead letter whose caller is a key (the
  forwarded message of a ``/call``): the key hears it (``Outputs.on_dead_letter_from``).
* ``request_value`` / ``answer``: what the request's worker sends to the key's address and how
  it answers the HTTP request from the outcome that comes back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from statefun._addresses import REPLY_TYPENAME
from statefun._http.server import Reply, plain
from statefun.cluster._key_retention import KeyRetention
from statefun.cluster._keys import (
    ACCEPTED,
    BUSY,
    CONFLICT,
    DEAD,
    DEAD_LETTER_TYPENAME,
    KEY_TYPENAME,
    OUTCOME_TYPENAME,
    RECORD_TYPENAME,
    REQUEST_TYPENAME,
    Event,
    KeyMessageError,
    Outcome,
    Target,
    decide,
    decode_dead_letter,
    decode_outcome,
    decode_record,
    decode_request,
    encode_dead_letter,
    encode_outcome,
    encode_record,
    encode_request,
)
from statefun.cluster._keys import (
    Reply as KeyReply,
)
from statefun.cluster._replies import RateLimitedLog
from statefun.runtime._envelope import Envelope
from statefun.sdk._context import Context
from statefun.sdk._functions import StatefulFunctions
from statefun.sdk._messages import Message
from statefun.sdk._spec import SdkAddress, ValueSpec
from statefun.sdk._types import TypedValue, simple_type

__all__ = ["answer", "dead_letter_to_key", "key_functions", "request_value"]

log = logging.getLogger(__name__)

_RECORD_TYPE = simple_type(RECORD_TYPENAME, bytes, bytes)
#: a request's deadline as the key's worker sees it: its reply timeout plus this, for clocks
#: of two machines that differ a little
_CLOCK_SLACK_MS = 5_000
_REPLAYED = (("Idempotent-Replayed", "true"),)


class KeyFunction:
    """The key function (see the module); ``clock`` is the wall clock in ms."""

    def __init__(self, retention: KeyRetention, clock: Callable[[], int]) -> None:
        self.retention = retention
        self._clock = clock
        self._limited = RateLimitedLog("idempotency key")

    def __call__(self, context: Context, message: Message) -> None:
        storage = context.storage
        try:
            event = _event(message, context.caller)
            stored = storage.record
            record = None if stored is None else decode_record(stored)
        except KeyMessageError as exc:
            self._limited.warn(f"{context.address.id!r}: {exc}; ignored")
            return
        now = self._clock()
        decision = decide(record, event, now, self.retention.retention_ms)
        if decision.write:
            record = decision.record
            if record is None:
                del storage.record
            else:
                storage.record = encode_record(record)
        self.retention.seen(context.address.id, record, now)
        for request_id, outcome in decision.answers:
            value = TypedValue(OUTCOME_TYPENAME, encode_outcome(outcome))
            context.send(Message(REPLY_TYPENAME, request_id, value))
        target = decision.forward
        if target is not None:
            value = TypedValue(target.value_typename, target.value if target.has_value else None)
            context.send(Message(target.typename, target.id, value))


def _event(message: Message, caller: SdkAddress | None) -> Event:
    value = message.typed_value
    typename = str(value.typename)
    data = bytes(value.value) if value.has_value else b""
    if typename == REQUEST_TYPENAME:
        if caller is None or caller.typename != REPLY_TYPENAME:
            raise KeyMessageError("a request without a reply address as its caller")
        return decode_request(data, caller.id)
    if typename == DEAD_LETTER_TYPENAME:
        return decode_dead_letter(data)
    sender = ("", "") if caller is None else (caller.typename, caller.id)
    return KeyReply(sender, typename, bool(value.has_value), data)


def key_functions(retention: KeyRetention, clock: Callable[[], int]) -> StatefulFunctions:
    """The registry holding the key function, to ``FunctionRegistry.add`` to a job."""
    functions = StatefulFunctions()
    retention_ms = retention.retention_ms
    ttl = timedelta(milliseconds=retention_ms) if retention_ms > 0 else None
    spec = ValueSpec("record", _RECORD_TYPE, expire_after_write=ttl)
    functions.register(KEY_TYPENAME, KeyFunction(retention, clock), [spec])
    return functions


def dead_letter_to_key(send: Callable[[Envelope], None]) -> Callable[[str, Envelope, str], None]:
    """The hook telling the key ``key id`` that its forwarded message ``envelope`` went to the
    dead letters (``reason``); ``send`` routes a message (the job's)."""

    def tell(key_id: str, envelope: Envelope, reason: str) -> None:
        value = encode_dead_letter((envelope.typename, envelope.id), reason)
        send(Envelope(KEY_TYPENAME, key_id, TypedValue(DEAD_LETTER_TYPENAME, value), None))

    return tell


# -- the request's side ------------------------------------------------------------------------


def request_value(
    fingerprint: bytes, route: str, typename: str, id_: str, value: Any, until_ms: int
) -> TypedValue:
    """The value of the message to the key's address for a request (which waits until
    ``until_ms``, wall clock) sending ``value`` to ``typename``/``id_``."""
    has_value = bool(value.has_value)
    target = Target(
        typename, id_, str(value.typename), has_value, bytes(value.value) if has_value else b""
    )
    return TypedValue(
        REQUEST_TYPENAME, encode_request(fingerprint, route, target, until_ms + _CLOCK_SLACK_MS)
    )


def answer(
    outcome_value: Any,
    key: str,
    address: str,
    reply_of: Callable[[Any], Reply],
) -> Reply:
    """The HTTP answer to a keyed request from the outcome its key sent (a typed value);
    ``reply_of`` makes a /call's answer from a reply value."""
    if str(outcome_value.typename) != OUTCOME_TYPENAME:
        raise KeyMessageError(f"not an idempotency outcome but a {outcome_value.typename}")
    outcome: Outcome = decode_outcome(bytes(outcome_value.value))
    extra = _REPLAYED if outcome.replayed else ()
    if outcome.kind == ACCEPTED:
        return plain(202, "accepted", extra)
    if outcome.kind == CONFLICT:
        return plain(
            422,
            f"Idempotency-Key {key!r} was used for another request (route, address or body "
            "differ); a new request needs a new key",
        )
    if outcome.kind == DEAD:
        return plain(422, f"{address}: {outcome.detail}")
    if outcome.kind == BUSY:
        return plain(
            503,
            f"Idempotency-Key {key!r}: {outcome.detail}; retry later",
            (("Retry-After", "1"),),
        )
    typename, has_value, body = outcome.detail
    reply = reply_of(TypedValue(typename, body if has_value else None))
    return reply._replace(headers=reply.headers + extra)
