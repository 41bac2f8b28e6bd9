"""Idempotency keys across savepoints: a single-process job's keys <-> a clustered job's.

A single-process job keeps its HTTP ingress's keys with the ingress (``ingress/
_idempotency.py``): the ingress's checkpointed position, ``{"seq": n, "keys": {"cut": c,
"entries": [...]}}`` in the savepoint's ``_metadata``, holds the keys completed since the last
completed checkpoint and the keyed calls in progress (``entry_fields``); older keys are in the
key log beside its write-ahead log (``keys-<n>.log``, records tagged with the cut that covers
them). A clustered job keeps each key as the state of ``pystatefun.http/idempotency:<ingress
id>:<key>`` (``_keys.py``), whose message to the target carries the key's address as its
caller. Both functions here are pure (values in, values out):

* ``seed_keys`` (a single-process savepoint seeds a clustered job): the key log's records of
  the savepoint's cut and before, then the position's entries (a later one of a key wins), each
  a key record in its key group. A call in progress becomes a key in progress: its message in
  flight (caller ``pystatefun.http/reply:<request id>``) is the key's forwarded message and
  gets the key's address as its caller, so the function's reply is recorded for the key.
* ``export_keys`` (``statefun savepoint create --cluster``): every key record becomes an entry
  of its ingress's position, ``{"seq": 0, "keys": {"cut": 0, "entries": [...]}}`` (sequence 0:
  a clustered job has no write-ahead log; cut 0: the single-process job reads no key log of
  cuts after it). Messages in flight to a key are applied first (``decide``): a reply completes
  its key, a dead letter forgets it; a request is dropped (its connection went with the job's
  workers: never answered, so not accepted). A message whose caller is a key in progress gets
  the caller ``pystatefun.http/reply:savepoint-<n>`` and its key that request id, so the
  restored single-process job records the function's reply for the key; the caller of one
  whose key is done (a ``/messages`` target) is dropped, as a ``/messages`` message has none in
  one process. Delayed messages to a key are dropped.

Keys whose retention ended are left out both ways; keys of an ingress the module no longer has
are dropped and counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from statefun._addresses import REPLY_TYPENAME
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.cluster._keys import (
    DEAD_LETTER_TYPENAME,
    KEY_TYPENAME,
    RECORD_TYPENAME,
    REQUEST_TYPENAME,
    DeadLetter,
    KeyMessageError,
    Record,
    Reply,
    Target,
    decide,
    decode_dead_letter,
    decode_record,
    encode_record,
    key_id,
)
from statefun.ingress._http_kind import wal_dir
from statefun.ingress._idempotency import entry_fields, entry_of
from statefun.ingress._keystore import Entry, read_key_log
from statefun.module._specs import HttpIngressSpec, ModuleSpec
from statefun.runtime._envelope import Envelope
from statefun.sdk._spec import address_of
from statefun.sdk._types import TypedValue
from statefun.state._expiring import ExpiringValue
from statefun.state.base import AddressKey

__all__ = [
    "ExportedKeys",
    "SeededKeys",
    "export_keys",
    "http_ingress_ids",
    "key_log_cut",
    "savepoint_keys",
    "seed_keys",
]

#: the request ids an exported savepoint gives the keyed calls in progress
_REQUEST_PREFIX = "savepoint-"
StateEntry = tuple[int, AddressKey, dict[str, Any]]


@dataclass
class SeededKeys:
    """The key records to seed (key group, address, values) and the messages in flight, the
    calls in progress now sent by their keys; ``dropped``: entries not seeded (an in-progress
    call without its message, or expired)."""

    state: list[StateEntry] = field(default_factory=list)
    messages: list[Envelope] = field(default_factory=list)
    dropped: int = 0


def seed_keys(
    positions: Mapping[str, Any],
    logged: Mapping[str, Iterable[Sequence[Any]]],
    messages: Sequence[Envelope],
    max_parallelism: int,
    retention_ms: int,
    now_ms: int,
) -> SeededKeys:
    """The clustered form of a single-process savepoint's keys (see the module):
    ``positions`` the savepoint's source positions of the HTTP ingresses (ingress id ->
    position), ``logged`` each one's key-log records of the savepoint's cut and before."""
    records: dict[str, Record] = {}
    calls: dict[str, str] = {}  # request id -> key id, of calls in progress
    dropped = 0
    for ingress_id in sorted(set(positions) | set(logged)):
        entries = [_logged_entry(record) for record in logged.get(ingress_id, ())]
        keys = _position_keys(positions.get(ingress_id))
        entries += [entry_of(list(fields)) for fields in keys.get("entries") or ()]
        for entry in entries:  # oldest first: a later entry of a key wins
            kid = key_id(ingress_id, entry.key)
            records.pop(kid, None)
            if entry.accepted_ms + retention_ms <= now_ms:
                dropped += 1
                continue
            record = Record(entry.fingerprint, entry.route, entry.accepted_ms)
            if entry.result is None:
                if entry.request_id is None:
                    dropped += 1
                    continue
                calls[str(entry.request_id)] = kid
            else:
                record.result = entry.result
            records[kid] = record
    out: list[Envelope] = []
    for envelope in messages:
        caller = envelope.caller
        called = None
        if caller is not None and caller.typename == REPLY_TYPENAME:
            called = calls.pop(caller.id, None)
        if called is not None:
            value = envelope.value
            has_value = bool(value.has_value)
            data = bytes(value.value) if has_value else b""
            target = Target(envelope.typename, envelope.id, str(value.typename), has_value, data)
            records[called] = replace(records[called], target=target)
            envelope = Envelope(
                envelope.typename, envelope.id, value, address_of((KEY_TYPENAME, called))
            )
        out.append(envelope)
    for kid in calls.values():  # in progress, but its message is not in the savepoint
        records.pop(kid, None)
        dropped += 1
    by_age = sorted(records.items(), key=lambda item: item[1].accepted_ms)
    state: list[StateEntry] = [
        (
            key_group_for(KEY_TYPENAME, kid, max_parallelism),
            (KEY_TYPENAME, kid),
            _values(r, retention_ms),
        )
        for kid, r in by_age
    ]
    return SeededKeys(state, out, dropped)


def _position_keys(position: Any) -> Mapping[str, Any]:
    keys = position.get("keys") if isinstance(position, Mapping) else None
    return keys if isinstance(keys, Mapping) else {}


def key_log_cut(position: Any) -> int:
    """The cut of a single-process HTTP ingress's position: its key log counts up to it."""
    return int(_position_keys(position).get("cut", 0))


