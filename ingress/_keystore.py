"""Idempotency keys in memory and on disk: ``KeyStore`` (bounded, oldest first) and
``KeyLog`` (the keys complete checkpoints covered, in files beside the HTTP ingress's WAL).

A key names one request, identified by its fingerprint (``fingerprint``). An ``Entry`` holds
the fingerprint and, once known, the outcome: ``ACCEPTED`` for ``/messages``, the reply
(typename, has_value, bytes) for ``/call``. How the ingress uses them: ``_idempotency.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from statefun._files import fsync_dir, write_atomically
from statefun.ingress._wal import frame, read_frames

__all__ = [
    "ACCEPTED",
    "MAX_KEY_LENGTH",
    "Entry",
    "KeyLog",
    "KeyStore",
    "check_key",
    "fingerprint",
    "read_key_log",
]

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 255
#: the recorded outcome of a /messages request (a /call's is (typename, has_value, bytes))
ACCEPTED = 1

Result = Any  # ACCEPTED, or (typename, has_value, value bytes) of a reply


def check_key(key: str) -> str | None:
    """What is wrong with an ``Idempotency-Key`` value, or None."""
    if not key:
        return "the key is empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"the key has {len(key)} characters, more than {MAX_KEY_LENGTH}"
    if not (key.isascii() and key.isprintable()):
        return "the key must be printable ASCII"
    return None


def fingerprint(route: str, typename: str, id_: str, value: Any) -> bytes:
    """What identifies a request beyond its key (16 bytes)."""
    # each part after its length (no two requests read the same), then the value's bytes
    vt = str(value.typename)
    head = (
        f"{len(route)}:{route}{len(typename)}:{typename}{len(id_)}:{id_}{len(vt)}:{vt}"
        f"{1 if value.has_value else 0}"
    )
    digest = hashlib.blake2b(head.encode("utf-8"), digest_size=16)
    if value.has_value:
        digest.update(value.value)
    return digest.digest()


class Entry:
    """One key: its request's fingerprint and, once known, its outcome."""

    __slots__ = (
        "_waiters",
        "accepted_ms",
        "emitted",
        "fingerprint",
        "key",
        "orphan",
        "reply",
        "request_id",
        "result",
        "route",
        "tag",
    )

    def __init__(self, key: str, fingerprint: bytes, route: str, accepted_ms: int) -> None:
        self.key = key
        self.fingerprint = fingerprint
        self.route = route
        self.accepted_ms = accepted_ms
        self.result: Result = None  # None while in progress
        self.request_id: str | None = None  # of a call
        self.emitted = False  # its message entered the runtime
        self.orphan = False  # a call restored in progress: no caller of this process waits
        self.reply: asyncio.Future[Any] | None = None  # of a call: what its reply completes
        self.tag = 0  # the cut that covers it
        self._waiters: asyncio.Future[Result] | None = None


def _reply_size(result: Result) -> int:
    return len(result[2]) if isinstance(result, tuple) else 0


class KeyStore:
    """Keys in memory, oldest first: kept ``retention_ms``, at most ``max_keys`` of them and
    ``max_reply_bytes`` of recorded replies (the oldest go first)."""

    def __init__(
        self,
        retention_ms: int,
        max_keys: int,
        max_reply_bytes: int,
        on_evict: Callable[[Entry], None] | None = None,
    ) -> None:
        self.retention_ms = retention_ms
        self.max_keys = max_keys
        self.max_reply_bytes = max_reply_bytes
        self.reply_bytes = 0
        self.evicted = 0
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now_ms: int) -> Entry | None:
        self.expire(now_ms)
        return self._entries.get(key)

    def peek(self, key: str) -> Entry | None:
        """The entry of ``key`` without expiring anything."""
        return self._entries.get(key)

    def begin(self, key: str, fingerprint: bytes, route: str, now_ms: int) -> Entry:
        """A new entry in progress (replacing one of the same key)."""
        return self.put(Entry(key, fingerprint, route, now_ms))

    def put(self, entry: Entry) -> Entry:
        old = self._entries.pop(entry.key, None)
        if old is not None:
            self.reply_bytes -= _reply_size(old.result)
        self._entries[entry.key] = entry
        self.reply_bytes += _reply_size(entry.result)
        self._bound()
        return entry

    def complete(self, entry: Entry, result: Result) -> None:
        """The outcome of ``entry``'s request: recorded, and its waiters hear it."""
        entry.result = result
        if self._entries.get(entry.key) is entry:
            self.reply_bytes += _reply_size(result)
            self._bound()
        if entry._waiters is not None and not entry._waiters.done():
            entry._waiters.set_result(result)

    def abandon(self, entry: Entry) -> None:
        """``entry``'s request was not processed: forget the key; waiters hear None."""
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        if entry._waiters is not None and not entry._waiters.done():
            entry._waiters.set_result(None)

    async def wait(self, entry: Entry) -> Result:
        """The outcome of ``entry``'s request (None: it was not processed)."""
        if entry.result is not None:
            return entry.result
        if entry._waiters is None:
            entry._waiters = asyncio.get_running_loop().create_future()
        return await asyncio.shield(entry._waiters)

    def expire(self, now_ms: int) -> None:
        entries = self._entries
        horizon = now_ms - self.retention_ms
        while entries:
            entry = next(iter(entries.values()))
            if entry.accepted_ms > horizon:
                return
            self._drop_oldest()

    def _bound(self) -> None:
        while len(self._entries) > self.max_keys or (
            self.reply_bytes > self.max_reply_bytes and self._entries
        ):
            self._drop_oldest()
            self.evicted += 1

    def _drop_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.reply_bytes -= _reply_size(entry.result)
        if self._on_evict is not None:
            self._on_evict(entry)

    def entries(self) -> Iterable[Entry]:
        return self._entries.values()


