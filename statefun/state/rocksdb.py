"""RocksDB state (``rocksdict``): state larger than memory, incremental checkpoints.

Layout under the backend's ``path`` (a working copy; durability comes from checkpoints)::

    path/db/        the RocksDB database
    path/staging/   RocksDB checkpoints (hard links) on their way to checkpoint storage

Keys are ``key group (2 bytes, big-endian) | typename length (2 bytes) | typename | id``, so
the addresses of one key group are one prefix scan; values are ``_codec.encode_values``.

Snapshots. A RocksDB checkpoint (hard links of the SST files) is what makes checkpoints
incremental, but creating one flushes the memtable: tens to hundreds of milliseconds, too long
a stall at the cut. So writes go to a small write buffer in Python first (a dict per key
group, flushed to RocksDB in batches of ``flush_every`` writes), and ``snapshot()`` only
freezes that buffer and starts a new one (O(1)). From then on, RocksDB is not written until
the snapshot's ``write()``, in a worker thread, has applied the frozen buffer(s) and created
the RocksDB checkpoint: at that moment the database is exactly the state at the cut. Reads
look at the live buffer, then the frozen ones (newest first), then RocksDB.

``write(directory, previous)`` then copies the checkpoint into ``directory``: SST files are
immutable, so one that ``previous`` already holds (same inode, or same name, size and tail)
is hard-linked from there instead of copied; everything else (new SSTs, MANIFEST, OPTIONS,
CURRENT) is copied and fsynced. Each checkpoint folder is thus complete on its own and may be
deleted in any order. The manifest lists every file and whether it was reused.

Snapshots must be written in the order they were taken (writing a later one first makes the
earlier one fail). A snapshot released without being written leaves its buffer frozen; the
next snapshot's ``write()`` (or ``close()``) moves it into RocksDB.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

from rocksdict import Checkpoint, Options, Rdict, WriteBatch, WriteOptions

from statefun.state._codec import (
    MAX_KEY_GROUPS,
    decode_key,
    decode_values,
    encode_key,
    encode_values,
    key_group_prefix,
)
from statefun.state.base import AddressKey, StateBackend, StateSnapshot, StateValues
from statefun.state.memory import fsync_dir, read_memory_snapshot

__all__ = ["RocksDBStateBackend", "RocksDBStateSnapshot", "read_rocksdb_snapshot"]

log = logging.getLogger(__name__)

FORMAT = 1
#: writes per RocksDB WriteBatch when a worker applies a frozen buffer
_BATCH = 4096
#: bigger than every key: the end of a delete_range that runs to the last key group
_KEYS_END = b"\xff" * 5
_TAIL = 4096

#: key group -> address -> values, or None for a deletion
_Buffer = dict[int, dict[AddressKey, StateValues | None]]


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


def _write_options() -> WriteOptions:
    options = WriteOptions()
    # The database is a working copy restored from checkpoints: no write-ahead log. (The type
    # stub declares disable_wal a method; rocksdict has it as a property.)
    setattr(options, "disable_wal", True)  # noqa: B010
    return options


def _copy_file(source: Path, target: Path) -> None:
    with source.open("rb") as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())


def _link_or_copy(source: Path, target: Path) -> bool:
    """Hard-link ``source`` to ``target`` (True), or copy it where links do not work."""
    try:
        os.link(source, target)
        return True
    except OSError:
        _copy_file(source, target)
        return False


def _tail(path: Path, size: int) -> bytes:
    with path.open("rb") as f:
        f.seek(max(0, size - _TAIL))
        return f.read()


def _same_sst(new: Path, old: Path) -> bool:
    """Whether ``old`` holds the very SST file ``new`` is (SST files are immutable)."""
    try:
        a, b = new.stat(), old.stat()
    except FileNotFoundError:
        return False
    if a.st_size != b.st_size:
        return False
    if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
        return True
    # Copied across file systems: the tail holds the table properties (db session id, file
    # number) and the footer's checksums, different for any other file of the same name.
    return _tail(new, a.st_size) == _tail(old, b.st_size)


def _apply(db: Rdict, buffer: _Buffer, write_options: WriteOptions, limit: int = _BATCH) -> None:
    """Write ``buffer`` into ``db`` in batches of ``limit`` writes."""
    batch = WriteBatch(raw_mode=True)
    count = 0
    for key_group, group in buffer.items():
        for key, values in group.items():
            raw = encode_key(key_group, key)
            if values is None:
                batch.delete(raw)
            else:
                batch.put(raw, encode_values(values))
            count += 1
            if count >= limit:
                db.write(batch, write_options)
                batch = WriteBatch(raw_mode=True)
                count = 0
    if count:
        db.write(batch, write_options)


def _scan(db: Rdict, prefix: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) pairs of a raw-mode database: all, or those under ``prefix``."""
    pairs = db.items() if prefix is None else db.items(from_key=prefix)
    for key, value in pairs:
        raw = cast(bytes, key)
        if prefix is not None and not raw.startswith(prefix):
            return
        yield raw, cast(bytes, value)


