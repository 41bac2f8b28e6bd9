"""Idempotency keys of a clustered job's HTTP ingress: the key function's decisions, pure.

A key is the state of an internal address, ``pystatefun.http/idempotency`` with the id
``<ingress id>:<key>`` (``key_id``): keyed like any address, so the worker that owns its key
group decides about it, and its record goes into that worker's changelog in the same Kafka
transaction as the messages the decision sent. ``decide(record, event, now_ms)`` is that
decision, with no I/O: the record before (None: the key is unseen), one event, the wall clock
in, and a ``Decision`` out (the record after, the answers to send to waiting requests, the
message to forward, whether to schedule the key's expiry). The adapter that runs it as an
embedded function is ``_key_function.py``.

Events (each a message to the key's address):

* ``Request``: an HTTP request carrying the key, sent by the worker holding its connection
  (caller ``pystatefun.http/reply:<request id>``), with the request's fingerprint, route and
  message. Unseen key: recorded and the message forwarded - for ``/messages`` with the outcome
  ``accepted`` at once, for ``/call`` in progress, the request waiting. Same fingerprint: the
  recorded outcome again (``replayed``), or one more waiter while in progress. Another
  fingerprint: ``conflict`` (422), nothing recorded.
* ``Reply``: what the called function sent to its caller (the key's address) - the call's
  outcome, recorded, and sent to every request waiting (the first unmarked, the others
  ``replayed``).
* ``DeadLetter``: the forwarded message went to the dead letters (the runtime's hook tells the
  key). The first waiting request hears why (422); with others waiting the message is
  forwarded again for them (the single-process ingress's waiters retry as well), else the key
  is forgotten, so that a retry is processed.

A record older than the retention is as good as none: the event finds the key unseen, and the
record is deleted (written as None) unless the event records the key anew. Deleting expired
keys no request touches, and bounding how many are kept, is ``_key_retention.py``'s.

Values on the wire and in state are msgpack lists with a version first; ``KeyMessageError``
(one line) for anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

__all__ = [
    "ACCEPTED",
    "BUSY",
    "CONFLICT",
    "DEAD",
    "DEAD_LETTER_TYPENAME",
    "KEY_TYPENAME",
    "MAX_WAITERS",
    "OUTCOME_TYPENAME",
    "RECORD_TYPENAME",
    "REPLY",
    "REQUEST_TYPENAME",
    "DeadLetter",
    "Decision",
    "KeyMessageError",
    "Outcome",
    "Record",
    "Reply",
    "Request",
    "Target",
    "decide",
    "decode_dead_letter",
    "decode_outcome",
    "decode_record",
    "decode_request",
    "encode_dead_letter",
    "encode_outcome",
    "encode_record",
    "encode_request",
    "key_id",
]

KEY_TYPENAME = "pystatefun.http/idempotency"
#: the value typenames of the key's messages and state
REQUEST_TYPENAME = "pystatefun.http/idempotency-request"
OUTCOME_TYPENAME = "pystatefun.http/idempotency-outcome"
DEAD_LETTER_TYPENAME = "pystatefun.http/idempotency-dead-letter"
RECORD_TYPENAME = "pystatefun.http/idempotency-record"

#: requests waiting on one key in progress; more are answered ``BUSY`` (503)
MAX_WAITERS = 64

#: outcome kinds
ACCEPTED, REPLY, CONFLICT, DEAD, BUSY = 1, 2, 3, 4, 5
_KINDS = (ACCEPTED, REPLY, CONFLICT, DEAD, BUSY)
#: record states
_IN_PROGRESS, _DONE = 0, 1
_VERSION = 1
_ROUTES = ("messages", "call")


class KeyMessageError(ValueError):
    """A value of the key function's that does not decode (its one-line reason)."""


def key_id(ingress_id: str, key: str) -> str:
    """The id of the key's address: keys are scoped to one ingress."""
    return f"{ingress_id}:{key}"


@dataclass(frozen=True)
class Target:
    """The message a request sends: to ``typename``/``id``, a typed value."""

    typename: str
    id: str
    value_typename: str
    has_value: bool
    value: bytes

    def fields(self) -> list[Any]:
        return [self.typename, self.id, self.value_typename, self.has_value, self.value]


def _target(fields: Any) -> Target:
    if not (isinstance(fields, list) and len(fields) == 5):
        raise KeyMessageError("its target is not 5 fields")
    typename, id_, value_typename, has_value, value = fields
    if not all(isinstance(f, str) and f for f in (typename, id_, value_typename)):
        raise KeyMessageError("its target's address or typename is not text")
    if not isinstance(has_value, bool) or not isinstance(value, bytes):
        raise KeyMessageError("its target's value is not bytes")
    return Target(typename, id_, value_typename, has_value, value)


