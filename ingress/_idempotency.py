"""Idempotency keys of the HTTP ingress: a repeated request is answered, not processed again.

A request may carry an ``Idempotency-Key`` header (1-255 printable ASCII characters). Keys are
scoped to one ingress: the key names one request, identified by its *fingerprint* (a hash of
the route - ``messages`` or ``call`` -, the target address, the value's typename and bytes).

* A key seen for the first time: the request is processed and its outcome recorded - for
  ``/messages`` the 202, for ``/call`` the function's reply.
* A key seen before with the same fingerprint: the recorded outcome is answered again (with
  ``Idempotent-Replayed: true``); while the first request is still in progress, the repeat
  waits for its outcome (up to the reply timeout), so both callers get the same reply and the
  function runs once.
* A key seen before with another fingerprint: 422, nothing is processed.
* A request that was refused before its message entered the runtime (503 too busy, the job
  stopping) leaves no key behind: its retry is processed.

``KeyStore`` (``_keystore.py``) keeps keys in memory, oldest first, for ``retention_ms`` and
at most ``max_keys`` of them (and ``max_reply_bytes`` of recorded replies); past the bounds
the oldest go.

Durability (with checkpoints, ``IdempotentRequests`` with a directory): a key is recorded as
part of the cut that covers its message, so that after a crash a key is known exactly when the
restored job holds its message or its effects:

* ``/messages`` (and ``/call`` with ``reply_release=immediate``) go through the write-ahead
  log; the WAL record carries the key, so a key is durable with its 202. On start every key in
  the WAL is read again.
* At each cut the keys completed since the previous one, the calls whose message is inside
  the runtime (with their request id) and the replies held for the cut (``reply_release=
  on-checkpoint``) go into the ingress's checkpointed position (a call whose reply is out,
  its future's callbacks not run yet, counts as completed). After a restore a call that
  was in flight is in progress again: the restored message is processed and its reply is
  recorded for the key (a retry waits for it); a held reply is the key's recorded reply.
* When a checkpoint completes, the keys it covers are appended to the key log
  (``keys-<n>.log`` next to the WAL segments, CRC-framed msgpack records tagged with the
  cut's number) before WAL segments are trimmed; files whose keys all expired or fell out of
  the bound are deleted. A restore from an older checkpoint drops the keys of later cuts.

Without checkpoints keys live in memory only and are lost with the process.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from statefun._http.server import Reply, plain
from statefun.ingress._keystore import (
    ACCEPTED,
    Entry,
    KeyLog,
    KeyStore,
    check_key,
    fingerprint,
)
from statefun.sdk._types import TypedValue

__all__ = ["HEADER", "HEADER_KEY", "IdempotentRequests", "entry_fields", "entry_of"]

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
HEADER_KEY = HEADER.lower()  # as Request.headers has it
REPLAYED = (("Idempotent-Replayed", "true"),)
_ACCEPTED_AGAIN = plain(202, "accepted", REPLAYED)
Result = Any  # ACCEPTED, or (typename, has_value, value bytes) of a reply


def _result_of(value: Any) -> Result:
    """The recorded form of a reply value (a TypedValue)."""
    has_value = bool(value.has_value)
    return (str(value.typename), has_value, bytes(value.value) if has_value else b"")


def _result_from(raw: Any) -> Result:
    if raw is None or raw == ACCEPTED:
        return raw
    typename, has_value, value = raw
    return (str(typename), bool(has_value), bytes(value))


def reply_value(result: Result) -> TypedValue:
    """A recorded reply as the value the function sent."""
    typename, has_value, value = result
    return TypedValue(typename, value if has_value else None)


class IdempotentRequests:
    """The HTTP ingress's keys: answering repeats, and keeping keys across crashes."""

    def __init__(
        self,
        ingress_id: str,
        retention_s: float,
        max_keys: int,
        max_reply_bytes: int,
        directory: Path | None,
        replies: dict[str, asyncio.Future[Any]],
        held_replies: Callable[[], Sequence[tuple[str, Any]]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ingress_id = ingress_id
        self.retention_ms = int(retention_s * 1000)
        self.store = KeyStore(self.retention_ms, max_keys, max_reply_bytes, self._evicted)
        self.log = KeyLog(directory) if directory is not None else None
        self.replies = replies
        self._held_replies = held_replies
        self._clock = clock
        self._pending: list[Entry] = []  # completed since the last cut
        self._sealed: list[Entry] = []  # completed before a cut; not in the key log yet
        self._calls: dict[str, Entry] = {}  # request id -> call whose message is inside
        self._cut = 0
        self._restored: list[list[Any]] = []
        self.replayed = 0  # repeats answered from a recorded outcome

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- answering ---------------------------------------------------------------------------

    async def answer(
        self,
        key: str,
        route: str,
        typename: str,
        id_: str,
        value: Any,
        run: Callable[[Entry], Awaitable[Reply]],
        reply_of: Callable[[Any], Reply],
        timeout_s: float,
        explain: Callable[[str], str] | None = None,
    ) -> Reply:
        """The reply to a request carrying ``key``: ``run(entry)`` processes a new one.
        ``explain(request id)`` says why a call in progress has no reply yet (in the 504 a
        repeat gets when it has waited ``timeout_s``)."""
        problem = check_key(key)
        if problem is not None:
            return plain(400, f"bad {HEADER} header: {problem}")
        fp = fingerprint(route, typename, id_, value)
        while True:
            entry = self.store.get(key, self.now_ms())
            if entry is None:
                return await self._first(self.store.begin(key, fp, route, self.now_ms()), run)
            if entry.fingerprint != fp:
                return plain(
                    422,
                    f"{HEADER} {key!r} was used for another request (route, address or body "
                    "differ); a new request needs a new key",
                )
            result = entry.result
            try:
                if result is None:  # in progress: wait for its outcome
                    result = await asyncio.wait_for(self.store.wait(entry), timeout_s)
            except TimeoutError:
                return plain(504, self._in_progress(key, entry, explain))
            if result is None:
                continue  # the first attempt was not processed: this one may be
            self.replayed += 1
            if result == ACCEPTED:
                return _ACCEPTED_AGAIN
            reply = reply_of(reply_value(result))
            return reply._replace(headers=reply.headers + REPLAYED)

    @staticmethod
    def _in_progress(key: str, entry: Entry, explain: Callable[[str], str] | None) -> str:
        why = ""
        if not entry.emitted:
            why = ": its message has not entered the runtime yet"
        elif entry.request_id is not None and explain is not None:
            why = ": " + explain(entry.request_id)
        return f"the request with {HEADER} {key!r} is still in progress{why}; retry later"

    async def _first(self, entry: Entry, run: Callable[[Entry], Awaitable[Reply]]) -> Reply:
        try:
            reply = await run(entry)
        except BaseException:
            if not entry.emitted:
                self.store.abandon(entry)
            raise
        if not entry.emitted:
            self.store.abandon(entry)  # refused before its message entered the runtime
        return reply

    # -- the request's progress (called by the ingress) -------------------------------------

    def wal_fields(self, entry: Entry) -> list[Any]:
        """What a WAL record carries of the key."""
        return [entry.key, entry.fingerprint, entry.accepted_ms]

    def calling(self, entry: Entry, request_id: str, future: asyncio.Future[Any]) -> None:
        """``entry`` is a call answered by ``future`` (kept until the reply, even if the
        caller leaves)."""
        entry.request_id = request_id
        entry.reply = future
        future.add_done_callback(lambda done: self._replied(entry, done))

    def emitted(self, key: str, request_id: str | None, fields: list[Any] | None = None) -> None:
        """The message of the request with ``key`` entered the runtime (in the loop step it
        did). A /messages request is done; a call is in flight until its reply. ``fields``
        (from ``wal_fields``) bring back a /messages key whose request was cancelled while
        its WAL record was being written (the job stopping): the record counts."""
        entry = self.store.peek(key)
        if entry is None and fields is not None and request_id is None:
            _, fp, accepted_ms = fields
            entry = self.store.put(Entry(key, bytes(fp), "messages", int(accepted_ms)))
        if entry is None or entry.emitted:
            return
        entry.emitted = True
        if request_id is None:
            self._complete(entry, ACCEPTED)
        else:
            self._calls[request_id] = entry

    def _replied(self, entry: Entry, future: asyncio.Future[Any]) -> None:
        if entry.request_id is not None:
            self._calls.pop(entry.request_id, None)
        entry.reply = None  # (the reply's value is kept as the result's bytes)
        if entry.result is not None:
            return  # recorded already, by a cut that came before this callback
        if future.cancelled():
            return  # the job stops; a checkpoint holds the call
        if future.exception() is not None:
            self.store.abandon(entry)
            return
        self._complete(entry, _result_of(future.result()))

    def _complete(self, entry: Entry, result: Result) -> None:
        self.store.complete(entry, result)
        if self.log is not None:
            self._pending.append(entry)

    def _evicted(self, entry: Entry) -> None:
        if entry.result is None and entry.request_id is not None:
            self._calls.pop(entry.request_id, None)
            if entry.orphan:
                future = self.replies.pop(entry.request_id, None)
                if future is not None:
                    future.cancel()

    # -- durability --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any] | None:
        """At a cut: the keys no complete checkpoint's log holds, and calls in flight."""
        if self.log is None:
            return None
        # A checkpoint releases its replies and the next one may be cut in the same loop
        # step, before the futures' callbacks ran: a call whose reply is out is complete.
        for entry in list(self._calls.values()):
            reply = entry.reply
            if reply is not None and reply.done():
                self._replied(entry, reply)
        self._cut += 1
        for entry in self._pending:
            entry.tag = self._cut
        self._sealed.extend(self._pending)
        self._pending = []
        entries = [entry_fields(entry, entry.result) for entry in self._sealed]
        if self._calls:
            held = dict(self._held_replies()) if self._held_replies is not None else {}
            for request_id, entry in self._calls.items():
                reply = held.get(request_id)
                entries.append(entry_fields(entry, None if reply is None else _result_of(reply)))
        return {"cut": self._cut, "entries": entries}

    def restore(self, state: Any) -> None:
        """The state from ``snapshot`` of the cut restored (before ``load``)."""
        if isinstance(state, dict):
            self._cut = int(state.get("cut", 0))
            self._restored = list(state.get("entries", ()))

    def read_log(self) -> list[list[Any]]:
        """The key log's records of the restored cut and before (blocking: a worker thread)."""
        return [] if self.log is None else self.log.load(self._cut)

    def load(
        self, logged: Iterable[list[Any]], wal_records: Iterable[list[Any]], position: int
    ) -> None:
        """After a restart, before any request: the key log's records (``read_log``), the
        restored cut's keys, and the keys of WAL records (those after ``position`` are
        replayed)."""
        if self.log is None:
            return
        now = self.now_ms()
        for tag, key, fp, route, accepted_ms, request_id, result in logged:
            entry = Entry(key, bytes(fp), route, int(accepted_ms))
            entry.result, entry.request_id, entry.tag = _result_from(result), request_id, tag
            entry.emitted = True
            self.store.put(entry)
        for raw in self._restored:
            self._restore_entry(entry_of(raw))
        self._restored = []
        for record in wal_records:
            if len(record) < 8:
                continue  # no key (or written before keys were kept)
            key, fp, accepted_ms = record[7]
            caller = record[3]
            known = self.store.peek(key)
            if known is not None and (known.result is not None or known.emitted):
                continue
            entry = Entry(key, bytes(fp), "messages" if caller is None else "call", accepted_ms)
            if caller is None:
                entry.emitted = True
                self.store.put(entry)
                self._complete(entry, ACCEPTED)
            elif record[0] > position:  # a call replayed from the WAL
                entry.request_id = caller[2]
                self._restore_entry(entry)
        self.store.expire(now)
        if len(self.store) or self._calls:
            log.info(
                "ingress %s: %d idempotency key(s) restored, %d call(s) in progress",
                self.ingress_id,
                len(self.store),
                len(self._calls),
            )

    def _restore_entry(self, entry: Entry) -> None:
        entry.emitted = True
        self.store.put(entry)
        if entry.result is not None:
            self._pending.append(entry)  # into the key log with the next checkpoint
            return
        # A call whose message the restored job holds: its reply is recorded for the key.
        assert entry.request_id is not None
        entry.orphan = True
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.replies[entry.request_id] = future
        entry.reply = future
        self._calls[entry.request_id] = entry
        future.add_done_callback(lambda done: self._replied(entry, done))

    def sealed_records(self) -> list[list[Any]]:
        """The key-log records of the keys the completed checkpoint covers (on the loop)."""
        records = [_record(entry) for entry in self._sealed]
        self._sealed = []
        return records

    def write_log(self, records: list[list[Any]]) -> None:
        """Append to the key log and drop old files (blocking: in a worker thread)."""
        if self.log is None:
            return
        self.log.append(records)
        self.log.prune(self.now_ms(), self.retention_ms, self.store.max_keys)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def _record(entry: Entry) -> list[Any]:
    return [
        entry.tag,
        entry.key,
        entry.fingerprint,
        entry.route,
        entry.accepted_ms,
        entry.request_id,
        list(entry.result) if isinstance(entry.result, tuple) else entry.result,
    ]


def entry_fields(entry: Entry, result: Result) -> list[Any]:
    """An entry as JSON-able fields (checkpoint metadata is JSON): ``[key, fingerprint hex,
    route, accepted ms, request id, result]``, the result None (in progress), ``ACCEPTED`` or
    ``[typename, has value, base64 bytes]``."""
    encoded: Any = result
    if isinstance(result, tuple):
        typename, has_value, value = result
        encoded = [typename, has_value, base64.b64encode(value).decode("ascii")]
    return [
        entry.key,
        entry.fingerprint.hex(),
        entry.route,
        entry.accepted_ms,
        entry.request_id,
        encoded,
    ]


def entry_of(fields: list[Any]) -> Entry:
    key, fp, route, accepted_ms, request_id, result = fields
    entry = Entry(key, bytes.fromhex(fp), route, int(accepted_ms))
    entry.request_id = request_id
    if isinstance(result, list):
        typename, has_value, value = result
        entry.result = (typename, bool(has_value), base64.b64decode(value))
    else:
        entry.result = result
    return entry