def _iter_db(
    db: Rdict, key_groups: Collection[int] | None
) -> Iterator[tuple[int, AddressKey, dict[str, Any]]]:
    prefixes = (
        [None] if key_groups is None else [key_group_prefix(k) for k in sorted(set(key_groups))]
    )
    for prefix in prefixes:
        for raw, data in _scan(db, prefix):
            key_group, key = decode_key(raw)
            yield key_group, key, decode_values(data)


def _install(directory: Path, manifest: Mapping[str, Any], target: Path) -> None:
    """Make ``target`` a RocksDB database holding the checkpoint in ``directory``."""
    target.mkdir(parents=True)
    for entry in manifest["files"]:
        name = entry["name"]
        if name.endswith(".sst"):  # immutable: share the inode
            _link_or_copy(directory / name, target / name)
        else:  # MANIFEST, CURRENT, logs...: RocksDB appends to them
            _copy_file(directory / name, target / name)


def _check_manifest(manifest: Mapping[str, Any]) -> None:
    if manifest.get("backend") != "rocksdb" or manifest.get("format") != FORMAT:
        raise ValueError(
            f"not a rocksdb state snapshot (format {FORMAT}): "
            f"{manifest.get('backend')!r} format {manifest.get('format')!r}"
        )


def read_rocksdb_snapshot(
    directory: Path, manifest: Mapping[str, Any], key_groups: Collection[int] | None
) -> Iterator[tuple[int, AddressKey, dict[str, Any]]]:
    """Every address of a rocksdb-format snapshot in ``key_groups`` (None: all).

    Opens a scratch copy (hard links) so that the checkpoint itself is never written.
    """
    _check_manifest(manifest)
    scratch = Path(tempfile.mkdtemp(prefix="statefun-rocksdb-read-"))
    try:
        _install(directory, manifest, scratch / "db")
        db = Rdict(str(scratch / "db"), _options())
        try:
            yield from _iter_db(db, key_groups)
        finally:
            db.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class RocksDBStateBackend(StateBackend):
    """Keyed state in RocksDB, with a small write buffer in front (see the module docstring).

    ``keep_existing=False`` (the default) starts from an empty database, as a job does before
    it restores its last checkpoint; ``True`` reopens what a previous ``close()`` left.
    """

    def __init__(
        self, path: str | Path, *, flush_every: int = 1024, keep_existing: bool = False
    ) -> None:
        self.path = Path(path)
        self._db_path = self.path / "db"
        self._staging = self.path / "staging"
        if not keep_existing:
            shutil.rmtree(self._db_path, ignore_errors=True)
        shutil.rmtree(self._staging, ignore_errors=True)
        self.path.mkdir(parents=True, exist_ok=True)
        self._write_options = _write_options()
        self._db = Rdict(str(self._db_path), _options())
        self._flush_every = flush_every
        self._pending: _Buffer = {}
        self._puts = 0
        #: buffers of snapshots not yet in RocksDB, oldest first (rebound, never mutated)
        self._frozen: tuple[_Buffer, ...] = ()
        self._frozen_lock = threading.Lock()  # held briefly: rebinding _frozen
        self._write_lock = threading.Lock()  # held while RocksDB must stay at a cut
        self._closed = False

    # -- reads and writes ---------------------------------------------------------------------

    def get(self, key_group: int, key: AddressKey) -> StateValues | None:
        group = self._pending.get(key_group)
        if group is not None and key in group:
            return group[key]
        for buffer in reversed(self._frozen):  # the tuple is read once, before RocksDB
            group = buffer.get(key_group)
            if group is not None and key in group:
                return group[key]
        raw = self._db.get(encode_key(key_group, key))
        return None if raw is None else decode_values(raw)

    def put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        group = self._pending.get(key_group)
        if group is None:
            group = self._pending[key_group] = {}
        group[key] = values if values else None
        self._puts += 1
        if self._puts >= self._flush_every and not self._frozen:
            self._flush_pending(2 * self._flush_every)

    def _flush_pending(self, limit: int) -> None:
        """Move up to ``limit`` buffered writes into RocksDB (event loop, no cut pending)."""
        pending = self._pending
        batch = WriteBatch(raw_mode=True)
        count = 0
        while pending and count < limit:
            key_group = next(iter(pending))
            group = pending[key_group]
            room = limit - count
            if len(group) <= room:
                del pending[key_group]
                moved = list(group.items())
            else:
                moved = [(key, group.pop(key)) for key in list(itertools.islice(group, room))]
            for key, values in moved:
                raw = encode_key(key_group, key)
                if values is None:
                    batch.delete(raw)
                else:
                    batch.put(raw, encode_values(values))
            count += len(moved)
        if count:
            self._db.write(batch, self._write_options)
        self._puts = 0

    def items(self, key_group: int) -> Iterator[tuple[AddressKey, StateValues]]:
        frozen = self._frozen  # before RocksDB: a buffer leaves it only once it is in RocksDB
        merged: dict[AddressKey, StateValues | None] = {}
        prefix = key_group_prefix(key_group)
        for raw, data in _scan(self._db, prefix):
            merged[decode_key(raw)[1]] = decode_values(data)
        for buffer in (*frozen, self._pending):
            group = buffer.get(key_group)
            if group:
                merged.update(group)
        return iter([(key, values) for key, values in merged.items() if values])

    def key_groups(self) -> list[int]:
        frozen = self._frozen
        stored: set[int] = set()
        iterator = self._db.iter()
        iterator.seek_to_first()
        while iterator.valid():
            key_group = decode_key(iterator.key())[0]
            stored.add(key_group)
            if key_group + 1 >= MAX_KEY_GROUPS:
                break
            iterator.seek(key_group_prefix(key_group + 1))
        del iterator
        buffered: set[int] = set()
        for buffer in (*frozen, self._pending):
            buffered.update(k for k, group in buffer.items() if group)
        result = stored - buffered
        result.update(k for k in buffered if next(self.items(k), None) is not None)
        return sorted(result)

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> RocksDBStateSnapshot:
        buffer = self._pending
        self._pending = {}
        self._puts = 0
        with self._frozen_lock:
            self._frozen = (*self._frozen, buffer)
        return RocksDBStateSnapshot(self, buffer)

    def _checkpoint(self, buffer: _Buffer) -> Path:
        """Apply the frozen buffers up to ``buffer`` and checkpoint RocksDB (worker thread)."""
        with self._write_lock:
            frozen = self._frozen
            index = next((i for i, b in enumerate(frozen) if b is buffer), None)
            if index is None:
                raise RuntimeError(
                    "this state snapshot was already written, or a later one was written first"
                )
            for older in frozen[: index + 1]:
                _apply(self._db, older, self._write_options)
            self._staging.mkdir(parents=True, exist_ok=True)
            staging = self._staging / f"chk-{uuid.uuid4().hex}"
            Checkpoint(self._db).create_checkpoint(str(staging))
            with self._frozen_lock:
                self._frozen = self._frozen[index + 1 :]
            return staging

    def _apply_frozen(self) -> None:
        with self._write_lock:
            for buffer in self._frozen:
                _apply(self._db, buffer, self._write_options)
            with self._frozen_lock:
                self._frozen = ()

    def restore(
        self,
        directory: Path,
        manifest: Mapping[str, Any],
        key_groups: Collection[int] | None = None,
    ) -> None:
        started = time.perf_counter()
        self._apply_frozen()
        self._flush_pending(1 << 62)
        if manifest.get("backend") == "rocksdb" and self._is_empty():
            _check_manifest(manifest)
            # Fast path: the checkpoint becomes the database (SSTs hard-linked), and the key
            # groups not asked for are dropped with range deletions.
            self._db.close()
            shutil.rmtree(self._db_path)
            _install(directory, manifest, self._db_path)
            self._db = Rdict(str(self._db_path), _options())
            if key_groups is not None:
                self._delete_other_key_groups(set(key_groups))
            how = "installed"
        else:
            if manifest.get("backend") == "rocksdb":
                entries = read_rocksdb_snapshot(directory, manifest, key_groups)
            else:
                entries = read_memory_snapshot(directory, manifest, key_groups)
            batch = WriteBatch(raw_mode=True)
            count = 0
            for key_group, key, values in entries:
                batch.put(encode_key(key_group, key), encode_values(values))
                count += 1
                if count % _BATCH == 0:
                    self._db.write(batch, self._write_options)
                    batch = WriteBatch(raw_mode=True)
            self._db.write(batch, self._write_options)
            how = f"loaded {count} address(es)"
        log.info(
            "restored rocksdb state from %s (%s) in %.3f s",
            directory,
            how,
            time.perf_counter() - started,
        )

    def _is_empty(self) -> bool:
        iterator = self._db.iter()
        iterator.seek_to_first()
        return not iterator.valid()

    def _delete_other_key_groups(self, keep: set[int]) -> None:
        start = 0
        for key_group in [*sorted(k for k in keep if 0 <= k < MAX_KEY_GROUPS), MAX_KEY_GROUPS]:
            if key_group > start:
                end = _KEYS_END if key_group >= MAX_KEY_GROUPS else key_group_prefix(key_group)
                self._db.delete_range(key_group_prefix(start), end, self._write_options)
            start = key_group + 1

    def close(self) -> None:
        if self._closed:
            return
        self._apply_frozen()
        self._flush_pending(1 << 62)
        self._db.flush()
        self._db.close()
        shutil.rmtree(self._staging, ignore_errors=True)
        self._closed = True


