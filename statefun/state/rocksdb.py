"""RocksDB state (``rocksdict``): state larger than memory, log-based incremental checkpoints.

Interfaces: ``RocksDBStateBackend`` is a ``StateBackend`` (``state/base.py``); its
``snapshot()`` gives a ``RocksDBStateSnapshot`` whose ``write(directory, previous)`` returns
the manifest that ``restore`` takes back, and that ``read_rocksdb_snapshot`` reads for other
backends (through ``state/_registry.py``: the memory backend restores RocksDB checkpoints
with it). Knobs (constructor):
``flush_every`` (the write buffer), ``max_deltas``, ``max_delta_bytes`` and ``max_delta_keys``
(when a checkpoint materializes, below), ``keep_existing`` (reopen what ``close`` left).

Layout under the backend's ``path`` (a working copy; durability comes from checkpoints)::

    path/db/        the RocksDB database
    path/staging/   RocksDB checkpoints (hard links) on their way to checkpoint storage

and of a checkpoint's ``state/`` folder, the files of one chain (``_changelog.Chain``)::

    000012.sst, MANIFEST-000009, CURRENT, OPTIONS-000011   the last materialization ("files")
    delta-<chain>.msgpack          the deltas since, appended in order ("log": its first
                                   "size" bytes hold this checkpoint's "deltas")

Keys are ``key group (2 bytes, big-endian) | typename length (2 bytes) | typename | id``, so
the addresses of one key group are one prefix scan; values are ``_codec.encode_values``.

Writes go to a small write buffer in Python first (a dict per key group), moved into RocksDB
in batches of ``flush_every`` writes while no snapshot is pending; the keys so moved since the
last snapshot are remembered (up to ``max_delta_keys``) because the next delta must hold them.
Reads look at the live buffer, then the frozen ones (newest first), then RocksDB.

Checkpoints, in the spirit of Flink's changelog state backend (FLIP-158): a RocksDB checkpoint
(memtable flush, hard links, MANIFEST copy, fsyncs) is too slow to take at every checkpoint
when they run back to back, so most checkpoints write only a delta - what changed since the
previous snapshot - and link the rest from the previous checkpoint:

1. ``snapshot()`` (at the cut, O(1)) freezes the write buffer and the moved keys, and starts
   new ones. From then on RocksDB is not written until the snapshot's ``write()`` has applied
   the frozen buffer(s).
2. ``write(directory, previous)`` (worker thread) **materializes** - applies the frozen
   buffers, creates a RocksDB checkpoint and copies it into ``directory``, hard-linking the
   SST files ``previous`` already holds (same inode, or same name, size and tail) - when
   there is no chain to extend: the first snapshot, after ``restore``, after a failed write,
   without ``previous``, when ``previous`` lacks the chain's files, when more than
   ``max_delta_keys`` keys moved, or when the chain reached ``max_deltas`` deltas or
   ``max_delta_bytes``. Otherwise it writes a **delta**: hard-links the chain's files from
   ``previous`` (``Chain.link``: the materialized files and the chain's one changelog file,
   however many deltas it holds), applies the frozen buffers to RocksDB (which stays the
   current state, so reads are right and the next materialization is complete), collects
   their entries and the moved keys' values into one delta appended to the changelog, and
   fsyncs it and the folder - or, through ``write_unsynced``, leaves both fsyncs to the
   checkpoint, which makes them durable in one round with its own files.
   The manifest (plain data) lists the files, the changelog's size and number of deltas, and
   whether (and why) this checkpoint materialized.
3. ``restore`` installs the materialized files as the database (SSTs hard-linked) and
   replays the deltas in order (later wins, a nil value deletes); ``read_rocksdb_snapshot``
   does the same in a scratch copy. Both keep only the key groups asked for.

Each checkpoint folder is thus complete on its own and may be deleted in any order.

Snapshots must be written in the order they were taken (writing a later one first makes the
earlier one fail). A snapshot released without being written leaves its buffer frozen: the
next snapshot's ``write()`` applies it and puts its entries in that delta, so none is lost
(``close()`` and ``restore()`` apply it too, and the next checkpoint materializes).

Used write-through (a clustered worker's copy of its changelog, ``cluster/_local_state.py``),
the write buffer is what is not durable elsewhere yet: ``write_through`` writes the buffers
frozen up to a snapshot into RocksDB with raw entries of the caller in one write batch, and
``discard_unwritten`` drops them; no checkpoint is written then.

The module stays whole (about 900 lines, a third of it this description): the backend class
is one state machine over the write buffer, the frozen buffers and the chain, and the small
file helpers above it (copying and linking SSTs, installing and replaying a checkpoint) serve
only it; the delta files and chains are apart already (``_changelog.py``), and so is the
key and value encoding (``_codec.py``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Collection, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from rocksdict import Checkpoint, Options, Rdict, WriteBatch, WriteOptions

from statefun._checksums import PREFIX, FileSum, HashingWriter, file_sum
from statefun._files import fsync_dir, fsync_path, synced_file
from statefun.state._changelog import (
    Chain,
    Identity,
    append_delta,
    file_identity,
    read_delta,
    read_log,
)
from statefun.state._codec import (
    MAX_KEY_GROUPS,
    decode_key,
    decode_values,
    encode_key,
    encode_values,
    key_group_prefix,
)
from statefun.state._registry import BackendKind, read_snapshot
from statefun.state.base import (
    AddressKey,
    StateBackend,
    StateSnapshot,
    StateValues,
    drain,
)

__all__ = ["KIND", "RocksDBStateBackend", "RocksDBStateSnapshot", "read_rocksdb_snapshot"]

log = logging.getLogger(__name__)

#: 3: materialized files plus a prefix of the chain's changelog file; 2 (still read): plus
#: one file per delta; 1 (still read): materialized files only
FORMAT = 3
_READABLE_FORMATS = (1, 2, 3)
#: writes per RocksDB WriteBatch when a worker applies a frozen buffer
_BATCH = 4096
#: bigger than every key: the end of a delete_range that runs to the last key group
_KEYS_END = b"\xff" * 5
_TAIL = 4096
#: keys read per step of ``ids_in_steps``
IDS_STEP = 256

#: key group -> address -> values, or None for a deletion
_Buffer = dict[int, dict[AddressKey, StateValues | None]]


class _Frozen:
    """What ``snapshot()`` froze: the write buffer, and the keys moved from the buffer into
    RocksDB since the previous snapshot (None: too many to track)."""

    __slots__ = ("buffer", "moved")

    def __init__(self, buffer: _Buffer, moved: set[bytes] | None) -> None:
        self.buffer = buffer
        self.moved = moved


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


def _write_options(wal: bool = False) -> WriteOptions:
    options = WriteOptions()
    # The database is a working copy restored from checkpoints: no write-ahead log (unless
    # asked: a copy reused after a restart). (The type stub declares disable_wal a method;
    # rocksdict has it as a property.)
    setattr(options, "disable_wal", not wal)  # noqa: B010
    return options


def _copy_file(source: Path, target: Path, sync: bool = True) -> FileSum:
    """Copy ``source`` to ``target``, fsynced with ``sync`` (checkpoints; not working copies);
    the size and checksum of what was copied (computed while copying)."""
    with source.open("rb") as src, synced_file(target) if sync else target.open("wb") as dst:
        out = HashingWriter(dst)
        shutil.copyfileobj(src, out, 1 << 20)
    return out.sum


def _link_or_copy(source: Path, target: Path, sync: bool = True) -> bool:
    """Hard-link ``source`` to ``target`` (True), or copy it where links do not work."""
    try:
        os.link(source, target)
        return True
    except OSError:
        _copy_file(source, target, sync)
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


def _encoded(buffer: _Buffer) -> Iterator[tuple[bytes, bytes | None]]:
    """The entries of ``buffer`` as RocksDB stores them (None: deleted)."""
    for key_group, group in buffer.items():
        for key, values in group.items():
            yield encode_key(key_group, key), None if values is None else encode_values(values)


def _write_raw(
    db: Rdict, pairs: Iterable[tuple[bytes, bytes | None]], write_options: WriteOptions
) -> None:
    """Put (or delete, for None) ``pairs`` into ``db`` in batches of ``_BATCH`` writes."""
    batch = WriteBatch(raw_mode=True)
    count = 0
    for raw, value in pairs:
        if value is None:
            batch.delete(raw)
        else:
            batch.put(raw, value)
        count += 1
        if count >= _BATCH:
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


def _check_manifest(manifest: Mapping[str, Any]) -> None:
    if manifest.get("backend") != "rocksdb":
        raise ValueError(f"not a rocksdb state snapshot: backend {manifest.get('backend')!r}")
    if manifest.get("format") not in _READABLE_FORMATS:
        raise ValueError(
            f"rocksdb state snapshot format {manifest.get('format')!r} is not supported "
            f"(this version reads formats {', '.join(map(str, _READABLE_FORMATS))}): "
            "restore it with the version that wrote it"
        )


def _install(directory: Path, manifest: Mapping[str, Any], target: Path) -> None:
    """Make ``target`` a RocksDB database holding the materialized files in ``directory``
    (a working copy, rebuilt from the checkpoint after a crash: nothing is fsynced)."""
    target.mkdir(parents=True)
    for entry in manifest["files"]:
        name = entry["name"]
        if name.endswith(".sst"):  # immutable: share the inode
            _link_or_copy(directory / name, target / name, sync=False)
        else:  # MANIFEST, CURRENT, logs...: RocksDB appends to them
            _copy_file(directory / name, target / name, sync=False)


def _replay(
    db: Rdict,
    directory: Path,
    manifest: Mapping[str, Any],
    key_groups: Collection[int] | None,
    write_options: WriteOptions,
) -> int:
    """Apply the deltas of ``manifest`` to ``db`` in order (only ``key_groups``); how many."""
    prefixes = (
        None
        if key_groups is None
        else {key_group_prefix(k) for k in key_groups if 0 <= k < MAX_KEY_GROUPS}
    )
    log = manifest.get("log")
    if log is not None:  # format 3
        pairs = read_log(directory / log["name"], log["size"], log["deltas"], prefixes)
        _write_raw(db, pairs, write_options)
        return int(log["deltas"])
    deltas = manifest.get("deltas", ())  # format 2: a file per delta
    for entry in deltas:
        _write_raw(db, read_delta(directory / entry["name"], prefixes), write_options)
    return len(deltas)


def read_rocksdb_snapshot(
    directory: Path,
    manifest: Mapping[str, Any],
    key_groups: Collection[int] | None,
    scratch_parent: Path | None = None,
) -> Iterator[tuple[int, AddressKey, dict[str, Any]]]:
    """Every address of a rocksdb-format snapshot in ``key_groups`` (None: all).

    Opens a scratch copy (hard links) and replays the deltas there, so that the checkpoint
    itself is never written. The copy goes under ``scratch_parent`` (default: the system's
    temporary folder); on the checkpoint's file system the SSTs are linked, not copied.
    """
    _check_manifest(manifest)
    scratch = Path(tempfile.mkdtemp(prefix="statefun-rocksdb-read-", dir=scratch_parent))
    try:
        _install(directory, manifest, scratch / "db")
        db = Rdict(str(scratch / "db"), _options())
        try:
            _replay(db, directory, manifest, key_groups, _write_options())
            yield from _iter_db(db, key_groups)
        finally:
            db.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class RocksDBStateBackend(StateBackend):
    """Keyed state in RocksDB, with a small write buffer in front (see the module docstring).

    ``keep_existing=False`` (the default) starts from an empty database, as a job does before
    it restores its last checkpoint; ``True`` reopens what a previous ``close()`` left.
    A checkpoint materializes (a full RocksDB checkpoint) instead of writing a delta once the
    chain holds ``max_deltas`` deltas or ``max_delta_bytes`` of them (0: always), or when more
    than ``max_delta_keys`` keys moved from the write buffer into RocksDB since the last cut.
    ``wal``: write through RocksDB's write-ahead log (not fsynced), so that what was written
    survives the process (a working copy that is reused after a restart).

    A user that keeps its durable copy elsewhere (a clustered worker: Kafka) uses the write
    buffer as the state not yet durable there: ``flush_every`` large enough that it is never
    moved on its own, ``snapshot()`` at the cut, ``write_through`` once the cut is durable,
    ``write_batch`` for raw entries, ``discard_unwritten`` for what never became durable.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        flush_every: int = 1024,
        keep_existing: bool = False,
        max_deltas: int = 10_000,
        max_delta_bytes: int = 64 << 20,
        max_delta_keys: int = 100_000,
        wal: bool = False,
    ) -> None:
        self.path = Path(path)
        self._db_path = self.path / "db"
        self._staging = self.path / "staging"
        if not keep_existing:
            shutil.rmtree(self._db_path, ignore_errors=True)
        shutil.rmtree(self._staging, ignore_errors=True)
        self.path.mkdir(parents=True, exist_ok=True)
        self._write_options = _write_options(wal)
        self._db = Rdict(str(self._db_path), _options())
        self._flush_every = flush_every
        self._max_deltas = max_deltas
        self._max_delta_bytes = max_delta_bytes
        self._max_delta_keys = max_delta_keys
        self._pending: _Buffer = {}
        self._puts = 0
        #: keys moved from the buffer into RocksDB since the last snapshot (None: too many)
        self._moved: set[bytes] | None = set()
        #: snapshots whose buffers are not yet in RocksDB, oldest first (rebound, never mutated)
        self._frozen: tuple[_Frozen, ...] = ()
        self._frozen_lock = threading.Lock()  # held briefly: rebinding _frozen
        self._write_lock = threading.Lock()  # held by write(), restore() and close()
        #: the files of the last checkpoint written, or None: the next one materializes because
        self._chain: Chain | None = None
        self._unchained = "first"
        self._closed = False

    # -- reads and writes ---------------------------------------------------------------------

    def get(self, key_group: int, key: AddressKey) -> StateValues | None:
        group = self._pending.get(key_group)
        if group is not None and key in group:
            return group[key]
        for frozen in reversed(self._frozen):  # the tuple is read once, before RocksDB
            group = frozen.buffer.get(key_group)
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
        moved_keys = self._moved
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
                if moved_keys is not None:
                    moved_keys.add(raw)
            count += len(moved)
        if count:
            self._db.write(batch, self._write_options)
        if moved_keys is not None and len(moved_keys) > self._max_delta_keys:
            self._moved = None  # the next snapshot materializes
        self._puts = 0

    def items(self, key_group: int) -> Iterator[tuple[AddressKey, StateValues]]:
        frozen = self._frozen  # before RocksDB: a buffer leaves it only once it is in RocksDB
        merged: dict[AddressKey, StateValues | None] = {}
        prefix = key_group_prefix(key_group)
        for raw, data in _scan(self._db, prefix):
            merged[decode_key(raw)[1]] = decode_values(data)
        for buffer in (*(f.buffer for f in frozen), self._pending):
            group = buffer.get(key_group)
            if group:
                merged.update(group)
        return iter([(key, values) for key, values in merged.items() if values])

    def ids(self, key_group: int, typename: str, after: str | None, limit: int) -> list[str]:
        return drain(self.ids_in_steps(key_group, typename, after, limit))

    def ids_in_steps(
        self, key_group: int, typename: str, after: str | None, limit: int
    ) -> Generator[None, None, list[str]]:
        """A range scan from ``after`` over the type's keys in the group (never more than
        ``limit`` live ids read from RocksDB, ``IDS_STEP`` keys a step; the iterator reads
        the database as it was when it was created), merged with the write buffers."""
        if limit <= 0:
            return []
        frozen = self._frozen  # before RocksDB (as in ``items``)
        buffered: dict[str, bool] = {}  # id -> has values, newest buffer last
        for buffer in (*(f.buffer for f in frozen), self._pending):
            group = buffer.get(key_group)
            if group:
                for (kind, id_), values in group.items():
                    if kind == typename and (after is None or id_ > after):
                        buffered[id_] = bool(values)
        prefix = encode_key(key_group, (typename, ""))
        start = prefix if after is None else encode_key(key_group, (typename, after))
        found = [id_ for id_, live in buffered.items() if live]
        from_db = 0
        iterator = self._db.iter()
        iterator.seek(start)
        read = 0
        while from_db < limit and iterator.valid():
            read += 1
            if read % IDS_STEP == 0:
                yield
            raw = cast(bytes, iterator.key())
            if not raw.startswith(prefix):
                break
            if raw != start or after is None:
                id_ = raw[len(prefix) :].decode("utf-8")
                if id_ not in buffered:
                    found.append(id_)
                    from_db += 1
            iterator.next()
        del iterator
        return heapq.nsmallest(limit, found) if len(found) > limit else sorted(found)

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
        for buffer in (*(f.buffer for f in frozen), self._pending):
            buffered.update(k for k, group in buffer.items() if group)
        result = stored - buffered
        result.update(k for k in buffered if next(self.items(k), None) is not None)
        return sorted(result)

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> RocksDBStateSnapshot:
        frozen = _Frozen(self._pending, self._moved)
        self._pending = {}
        self._moved = set()
        self._puts = 0
        with self._frozen_lock:
            self._frozen = (*self._frozen, frozen)
        return RocksDBStateSnapshot(self, frozen)

    def _write(
        self, frozen: _Frozen, directory: Path, previous: Path | None, sync: bool = True
    ) -> tuple[dict[str, Any], list[Path]]:
        """``RocksDBStateSnapshot.write``: a delta, or a materialization (worker thread).
        Without ``sync`` a delta's file and the folder are left to fsync (returned); a
        materialization is always fsynced here (it is rare)."""
        with self._write_lock:
            index = next((i for i, f in enumerate(self._frozen) if f is frozen), None)
            if index is None:
                raise RuntimeError(
                    "this state snapshot was already written, or a later one was written first"
                )
            mine = self._frozen[: index + 1]
            # Until this write succeeds, the next one materializes.
            chain, self._chain = self._chain, None
            reason: str | None = self._unchained
            self._unchained = "failed"
            if chain is not None:
                reason = self._materialize_reason(chain, previous, mine)
            directory.mkdir(parents=True, exist_ok=True)
            if reason is None:
                assert chain is not None and previous is not None
                if not chain.link(previous, directory):
                    reason = "previous-lacks-files"
            unsynced: list[Path] = []
            if reason is None:
                assert chain is not None
                manifest, chain, unsynced = self._write_delta(chain, mine, directory, sync)
            else:
                manifest, chain = self._materialize(mine, directory, previous, reason, chain)
            self._chain = chain
            return manifest, unsynced

    def _materialize_reason(
        self, chain: Chain, previous: Path | None, mine: Sequence[_Frozen]
    ) -> str | None:
        if previous is None:
            return "no-previous"
        if any(f.moved is None for f in mine):
            return "keys"
        if chain.delta_count >= self._max_deltas:
            return "count"
        if chain.delta_bytes >= self._max_delta_bytes:
            return "size"
        return None

    def _unfreeze(self, count: int) -> None:
        """Forget the oldest ``count`` frozen buffers, once they are in RocksDB."""
        with self._frozen_lock:
            self._frozen = self._frozen[count:]

    def _write_delta(
        self, chain: Chain, mine: Sequence[_Frozen], directory: Path, sync: bool
    ) -> tuple[dict[str, Any], Chain, list[Path]]:
        """Apply the frozen buffers ``mine`` and write what they change as one delta; without
        ``sync``, the delta's file and ``directory`` are left to fsync (returned)."""
        changes: dict[bytes, bytes | None] = {}
        for frozen in mine:
            changes.update(_encoded(frozen.buffer))
        _write_raw(self._db, changes.items(), self._write_options)
        # Keys the buffer moved into RocksDB before the cut and did not write again: their
        # values at the cut are in RocksDB while the buffers stay frozen (no later write).
        moved = [raw for f in mine for raw in f.moved or () if raw not in changes]
        for start in range(0, len(moved), _BATCH):
            part: list[Any] = moved[start : start + _BATCH]
            changes.update(zip(part, cast(list[bytes | None], self._db.get(part)), strict=True))
        self._unfreeze(len(mine))
        copied = 0
        unsynced = [directory]
        if changes:  # nothing changed: the chain as it was
            path = directory / chain.log_name
            before = None if chain.log is None else chain.checksums[chain.log_name]
            total = append_delta(path, changes, before)
            copied = total[0] - (0 if before is None else before[0])
            chain = chain.with_delta(total, len(changes), file_identity(path))
            if sync:
                fsync_path(path)
            unsynced.insert(0, path)
        if sync:
            fsync_dir(directory)
            unsynced = []
        files = [{**f, "reused": True} for f in chain.base]
        manifest = self._manifest(chain, None, files, [1 if changes else 0, copied])
        return manifest, chain, unsynced

    def _materialize(
        self,
        mine: Sequence[_Frozen],
        directory: Path,
        previous: Path | None,
        reason: str,
        old: Chain | None,
    ) -> tuple[dict[str, Any], Chain]:
        """Apply the frozen buffers ``mine``, checkpoint RocksDB, copy it into ``directory``
        (``old``: the chain ``previous`` holds, whose checksums its linked SSTs keep)."""
        self._write_frozen(mine)
        self._staging.mkdir(parents=True, exist_ok=True)
        staging = self._staging / f"chk-{uuid.uuid4().hex}"
        Checkpoint(self._db).create_checkpoint(str(staging))
        self._unfreeze(len(mine))
        try:
            files, identities, checksums = _upload(staging, directory, previous, old)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        chain = Chain(
            token=uuid.uuid4().hex[:16],
            base=tuple({"name": f["name"], "size": f["size"]} for f in files),
            identities=identities,
            checksums=checksums,
        )
        new = [f for f in files if not f["reused"]]
        return self._manifest(chain, reason, files, [len(new), sum(f["size"] for f in new)]), chain

    @staticmethod
    def _manifest(
        chain: Chain,
        reason: str | None,
        files: list[dict[str, Any]],
        copied: list[int],
    ) -> dict[str, Any]:
        """``copied``: [files, bytes] this checkpoint wrote; the rest of ``files`` and of the
        chain's deltas it reuses from earlier ones."""
        total_bytes = sum(f["size"] for f in files) + chain.delta_bytes
        checksums: dict[str, list[Any]] = {
            name: list(chain.checksums[name]) for name in chain.names()
        }
        if chain.log is not None:  # later checkpoints append to it: this one holds a prefix
            checksums[chain.log_name].append(PREFIX)
        return {
            "backend": "rocksdb",
            "format": FORMAT,
            "materialized": reason is not None,
            "reason": reason,
            "chain": chain.token,
            "files": files,
            "log": None if chain.log is None else dict(chain.log),
            "copied_files": copied[0],
            "copied_bytes": copied[1],
            "reused_files": len(chain.names()) - copied[0],
            "reused_bytes": total_bytes - copied[1],
            # every file of the chain, linked ones too: [size, crc32c], the changelog's
            # [size, crc32c, "prefix"] (of its first size bytes)
            "checksums": checksums,
        }

    def _write_frozen(self, frozen: Sequence[_Frozen]) -> None:
        for one in frozen:
            _write_raw(self._db, _encoded(one.buffer), self._write_options)

    def _apply_frozen(self) -> None:
        """Apply every frozen buffer (restore, close): they are in no checkpoint then."""
        self._write_frozen(self._frozen)
        self._unfreeze(len(self._frozen))

    def restore(
        self,
        directory: Path,
        manifest: Mapping[str, Any],
        key_groups: Collection[int] | None = None,
    ) -> None:
        started = time.perf_counter()
        with self._write_lock:
            self._apply_frozen()
            self._moved = None  # no delta spans a restore: not worth tracking what moves
            self._flush_pending(1 << 62)
            self._chain, self._unchained, self._moved = None, "restored", set()
            how = self._restore(directory, manifest, key_groups)
        log.info(
            "restored rocksdb state from %s (%s) in %.3f s",
            directory,
            how,
            time.perf_counter() - started,
        )

    def _restore(
        self, directory: Path, manifest: Mapping[str, Any], key_groups: Collection[int] | None
    ) -> str:
        if manifest.get("backend") == "rocksdb" and self._is_empty():
            _check_manifest(manifest)
            # Fast path: the checkpoint becomes the database (SSTs hard-linked), the deltas
            # are replayed, and the key groups not asked for are dropped with range deletions.
            self._db.close()
            shutil.rmtree(self._db_path)
            _install(directory, manifest, self._db_path)
            self._db = Rdict(str(self._db_path), _options())
            deltas = _replay(self._db, directory, manifest, key_groups, self._write_options)
            if key_groups is not None:
                self._delete_other_key_groups(set(key_groups))
            return f"installed, {deltas} delta(s) replayed"
        if manifest.get("backend") == "rocksdb":
            entries = read_rocksdb_snapshot(directory, manifest, key_groups, self.path)
        else:
            entries = read_snapshot(directory, manifest, key_groups)
        count = 0

        def encoded() -> Iterator[tuple[bytes, bytes | None]]:
            nonlocal count
            for key_group, key, values in entries:
                count += 1
                yield encode_key(key_group, key), encode_values(values)

        _write_raw(self._db, encoded(), self._write_options)
        return f"loaded {count} address(es)"

    # -- a write-through working copy (the durable copy elsewhere) ---------------------------

    def write_through(
        self,
        snapshot: RocksDBStateSnapshot,
        extra: Iterable[tuple[bytes, bytes | None]] = (),
    ) -> int:
        """Apply the write buffers frozen up to ``snapshot`` (oldest first) and the raw
        entries ``extra`` (None: delete) in ONE write batch: RocksDB applies it whole or not
        at all, also across a crash. The snapshot is then written (it is never uploaded). How
        many entries were written."""
        with self._write_lock:
            frozen = snapshot._frozen
            index = next((i for i, f in enumerate(self._frozen) if f is frozen), None)
            if index is None:
                raise RuntimeError(
                    "this state snapshot was already written, or a later one was written first"
                )
            mine = self._frozen[: index + 1]
            changes: dict[bytes, bytes | None] = {}
            for one in mine:
                changes.update(_encoded(one.buffer))
            changes.update(extra)
            self._write_one_batch(changes.items(), ())
            self._unfreeze(len(mine))
            self._chain, self._unchained = None, "written-through"
            return len(changes)

    def write_batch(
        self,
        pairs: Iterable[tuple[bytes, bytes | None]],
        delete_ranges: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        """Write raw ``pairs`` (None: delete) after deleting the key ranges ``delete_ranges``
        ([start, end)), in ONE write batch (atomic, also across a crash); the write buffers
        are not touched."""
        with self._write_lock:
            self._write_one_batch(pairs, delete_ranges)

    def _write_one_batch(
        self,
        pairs: Iterable[tuple[bytes, bytes | None]],
        delete_ranges: Iterable[tuple[bytes, bytes]],
    ) -> None:
        batch = WriteBatch(raw_mode=True)
        for start, end in delete_ranges:
            batch.delete_range(start, end)
        for raw, value in pairs:
            if value is None:
                batch.delete(raw)
            else:
                batch.put(raw, value)
        self._db.write(batch, self._write_options)

    def get_raw(self, raw: bytes) -> bytes | None:
        """The stored bytes of the raw key ``raw`` (the database only, not the buffers)."""
        found = self._db.get(raw)
        return None if found is None else cast(bytes, found)

    def discard_unwritten(self) -> int:
        """Forget every write not in the database yet (the live and the frozen buffers): what
        never became durable elsewhere. How many addresses' writes were dropped."""
        with self._write_lock:
            with self._frozen_lock:
                frozen, self._frozen = self._frozen, ()
            dropped = sum(len(g) for f in frozen for g in f.buffer.values())
            dropped += sum(len(g) for g in self._pending.values())
            self._pending = {}
            self._puts = 0
            self._moved = set()
            return dropped

    def clear(self) -> None:
        """An empty database in place of this one (the buffers are dropped, unwritten)."""
        with self._write_lock:
            with self._frozen_lock:
                self._frozen = ()
            self._pending = {}
            self._puts = 0
            self._moved = set()
            self._chain, self._unchained = None, "restored"
            with contextlib.suppress(Exception):  # closed already by a failed restore
                self._db.close()
            shutil.rmtree(self._db_path, ignore_errors=True)
            self._db = Rdict(str(self._db_path), _options())

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
        with self._write_lock:
            self._apply_frozen()
            self._moved = None
            self._flush_pending(1 << 62)
            self._chain, self._unchained = None, "closed"
            self._db.flush()
            self._db.close()
        shutil.rmtree(self._staging, ignore_errors=True)
        self._closed = True


def _upload(
    staging: Path, directory: Path, previous: Path | None, known: Chain | None
) -> tuple[list[dict[str, Any]], dict[str, Identity], dict[str, FileSum]]:
    """Copy a RocksDB checkpoint into ``directory``, hard-linking the SSTs ``previous`` holds.

    Returns each file's manifest entry, its identity in ``directory`` and its checksum:
    computed while copying, or for a linked SST the one ``known`` (the chain in ``previous``)
    wrote it with - read back only if ``previous`` holds another file than ``known`` says.
    """
    files: list[dict[str, Any]] = []
    identities: dict[str, Identity] = {}
    checksums: dict[str, FileSum] = {}
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
            checksums[name] = _copy_file(source, target)
        identities[name] = file_identity(target)
        if shared:
            same = known is not None and known.identities.get(name) == identities[name]
            if known is not None and same and name in known.checksums:
                checksums[name] = known.checksums[name]
            else:  # linked from a file this chain did not write: read it back
                checksums[name] = file_sum(target)
        files.append({"name": name, "size": size, "reused": shared})
    fsync_dir(directory)
    return files, identities, checksums


class RocksDBStateSnapshot(StateSnapshot):
    """A frozen write buffer, then a delta or a materialization (see the module docstring)."""

    def __init__(self, backend: RocksDBStateBackend, frozen: _Frozen) -> None:
        self._backend: RocksDBStateBackend | None = backend
        self._frozen = frozen

    def write(self, directory: Path, previous: Path | None = None) -> dict[str, Any]:
        backend = self._backend
        if backend is None:
            raise RuntimeError("this state snapshot was released")
        return backend._write(self._frozen, directory, previous)[0]

    def write_unsynced(
        self, directory: Path, previous: Path | None = None
    ) -> tuple[dict[str, Any], list[Path]]:
        backend = self._backend
        if backend is None:
            raise RuntimeError("this state snapshot was released")
        return backend._write(self._frozen, directory, previous, sync=False)

    def release(self) -> None:
        # An unwritten snapshot's buffer stays frozen: the next write() puts it in RocksDB and
        # in its delta (or close() or restore() applies it).
        self._backend = None


#: the registry's entry (``state/_registry.py``)
KIND = BackendKind(RocksDBStateBackend, read_rocksdb_snapshot)