@dataclass(frozen=True)
class Request:
    """A request with the key: its ``request_id`` (the reply address's id) waits until
    ``until_ms`` (wall clock) for the outcome."""

    fingerprint: bytes
    route: str
    target: Target
    request_id: str
    until_ms: int


@dataclass(frozen=True)
class Reply:
    """A message to the key's address from ``sender`` (typename, id): a call's reply."""

    sender: tuple[str, str]
    typename: str
    has_value: bool
    value: bytes


@dataclass(frozen=True)
class DeadLetter:
    """The forwarded message to ``target`` (typename, id) went to the dead letters."""

    target: tuple[str, str]
    reason: str


Event = Request | Reply | DeadLetter


@dataclass(frozen=True)
class Outcome:
    """What a request is answered: ``kind`` (``ACCEPTED``, ``REPLY`` with ``detail`` the
    reply's (typename, has_value, bytes), ``CONFLICT``, ``DEAD`` / ``BUSY`` with ``detail``
    the reason), and whether it repeats a recorded outcome."""

    kind: int
    replayed: bool = False
    detail: Any = None


@dataclass
class Record:
    """A key's state: its request's fingerprint and route, when it was first seen, and the
    outcome - in progress (``target`` kept to forward again, ``waiters`` (request id, until
    ms) oldest first) or done (``result``: ``ACCEPTED``, or a reply's fields)."""

    fingerprint: bytes
    route: str
    accepted_ms: int
    target: Target | None = None
    result: Any = None
    waiters: list[tuple[str, int]] = field(default_factory=list)

    @property
    def in_progress(self) -> bool:
        return self.result is None


@dataclass
class Decision:
    """What the key function does: ``record`` is the state after (None: forgotten) and is
    written only when ``write``; ``answers`` go to the waiting requests; ``forward`` is sent
    (from the key's address)."""

    record: Record | None
    write: bool = False
    answers: list[tuple[str, Outcome]] = field(default_factory=list)
    forward: Target | None = None


def decide(record: Record | None, event: Event, now_ms: int, retention_ms: int) -> Decision:
    """The key function's step (see the module): ``record`` before (not changed: a new one
    comes out), ``event``, the wall clock and how long a key is kept."""
    expired = record is not None and record.accepted_ms + retention_ms <= now_ms
    if expired:
        record = None  # as if unseen
    if isinstance(event, Request):
        decision = _request(record, event, now_ms)
    elif isinstance(event, Reply):
        decision = _reply(record, event, now_ms)
    else:
        decision = _dead_letter(record, event, now_ms)
    if expired:
        decision.write = True  # (deleted, unless recorded anew)
    return decision


def _request(record: Record | None, event: Request, now_ms: int) -> Decision:
    request_id = event.request_id
    if record is None:
        if event.route == "messages":  # accepted in the step that forwards it
            new = Record(event.fingerprint, event.route, now_ms, result=ACCEPTED)
            return Decision(new, True, [(request_id, Outcome(ACCEPTED))], event.target)
        new = Record(
            event.fingerprint,
            event.route,
            now_ms,
            target=event.target,
            waiters=[(request_id, event.until_ms)],
        )
        return Decision(new, True, [], event.target)
    if record.fingerprint != event.fingerprint:
        return Decision(record, answers=[(request_id, Outcome(CONFLICT))])
    if record.result == ACCEPTED:
        return Decision(record, answers=[(request_id, Outcome(ACCEPTED, True))])
    if record.result is not None:
        return Decision(record, answers=[(request_id, Outcome(REPLY, True, record.result))])
    waiters = [w for w in record.waiters if w[1] > now_ms]  # (those gone stop waiting)
    if len(waiters) >= MAX_WAITERS:
        busy = Outcome(BUSY, detail=f"{len(waiters)} requests already wait for this key")
        return Decision(record, answers=[(request_id, busy)])
    return Decision(replace(record, waiters=[*waiters, (request_id, event.until_ms)]), write=True)


def _reply(record: Record | None, event: Reply, now_ms: int) -> Decision:
    target = None if record is None else record.target
    if record is None or target is None or event.sender != (target.typename, target.id):
        return Decision(record)  # not the reply awaited (a /messages target's, or late)
    result = (event.typename, event.has_value, event.value)
    answers = [  # (a request that stopped waiting is not answered)
        (request_id, Outcome(REPLY, index > 0, result))
        for index, (request_id, until_ms) in enumerate(record.waiters)
        if until_ms > now_ms
    ]
    done = Record(record.fingerprint, record.route, record.accepted_ms, result=result)
    return Decision(done, True, answers)