class RocksDBStateSnapshot(StateSnapshot):
    """A frozen write buffer, then a RocksDB checkpoint (see the module docstring)."""

    def __init__(self, backend: RocksDBStateBackend, buffer: _Buffer) -> None:
        self._backend: RocksDBStateBackend | None = backend
        self._buffer = buffer

    def write(self, directory: Path, previous: Path | None = None) -> dict[str, Any]:
        backend = self._backend
        if backend is None:
            raise RuntimeError("this state snapshot was released")
        staging = backend._checkpoint(self._buffer)
        try:
            return self._upload(staging, directory, previous)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @staticmethod
    def _upload(staging: Path, directory: Path, previous: Path | None) -> dict[str, Any]:
        directory.mkdir(parents=True, exist_ok=True)
        files: list[dict[str, Any]] = []
        copied = [0, 0]
        reused = [0, 0]
        for name in sorted(os.listdir(staging)):
            source = staging / name
            size = source.stat().st_size
            target = directory / name
            target.unlink(missing_ok=True)
            shared = False
            old = None if previous is None else previous / name
            if old is not None and name.endswith(".sst") and _same_sst(source, old):
                try:
                    os.link(old, target)
                    shared = True
                except OSError:
                    pass
            if not shared:
                _copy_file(source, target)
            tally = reused if shared else copied
            tally[0] += 1
            tally[1] += size
            files.append({"name": name, "size": size, "reused": shared})
        fsync_dir(directory)
        return {
            "backend": "rocksdb",
            "format": FORMAT,
            "files": files,
            "copied_files": copied[0],
            "copied_bytes": copied[1],
            "reused_files": reused[0],
            "reused_bytes": reused[1],
        }

    def release(self) -> None:
        # An unwritten snapshot's buffer stays frozen: the next write() or close() applies it.
        self._backend = None