def _logged_entry(record: Sequence[Any]) -> Entry:
    """A key-log record ``[tag, key, fp, route, ms, request id, result]``."""
    _, key, fp, route, accepted_ms, request_id, result = record
    entry = Entry(str(key), bytes(fp), str(route), int(accepted_ms))
    entry.request_id = request_id
    if isinstance(result, list | tuple):
        typename, has_value, value = result
        entry.result = (str(typename), bool(has_value), bytes(value))
    else:
        entry.result = result
    return entry


def _values(record: Record, retention: int) -> dict[str, Any]:
    """A key record as the key function stores it (with its state TTL, the retention)."""
    typed = TypedValue(RECORD_TYPENAME, encode_record(record))
    if retention <= 0:
        return {"record": typed}
    return {"record": ExpiringValue(typed, record.accepted_ms + retention)}


@dataclass
class ExportedKeys:
    """A clustered job's state and messages without its keys, the keys as single-process
    positions (ingress id -> position), and how many keys went where."""

    state: list[StateEntry]
    messages: list[Envelope]
    timers: list[tuple[int, AddressKey, str, Envelope]]
    positions: dict[str, dict[str, Any]]
    keys: int = 0
    dropped: int = 0


def export_keys(
    ingress_ids: Iterable[str],
    state: Iterable[StateEntry],
    messages: Iterable[Envelope],
    timers: Iterable[tuple[int, AddressKey, str, Envelope]],
    retention_ms: int,
    now_ms: int,
) -> ExportedKeys:
    """The single-process form of a stopped clustered job's keys (see the module); ``timers``:
    (deadline, sender, token, message) as ``Restored.timers``."""
    ids = sorted(ingress_ids, key=len, reverse=True)  # the longest prefix names the ingress
    records: dict[str, Record] = {}
    rest: list[StateEntry] = []
    dropped = 0
    for entry in state:
        typename, kid = entry[1]
        if typename != KEY_TYPENAME:
            rest.append(entry)
            continue
        stored: Any = entry[2].get("record")
        try:
            found = decode_record(bytes(stored.value))
        except (KeyMessageError, AttributeError, TypeError):
            dropped += 1
            continue
        records[kid] = replace(found, waiters=[])  # (their connections went with the workers)
    kept: list[Envelope] = []
    for envelope in messages:
        if envelope.typename != KEY_TYPENAME:
            kept.append(envelope)
            continue
        event = _event(envelope)
        if event is None:
            continue  # a request: never answered
        decision = decide(records.get(envelope.id), event, now_ms, retention_ms)
        if decision.record is None:
            records.pop(envelope.id, None)
        else:
            records[envelope.id] = decision.record
    positions: dict[str, dict[str, Any]] = {}
    request_ids: dict[str, str] = {}
    count = 0
    for kid, record in sorted(records.items(), key=lambda item: item[1].accepted_ms):
        ingress_id = next((i for i in ids if kid.startswith(f"{i}:")), None)
        if ingress_id is None or record.accepted_ms + retention_ms <= now_ms:
            dropped += 1
            continue
        request_id = None
        if record.in_progress:
            request_id = request_ids[kid] = f"{_REQUEST_PREFIX}{len(request_ids)}"
        position = positions.setdefault(ingress_id, {"seq": 0, "keys": {"cut": 0, "entries": []}})
        position["keys"]["entries"].append(_entry(kid[len(ingress_id) + 1 :], record, request_id))
        count += 1
    out = [_uncalled(envelope, request_ids) for envelope in kept]
    later = [t for t in timers if t[3].typename != KEY_TYPENAME]
    return ExportedKeys(rest, out, later, positions, count, dropped)


