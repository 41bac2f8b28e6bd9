"""A clustered worker's state in RocksDB: a local copy of the changelog, reused after a restart.

The changelog in Kafka is the state (``_changelog.py``); with ``state_backend=rocksdb`` a
worker keeps its partitions' state in a RocksDB database under
``<state_dir>/cluster/<job id>/<worker id>/`` instead of in memory, so state larger than memory
works clustered, and a worker restarted with the same folder reads only what the changelog
gained since its copy was complete instead of the whole partition.

**The copy holds committed state only.** ``TrackedRocksDBState`` is the RocksDB backend
(``state/rocksdb.py``) used write-through: every write of the running job stays in its write
buffer (in memory) until the checkpoint that cut it has committed in Kafka; then that buffer is
written into RocksDB (``LocalCopy.committed``). Writes after the last commit are dropped when
the epoch ends (``close``), as the job's are. So the database never holds what a crash could
undo, and what is in memory is only what changed since the last cut.

**Marks.** With the data, in the same RocksDB write batch (atomic, also across a crash: the
database is written through its write-ahead log), the copy records per changelog partition a
*mark* ``(offset, at, topic id)``: every key the changelog holds a record for below ``offset``
has its latest such record's value in the copy, unless a record at or after ``offset``
replaces it. Reading the partition from ``offset`` to its end and applying each record (the
last one wins, a tombstone deletes) therefore gives the changelog's state, whatever else the
copy holds. The partition's latest cut record is kept beside the marks (it may lie before
``offset``). Marks are set:

* after a read of the changelog: the end offset read before it (at its end), or the offset
  after the last record applied (a read cut short: a restart goes on from there);
* at a commit: the end offsets read after an earlier commit of the same epoch (at most every
  ``MARK_EVERY_S``): the epoch's generation owned the partition alone between that read and
  this commit (the commit is refused otherwise: KIP-447), so every record below them is the
  epoch's own, whose state the copy holds once the commit is written through. An end offset
  read after the last commit is not used until a later commit proves it: a worker paused past
  its session could read an end that includes another worker's records.

**When the copy is not trusted** (the partition is wiped - its key groups, mark and cut - and
read from the beginning; ``catch_up_from`` decides, pure):

* no mark: a new folder, a partition this worker never held, a read that never started;
* the changelog topic's id is not the mark's: the topic was deleted and made again;
* the mark's offset is past the partition's end (a topic made again under the same job id),
  or before its beginning (records deleted);
* the mark is too old: compaction drops a tombstone ``delete.retention.ms`` after it cleaned
  it, and a copy that never read a tombstone would keep the deleted state for good. Every
  record at or after a mark's offset was written after ``at`` less the transaction timeout (an
  open transaction's records may be older than the end offset read), so its tombstones are kept
  until at least ``at - transaction timeout + delete.retention.ms``: the copy is trusted while
  ``now - at <= delete.retention.ms - transaction timeout - 5 min`` (the margin: the read
  itself, clocks). The topic's ``delete.retention.ms`` is read from Kafka (24 h by default);
  unknown, the copy is not trusted. A worker that committed nothing for that long (idle) is
  restored fully after a restart, which is safe, only slower;
* the whole database is wiped when its header (format, job id, changelog topic, partitions,
  max_parallelism) is not this job's or cannot be read, and when RocksDB cannot open it.

A partition kept across a rebalance (``_carry.py``) needs no read at all: its state is what the
revoke's checkpoint wrote through, and its messages and timers come from the carried cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from statefun._exceptions import ConfigurationError
from statefun._kafka import import_kafka
from statefun.cluster._changelog import Restored, changelog_reader, decode_records
from statefun.cluster._config import ClusterConfig
from statefun.egress.kafka import Row
from statefun.state._codec import MAX_KEY_GROUPS, encode_key, encode_values, key_group_prefix
from statefun.state.base import AddressKey, StateValues
from statefun.state.rocksdb import RocksDBStateBackend, RocksDBStateSnapshot

__all__ = [
    "LocalCopy",
    "Mark",
    "TrackedRocksDBState",
    "catch_up_from",
    "copy_path",
    "header_of",
    "open_local_copy",
]

log = logging.getLogger(__name__)

#: the layout of the copy's own keys; another value wipes the copy
FORMAT = 1
#: the key group of the copy's own keys: above every job's (max_parallelism <= 32768)
_META_GROUP = MAX_KEY_GROUPS - 1
#: how often (at most) the changelog's end offsets are read for the next commit's marks
MARK_EVERY_S = 1.0
#: what the trust in a mark's age leaves aside (the catch-up read itself, clocks)
MARGIN_MS = 5 * 60_000
#: a write buffer never moved into RocksDB on its own: only a commit writes it through
_NEVER = 1 << 62
_SEPARATOR = b"\x1f"


def _meta_key(name: str) -> bytes:
    return encode_key(_META_GROUP, ("", name))


HEADER_KEY = _meta_key("header")


def mark_key(partition: int) -> bytes:
    return _meta_key(f"mark:{partition}")


def cut_key(partition: int) -> bytes:
    return _meta_key(f"cut:{partition}")


def copy_path(state_dir: str, config: ClusterConfig) -> Path:
    """Where a worker keeps its copy: one folder per job and worker id, so workers of one
    machine (``run --workers N``) share a ``state_dir``."""
    return Path(state_dir) / "cluster" / config.job_id / config.worker_id


@dataclass(frozen=True)
class Mark:
    """How far the copy holds a changelog partition (see the module docstring)."""

    offset: int
    #: wall-clock time (s): every record at or after ``offset`` was written after it (less
    #: the transaction timeout)
    at: float
    #: the changelog topic's id when the mark was set ("": unknown)
    topic_id: str = ""

    def encode(self) -> bytes:
        return bytes(msgpack.packb([self.offset, self.at, self.topic_id]))

    @classmethod
    def decode(cls, data: bytes | None) -> Mark | None:
        """The mark ``data`` holds; None for none or a damaged one."""
        if data is None:
            return None
        try:
            offset, at, topic_id = msgpack.unpackb(data)
            return cls(int(offset), float(at), str(topic_id))
        except (ValueError, TypeError, msgpack.UnpackException):
            return None


def header_of(config: ClusterConfig) -> dict[str, Any]:
    """What the copy must have been made for (compared whole at open)."""
    return {
        "format": FORMAT,
        "job": config.job_id,
        "topic": config.changelog_topic,
        "partitions": config.partitions,
        "max_parallelism": config.max_parallelism,
    }


def catch_up_from(
    mark: Mark | None,
    *,
    beginning: int,
    end: int,
    topic_id: str,
    now: float,
    retention_ms: int | None,
    transaction_timeout_ms: int,
) -> tuple[int | None, str]:
    """The offset to read a partition from into a copy holding it up to ``mark``, or None and
    why the copy of the partition is not trusted (it is then wiped and read whole)."""
    if mark is None:
        return None, "no local copy"
    if mark.topic_id and topic_id and mark.topic_id != topic_id:
        return None, "the changelog topic was made again (another topic id)"
    if mark.offset > end:
        return None, f"its offset {mark.offset} is past the partition's end {end}"
    if mark.offset < beginning:
        return None, f"its offset {mark.offset} is before the partition's beginning {beginning}"
    if retention_ms is None:
        return None, "the changelog's delete.retention.ms is unknown"
    age_ms = (now - mark.at) * 1000
    if age_ms < -MARGIN_MS:
        return None, f"it is dated {-age_ms / 1000:.0f} s in the future (the clock moved back)"
    trusted_ms = retention_ms - transaction_timeout_ms - MARGIN_MS
    if age_ms > trusted_ms:
        return None, (
            f"it is {age_ms / 1000:.0f} s old; compaction may have dropped tombstones it never "
            f"read (delete.retention.ms {retention_ms})"
        )
    return mark.offset, "caught up"


def local_entries(partition: int, records: Iterable[Any]) -> list[tuple[bytes, bytes | None]]:
    """Changelog records (``key``, ``value``) of ``partition`` as the copy's raw entries: an
    address's state (None: a tombstone or an empty value, deleted), the partition's cut;
    records of other kinds (a savepoint's seed) are not state and are left out."""
    entries: list[tuple[bytes, bytes | None]] = []
    cut = f"{partition}:c".encode()
    for record in records:
        parts = record.key.split(b":", 3)
        if len(parts) == 4 and parts[1] == b"s":
            typename, id_ = parts[3].split(_SEPARATOR, 1)
            raw = encode_key(int(parts[2]), (typename.decode("utf-8"), id_.decode("utf-8")))
            entries.append((raw, record.value or None))
        elif record.key == cut:
            entries.append((cut_key(partition), record.value or None))
    return entries


class TrackedRocksDBState(RocksDBStateBackend):
    """The RocksDB backend written through at commits, remembering the addresses written
    since ``take_changed`` (the interface of ``TrackedMemoryState``)."""

    def __init__(self, path: Path, config: ClusterConfig) -> None:
        #: why the copy was wiped at open ("" : it was not)
        self.wiped = ""
        try:
            super().__init__(path, flush_every=_NEVER, keep_existing=True, wal=True)
        except Exception as exc:  # any failure to open but a lock: start empty
            if "lock" in str(exc).lower():
                raise ConfigurationError(
                    f"cluster: the local copy at {path} is in use by another process (two "
                    "workers with one cluster.worker_id and state_dir?): "
                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                ) from exc
            self.wiped = f"RocksDB could not open it ({exc})"
            shutil.rmtree(Path(path) / "db", ignore_errors=True)
            super().__init__(path, flush_every=_NEVER, keep_existing=False, wal=True)
        self._changed: set[tuple[int, AddressKey]] = set()
        #: the key groups whose state this epoch owns (the rest of the copy is not served)
        self._owned: frozenset[int] = frozenset()
        self._check_header(header_of(config))

    def _check_header(self, wanted: dict[str, Any]) -> None:
        found = self.get_raw(HEADER_KEY)
        if found is not None:
            try:
                header = msgpack.unpackb(found, raw=False)
            except (ValueError, msgpack.UnpackException):
                header = None
            if header == wanted:
                return
            self.wiped = self.wiped or (
                f"it was made for job {header.get('job')!r} ({header})"
                if isinstance(header, dict)
                else "its header is damaged"
            )
            self.clear()
        elif super().key_groups():
            self.wiped = self.wiped or "it has no header"
            self.clear()
        self.write_batch([(HEADER_KEY, bytes(msgpack.packb(wanted)))])

    # -- the running job's side (the interface of TrackedMemoryState) ------------------------

    def put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        RocksDBStateBackend.put(self, key_group, key, values)
        self._changed.add((key_group, key))

    def restore_put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        """``put`` of a restored value: written into RocksDB, not a change to write again."""
        raw = encode_key(key_group, key)
        self.write_batch([(raw, encode_values(values) if values else None)])

    def group(self, key_group: int) -> Mapping[AddressKey, StateValues]:
        """Nothing: a carried cut needs no copy of this state, which the revoke's checkpoint
        wrote through into RocksDB (``_carry.py``)."""
        return {}

    def take_changed(self) -> set[tuple[int, AddressKey]]:
        changed, self._changed = self._changed, set()
        return changed

    def own(self, key_groups: Iterable[int]) -> None:
        """The key groups the epoch owns: listings show only theirs (the copy keeps others')."""
        self._owned = frozenset(key_groups)

    def key_groups(self) -> list[int]:
        return [k for k in super().key_groups() if k in self._owned]

    def ids(self, key_group: int, typename: str, after: str | None, limit: int) -> list[str]:
        if key_group not in self._owned:
            return []
        return super().ids(key_group, typename, after, limit)

    def ids_in_steps(
        self, key_group: int, typename: str, after: str | None, limit: int
    ) -> Generator[None, None, list[str]]:
        if key_group not in self._owned:
            return _no_ids()
        return super().ids_in_steps(key_group, typename, after, limit)

    def close(self) -> None:
        """Drop what no commit wrote through (as the job's effects after its last cut), then
        close the database."""
        dropped = self.discard_unwritten()
        if dropped:
            log.debug("cluster: %d uncommitted write(s) dropped from the local copy", dropped)
        super().close()

    # -- marks --------------------------------------------------------------------------------

    def mark(self, partition: int) -> Mark | None:
        return Mark.decode(self.get_raw(mark_key(partition)))

    def cut_value(self, partition: int) -> bytes | None:
        return self.get_raw(cut_key(partition))

    def wipe(self, config: ClusterConfig, partition: int) -> None:
        """Forget ``partition``: its key groups' state, its mark and its cut (one batch)."""
        groups = config.key_groups_of(partition)
        end = key_group_prefix(groups.stop) if groups.stop < MAX_KEY_GROUPS else b"\xff" * 5
        self.write_batch(
            [(mark_key(partition), None), (cut_key(partition), None)],
            [(key_group_prefix(groups.start), end)],
        )


def _no_ids() -> Generator[None, None, list[str]]:
    """An empty page, in no steps."""
    return []
    yield  # (a generator)


@dataclass
class _Plan:
    """How one partition is restored."""

    start: int
    full: bool
    reason: str
    records: int = 0


class LocalCopy:
    """An epoch's side of the copy: restore on assignment, marks at commits."""

    def __init__(self, state: TrackedRocksDBState, config: ClusterConfig) -> None:
        self.state = state
        self.config = config
        #: partition -> the mark the next commit records (read before its cut)
        self._pending: dict[int, Mark] = {}
        self._partitions: list[int] = []
        self._read_at = 0.0
        self._reader: Any = None
        #: what the last restore did: partition -> (from offset, records read, full, reason)
        self.plans: dict[int, _Plan] = {}

    # -- on assignment (blocking: a worker thread) ---------------------------------------------

    def restore(
        self,
        partitions: list[int],
        kept: list[int],
        retention_ms: Callable[[], int | None],
        timeout_s: float = 60.0,
    ) -> Restored:
        """Bring the copy of ``partitions`` (all the epoch owns) up to the changelog's end:
        ``kept`` ones are in it already (a carried cut); the others are caught up from their
        mark or wiped and read whole. Their cuts' messages and delayed messages are returned
        (``Restored.state`` stays empty: the state is in RocksDB)."""
        config, state = self.config, self.state
        self._partitions = sorted(partitions)
        state.own(kg for p in partitions for kg in config.key_groups_of(p))
        wanted = sorted(set(partitions) - set(kept))
        restored = Restored()
        if not wanted:
            return restored
        started = time.perf_counter()
        kafka = import_kafka()
        reader = self._reader = self._reader or changelog_reader(config, "local")
        tps = {p: kafka.TopicPartition(config.changelog_topic, p) for p in wanted}
        reader.assign(list(tps.values()))
        now = time.time()
        ends = {tp.partition: int(o) for tp, o in reader.end_offsets(list(tps.values())).items()}
        beginnings = {
            tp.partition: int(o) for tp, o in reader.beginning_offsets(list(tps.values())).items()
        }
        topic_id = _topic_id(reader, config.changelog_topic)
        plans: dict[int, _Plan] = {}
        marks: dict[int, Mark] = {}
        found = {p: state.mark(p) for p in wanted}
        retention = retention_ms() if any(found.values()) else None
        for p in wanted:
            mark = found[p]
            start, reason = catch_up_from(
                mark,
                beginning=beginnings[p],
                end=ends[p],
                topic_id=topic_id,
                now=now,
                retention_ms=retention,
                transaction_timeout_ms=config.transaction_timeout_ms,
            )
            if start is None or mark is None:
                state.wipe(config, p)
                plans[p] = _Plan(beginnings[p], True, reason)
                marks[p] = Mark(beginnings[p], now, topic_id)  # (progress, until the end)
            else:
                plans[p] = _Plan(start, False, reason)
                marks[p] = mark
            reader.seek(tps[p], plans[p].start)
        deadline = time.monotonic() + timeout_s
        while any(reader.position(tps[p]) < ends[p] for p in wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"cluster: the changelog {config.changelog_topic} gave no record for "
                    f"{timeout_s:.0f} s before its end"
                )
            for tp, batch in reader.poll(timeout_ms=200, max_records=10_000).items():
                if not batch:
                    continue
                deadline = time.monotonic() + timeout_s  # (a large partition takes its time)
                p = tp.partition
                plans[p].records += len(batch)
                marks[p] = Mark(batch[-1].offset + 1, marks[p].at, topic_id)
                entries = local_entries(p, batch)
                entries.append((mark_key(p), marks[p].encode()))
                state.write_batch(entries)
        done = [(mark_key(p), Mark(ends[p], now, topic_id).encode()) for p in wanted]
        state.write_batch(done)  # each partition holds the changelog up to its end read
        self._pending.update((p, Mark(ends[p], now, topic_id)) for p in wanted)
        self._read_at = time.monotonic()
        for p in wanted:
            value = state.cut_value(p)
            if value:
                cut = decode_records({f"{p}:c".encode(): value})
                restored.messages.extend(cut.messages)
                restored.timers.extend(cut.timers)
        restored.records = sum(plan.records for plan in plans.values())
        self.plans = plans
        log.info(
            "cluster: local copy (rocksdb): %s in %.3f s",
            describe(plans, kept),
            time.perf_counter() - started,
        )
        return restored

    # -- at checkpoints -----------------------------------------------------------------------

    def cut(self) -> RocksDBStateSnapshot:
        """At the cut (with ``take_changed``): the writes so far wait for the commit."""
        return self.state.snapshot()

    async def committed(self, cut: RocksDBStateSnapshot, rows: list[Row], proven: bool) -> None:
        """After the checkpoint of ``cut`` (its changelog ``rows``): write it through, with the
        partitions' new cuts and, when it committed in Kafka (``proven``), the marks read
        before it; then read the next marks (at most every ``MARK_EVERY_S``)."""
        extra: list[tuple[bytes, bytes | None]] = []
        if proven:
            for _, key, value, _ in rows:
                partition, _, kind = (key or "").partition(":")
                if kind == "c":
                    extra.append((cut_key(int(partition)), value))
            extra += [(mark_key(p), mark.encode()) for p, mark in self._pending.items()]
            self._pending = {}
        await asyncio.to_thread(self.state.write_through, cut, extra)
        if proven and time.monotonic() - self._read_at >= MARK_EVERY_S:
            self._pending = await asyncio.to_thread(self._read_ends)

    def _read_ends(self) -> dict[int, Mark]:
        """Marks at the changelog's end offsets of the epoch's partitions, as of now."""
        self._read_at = time.monotonic()
        if not self._partitions:
            return {}
        kafka = import_kafka()
        if self._reader is None:
            self._reader = changelog_reader(self.config, "local")
        topic = self.config.changelog_topic
        now = time.time()
        ends = self._reader.end_offsets([kafka.TopicPartition(topic, p) for p in self._partitions])
        topic_id = _topic_id(self._reader, topic)
        return {tp.partition: Mark(int(o), now, topic_id) for tp, o in ends.items()}

    def close(self) -> None:
        """Close the state (if the job did not: what was not written through is dropped) and
        the reader of end offsets (blocking)."""
        self.state.close()
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                reader.close(autocommit=False)


def describe(plans: Mapping[int, _Plan], kept: Iterable[int]) -> str:
    """One line: which partitions were kept, caught up (from which offset, how many records)
    and read whole (why)."""
    parts = [f"{len(list(kept))} partition(s) kept in RocksDB"]
    caught = {p: plan for p, plan in plans.items() if not plan.full}
    full = {p: plan for p, plan in plans.items() if plan.full}
    if caught:
        parts.append(
            f"{len(caught)} caught up from their marks with "
            f"{sum(p.records for p in caught.values())} record(s) ("
            + ", ".join(f"{p} from {plan.start}" for p, plan in sorted(caught.items()))
            + ")"
        )
    if full:
        parts.append(
            f"{len(full)} restored fully with {sum(p.records for p in full.values())} record(s) ("
            + ", ".join(f"{p}: {plan.reason}" for p, plan in sorted(full.items()))
            + ")"
        )
    return "; ".join(parts)


def _topic_id(reader: Any, topic: str) -> str:
    """The topic's id as the reader's metadata has it ("" unknown: older brokers or clients)."""
    cluster = getattr(getattr(reader, "_client", None), "cluster", None)
    finder = getattr(cluster, "topic_id", None)
    found = finder(topic) if callable(finder) else None
    return "" if found is None else str(found)


def open_local_copy(state_dir: str, config: ClusterConfig) -> tuple[TrackedRocksDBState, LocalCopy]:
    """The worker's copy for one epoch (blocking: RocksDB opens, and may be wiped)."""
    state = TrackedRocksDBState(copy_path(state_dir, config), config)
    if state.wiped:
        log.warning("cluster: local copy at %s wiped: %s", state.path, state.wiped)
    return state, LocalCopy(state, config)