def _log_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob("keys-*.log"), key=lambda p: int(p.stem[5:]))


def read_key_log(directory: Path, max_tag: int) -> list[list[Any]]:
    """The key log's records in ``directory`` of cuts up to ``max_tag``, oldest first, read
    without changing a file (what ``KeyLog.load`` keeps); none when there is no log."""
    if not directory.is_dir():
        return []
    return [
        record
        for path in _log_paths(directory)
        for _, record in read_frames(path)
        if record[0] <= max_tag
    ]


class KeyLog:
    """Completed keys on disk: ``keys-<n>.log`` files of framed records
    ``[tag, key, fingerprint, route, accepted_ms, request_id, result]``, appended and fsynced
    once per checkpoint; a file goes when its keys expired or fell out of the bound.
    Blocking: called in a worker thread."""

    def __init__(self, directory: Path, segment_bytes: int = 16 << 20) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self._file: Any = None
        self._size = 0
        #: per file, oldest first: [path, number of records, newest accepted_ms]
        self._files: list[list[Any]] = []

    def _paths(self) -> list[Path]:
        return _log_paths(self.directory)

    def load(self, max_tag: int) -> list[list[Any]]:
        """Open the log and return its records, oldest first, without those of cuts after
        ``max_tag`` (a restore from an older checkpoint): those are deleted from the files."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.close()
        self._files = []
        kept_all: list[list[Any]] = []
        for path in self._paths():
            records = []
            good = 0
            for good, record in read_frames(path):  # noqa: B007 - the last offset is wanted
                records.append(record)
            kept = [r for r in records if r[0] <= max_tag]
            if len(kept) < len(records) or good < path.stat().st_size:
                if len(kept) < len(records):
                    log.info(
                        "%s: dropping %d key(s) of cuts after the restored one",
                        path,
                        len(records) - len(kept),
                    )
                else:
                    log.warning("%s: cutting off a torn record at byte %d", path, good)
                write_atomically(path, b"".join(frame(r) for r in kept))
            newest = max((r[4] for r in kept), default=0)
            self._files.append([path, len(kept), newest])
            kept_all.extend(kept)
        if self._files:
            last = self._files[-1][0]
            self._file = last.open("ab")
            self._size = last.stat().st_size
        else:
            self._new_file()
        return kept_all

    def open(self) -> None:
        self.load(max_tag=1 << 62)

    def _new_file(self) -> None:
        if self._file is not None:
            self._file.close()
        number = int(self._files[-1][0].stem[5:]) + 1 if self._files else 1
        path = self.directory / f"keys-{number:012d}.log"
        self._file = path.open("ab")
        self._size = 0
        self._files.append([path, 0, 0])
        fsync_dir(self.directory)

    def append(self, records: Sequence[list[Any]]) -> None:
        if not records:
            return
        if self._file is None:
            self.open()
        if self._size >= self.segment_bytes:
            self._new_file()
        data = b"".join(frame(record) for record in records)
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._size += len(data)
        info = self._files[-1]
        info[1] += len(records)
        info[2] = max(info[2], max(r[4] for r in records))

    def prune(self, now_ms: int, retention_ms: int, max_keys: int) -> int:
        """Delete old files (never the one appended to) whose keys all expired, or that only
        hold keys older than the newest ``max_keys``; how many were deleted."""
        deleted = 0
        while len(self._files) > 1:
            path, _, newest = self._files[0]
            newer = sum(info[1] for info in self._files[1:])
            if newest + retention_ms > now_ms and newer < max_keys:
                break
            path.unlink(missing_ok=True)
            self._files.pop(0)
            deleted += 1
        return deleted

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