def _dead_letter(record: Record | None, event: DeadLetter, now_ms: int) -> Decision:
    target = None if record is None else record.target
    if record is None or target is None or event.target != (target.typename, target.id):
        return Decision(record)
    first, *rest = record.waiters or [("", 0)]
    answers = [(first[0], Outcome(DEAD, detail=event.reason))] if first[0] else []
    waiting = [w for w in rest if w[1] > now_ms]
    if not waiting:
        return Decision(None, True, answers)  # forgotten: a retry is processed
    return Decision(replace(record, waiters=waiting), True, answers, target)


# -- values ------------------------------------------------------------------------------------


def _pack(fields: list[Any]) -> bytes:
    return bytes(msgpack.packb(fields, use_bin_type=True))


def _unpack(data: bytes, what: str, length: int) -> list[Any]:
    try:
        fields = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several types for garbage
        raise KeyMessageError(f"{what}: not msgpack ({type(exc).__name__})") from None
    if not (isinstance(fields, list) and len(fields) == length and fields[0] == _VERSION):
        raise KeyMessageError(f"{what}: not {length} fields of version {_VERSION}")
    return fields


def encode_request(fingerprint: bytes, route: str, target: Target, until_ms: int) -> bytes:
    return _pack([_VERSION, fingerprint, route, target.fields(), until_ms])


def decode_request(data: bytes, request_id: str) -> Request:
    _, fingerprint, route, target, until_ms = _unpack(data, "an idempotency request", 5)
    if not isinstance(fingerprint, bytes) or route not in _ROUTES:
        raise KeyMessageError("an idempotency request: bad fingerprint or route")
    if not isinstance(until_ms, int):
        raise KeyMessageError("an idempotency request: its deadline is not a number")
    return Request(fingerprint, route, _target(target), request_id, until_ms)


def encode_dead_letter(target: tuple[str, str], reason: str) -> bytes:
    return _pack([_VERSION, list(target), reason])


def decode_dead_letter(data: bytes) -> DeadLetter:
    _, target, reason = _unpack(data, "an idempotency dead letter", 3)
    if not (isinstance(target, list) and len(target) == 2 and isinstance(reason, str)):
        raise KeyMessageError("an idempotency dead letter: bad target or reason")
    return DeadLetter((str(target[0]), str(target[1])), reason)


def encode_outcome(outcome: Outcome) -> bytes:
    detail = outcome.detail
    if isinstance(detail, tuple):
        detail = list(detail)
    return _pack([_VERSION, outcome.kind, outcome.replayed, detail])


def decode_outcome(data: bytes) -> Outcome:
    _, kind, replayed, detail = _unpack(data, "an idempotency outcome", 4)
    if kind not in _KINDS or not isinstance(replayed, bool):
        raise KeyMessageError("an idempotency outcome: unknown kind")
    if kind == REPLY:
        detail = _result(detail)
    elif kind in (DEAD, BUSY) and not isinstance(detail, str):
        raise KeyMessageError("an idempotency outcome: its reason is not text")
    return Outcome(kind, replayed, detail)


def _result(fields: Any) -> Any:
    if fields == ACCEPTED:
        return ACCEPTED
    if not (isinstance(fields, list) and len(fields) == 3):
        raise KeyMessageError("a recorded reply is not 3 fields")
    typename, has_value, value = fields
    if not isinstance(typename, str) or not isinstance(value, bytes):
        raise KeyMessageError("a recorded reply's typename or value is malformed")
    return (typename, bool(has_value), value)


def encode_record(record: Record) -> bytes:
    result = record.result
    return _pack(
        [
            _VERSION,
            record.fingerprint,
            record.route,
            record.accepted_ms,
            None if record.target is None else record.target.fields(),
            list(result) if isinstance(result, tuple) else result,
            [list(w) for w in record.waiters],
        ]
    )


def decode_record(data: bytes) -> Record:
    _, fingerprint, route, accepted_ms, target, result, waiters = _unpack(
        data, "an idempotency record", 7
    )
    if not isinstance(fingerprint, bytes) or route not in _ROUTES:
        raise KeyMessageError("an idempotency record: bad fingerprint or route")
    return Record(
        fingerprint,
        route,
        int(accepted_ms),
        None if target is None else _target(target),
        None if result is None else _result(result),
        [(str(r), int(u)) for r, u in waiters],
    )