def _event(envelope: Envelope) -> Reply | DeadLetter | None:
    value = envelope.value
    typename = str(value.typename)
    data = bytes(value.value) if value.has_value else b""
    if typename == REQUEST_TYPENAME:
        return None
    if typename == DEAD_LETTER_TYPENAME:
        try:
            return decode_dead_letter(data)
        except KeyMessageError:
            return None
    caller = envelope.caller
    sender = ("", "") if caller is None else (caller.typename, caller.id)
    return Reply(sender, typename, bool(value.has_value), data)


def _entry(key: str, record: Record, request_id: str | None) -> list[Any]:
    """``record`` as the single-process position's entry fields (``entry_fields``)."""
    entry = Entry(key, record.fingerprint, record.route, record.accepted_ms)
    entry.request_id = request_id
    return entry_fields(entry, record.result)


def _uncalled(envelope: Envelope, request_ids: Mapping[str, str]) -> Envelope:
    """``envelope`` with a key as its caller made single-process: a call in progress's reply
    address, or no caller."""
    caller = envelope.caller
    if caller is None or caller.typename != KEY_TYPENAME:
        return envelope
    request_id = request_ids.get(caller.id)
    reply_to = None if request_id is None else address_of((REPLY_TYPENAME, request_id))
    return Envelope(envelope.typename, envelope.id, envelope.value, reply_to)


# -- the adapters: where the keys are read from ------------------------------------------------


def http_ingress_ids(module: ModuleSpec) -> list[str]:
    return [i.id for i in module.ingresses if isinstance(i, HttpIngressSpec)]


def savepoint_keys(
    module: ModuleSpec,
    settings: Settings,
    path: Path,
    positions: Mapping[str, Any],
    messages: Sequence[Envelope],
) -> SeededKeys:
    """``seed_keys`` of the single-process savepoint at ``path`` (blocking: reads the key
    logs). An ingress's key log is beside its write-ahead log: ``http_wal_dir`` or
    ``<checkpoint_dir>/../http-wal`` when the settings name one, else ``http-wal`` beside the
    savepoint's folder (``<checkpoint_dir>/../savepoints/sp-...``, the default layout)."""
    logged: dict[str, list[list[Any]]] = {}
    for ingress_id in http_ingress_ids(module):
        cut = key_log_cut(positions.get(ingress_id))
        if cut <= 0:
            continue
        directory = wal_dir(settings, ingress_id)
        if directory is None:
            directory = path.parent.parent / "http-wal" / ingress_id.replace("/", "_")
        logged[ingress_id] = read_key_log(directory, cut)
    wanted = {i: p for i, p in positions.items() if i in set(http_ingress_ids(module))}
    return seed_keys(
        wanted,
        logged,
        messages,
        settings.max_parallelism,
        settings.http_idempotency_retention_s * 1000,
        int(time.time() * 1000),
    )
