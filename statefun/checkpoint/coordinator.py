"""Checkpoints of one runtime process: the protocol, and recovery.

Inside one asyncio process, everything captured between two event-loop steps is a
consistent cut: no message is half-way between two places. A checkpoint is taken in these
steps (``CheckpointCoordinator.checkpoint``):

1. **Cut** (synchronous, no ``await``): every source's position; a copy-on-write snapshot
   of keyed state (O(key groups), not O(state)); every message inside the runtime - dispatcher
   inboxes, mailboxes, and the inputs of batches in flight, whose effects are not applied
   yet; pending delayed messages with their tokens; the state specs remote functions
   registered; and each transactional sink seals the records since the previous cut as
   transaction N (``pre_commit``). Replies to HTTP calls produced so far are sealed too.
2. **Write**: non-transactional (at-least-once) sinks flush first, so nothing they held
   from before the cut is lost once the checkpoint exists. Then, in a worker thread while
   processing goes on: the state snapshot, the messages, the timers and the sinks'
   transactions into ``chk-N/`` (``state/`` and ``cut.msgpack``), not fsynced yet. Every
   file's size and CRC-32C are computed as it is written (no extra pass) and listed in the
   metadata.
3. **Complete** (in the same worker trip): ``chk-N/_metadata`` is written last, under a
   temporary name (``_metadata.tmp``) first; then one round of fsyncs, all at once, makes
   every file of step 2, the metadata, the folder's entries and the folder's own name durable
   (the file system commits overlapping fsyncs together). Only now does the checkpoint exist:
   its metadata, whole (its own checksum) and listing every file with its size and checksum,
   is durable with all of them. A crash before this step leaves a folder that is never
   restored (deleted on start); a crash after it, before the rename below, leaves one that the
   next start verifies whole and adopts (``CheckpointStorage.prepare``). After step 4, in a
   worker thread that neither the replies nor the next checkpoint wait for, the metadata takes
   its name (``_metadata``, the folder fsynced) and checkpoints beyond the newest
   ``checkpoints_retained`` are deleted (N replaces them; deleting files costs more than
   writing a small checkpoint). A savepoint's metadata takes its name within this step.
4. **Commit**: transactional sinks commit transaction N (two-phase commit), sources hear that
   their positions are durable (Kafka offsets to the group, WAL trimming; not for savepoints,
   which are no checkpoint a restart falls back to), and the sealed HTTP replies are released.

When checkpoints start: ``checkpoint_interval_ms`` after the start of the previous one; sooner
when ``request_soon`` asks (a held HTTP reply waits at most ``reply_checkpoint_delay_ms``), or
when ``request_when_idle`` asks (the job worked off everything in flight while an exactly-once
egress holds records: ``idle_checkpoint_delay_ms`` later, and no sooner than 9x the CPU time
the last checkpoint took after it ended).

No checkpoint is cut once the job has failed: what failed may already be dropped (a batch
under ``remote_failure_policy=fail``), so the restart goes back to a cut from before.

Checkpoints never overlap: N+1 is cut only after N committed, so on recovery from N every
earlier transaction is already committed and only N's may need finishing.

Recovery (``recovery.py``) reverses the cut, after verifying the checkpoint's files, and
falls back to an older checkpoint when the newest is damaged.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from statefun._checksums import ALGORITHM, crc32c
from statefun._exceptions import JobFailedError
from statefun._files import fsync_path, unsynced_file
from statefun.checkpoint._codec import encode_envelopes, encode_timers
from statefun.checkpoint.recovery import restore
from statefun.checkpoint.storage import (
    CUT_FILE,
    FORMAT_VERSION,
    CheckpointStorage,
    CompletedCheckpoint,
    StagedMetadata,
)
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import RemoteFunction
from statefun.runtime._stats import LATENCY_BUCKETS, Histogram

if TYPE_CHECKING:
    from statefun._settings import Settings
    from statefun.egress.base import Sink
    from statefun.ingress.base import Source
    from statefun.runtime._functions import FunctionRegistry
    from statefun.runtime._timers import TimerService
    from statefun.state.base import StateBackend


class CheckpointedJob(Protocol):
    """What taking checkpoints needs of the job (``runtime/_job.py``'s ``Job``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def state(self) -> StateBackend: ...
    @property
    def functions(self) -> FunctionRegistry: ...
    @property
    def timers(self) -> TimerService: ...
    @property
    def sources(self) -> Sequence[Source]: ...
    @property
    def sinks(self) -> Mapping[str, Sink]: ...
    @property
    def state_types(self) -> Set[str]: ...
    @property
    def failed(self) -> bool: ...
    def messages_in_flight(self) -> list[Envelope]: ...
    def seal_replies(self) -> list[tuple[str, Any]]: ...
    def release_replies(self, replies: list[tuple[str, Any]]) -> None: ...
    def check_sink_backlog(self) -> None: ...


__all__ = ["CheckpointCoordinator", "CheckpointedJob", "SimulatedCrash", "restore"]

log = logging.getLogger(__name__)

#: completed checkpoints whose figures are kept (``history``: /status)
HISTORY = 50
#: threads that fsync a checkpoint's files beside the writer's own (a small checkpoint has
#: about six files and folders to make durable)
_SYNC_THREADS = 6


class SimulatedCrash(BaseException):
    """Raised by a test hook between two steps of the protocol (never by the runtime)."""


@dataclass
class Cut:
    """What step 1 captured."""

    id: int
    started: float
    positions: dict[str, Any]
    state: Any  # a StateSnapshot
    messages: list[Envelope]
    timers: list[Any]
    remote_specs: dict[str, list[list[Any]]]
    sinks: dict[str, Any]
    replies: list[tuple[str, Any]] = field(default_factory=list)
    stall_ms: float = 0.0


class CheckpointCoordinator:
    """Takes checkpoints of ``job`` every ``interval_ms`` and on request (savepoints)."""

    def __init__(
        self,
        job: CheckpointedJob,
        storage: CheckpointStorage,
        interval_ms: int,
        savepoint_dir: Path | None = None,
        hook: Callable[[str, int], None] | None = None,
    ) -> None:
        self.job = job
        self.storage = storage
        self.interval = interval_ms / 1000.0
        self.savepoint_dir = savepoint_dir or storage.root.parent / "savepoints"
        self._hook = hook
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self._nudge = asyncio.Event()  # stop, or a sooner checkpoint was asked for
        self._due: float | None = None  # loop time of the checkpoint asked for, if sooner
        self._ended = 0.0  # loop time the last checkpoint ended
        self._next_id = storage.next_id()
        self.completed = 0
        self.last: CompletedCheckpoint | None = None
        self.max_stall_ms = 0.0
        self.last_duration_ms = 0.0
        #: CPU time the last checkpoint took: its cut, and writing its files (worker thread)
        self.last_cpu_ms = 0.0
        self._pruning: asyncio.Task[None] | None = None  # deleting old checkpoints
        #: complete checkpoints whose metadata has its temporary name still, oldest first
        self._unpublished: deque[StagedMetadata] = deque()
        #: the last completed checkpoints: id, duration_ms, bytes, completed_at (epoch s)
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        #: seconds each checkpoint took, cut to commit (metrics)
        self.durations = Histogram(LATENCY_BUCKETS)
        #: bytes of the files checkpoints wrote, in all
        self.bytes_written = 0
        #: per egress id, seconds its commits took (metrics)
        self.commit_seconds: dict[str, Histogram] = {}
        #: wall-clock time (epoch seconds) the last checkpoint completed; 0: none yet
        self.last_completed_at = 0.0
        #: fsyncs of one checkpoint, all at once (threads are made on first use)
        self._io = ThreadPoolExecutor(_SYNC_THREADS, thread_name_prefix="checkpoint-io")

    def _step(self, name: str, checkpoint_id: int) -> None:
        if self._hook is not None:
            self._hook(name, checkpoint_id)

    async def run(self) -> None:
        """Checkpoint until ``stop``: ``interval`` after the start of the previous checkpoint,
        and sooner when ``request_soon`` or ``request_when_idle`` ask."""
        loop = asyncio.get_running_loop()
        next_start = loop.time() + self.interval
        while not self._stopped.is_set():
            due = next_start if self._due is None else min(next_start, self._due)
            delay = due - loop.time()
            if delay > 0:
                self._nudge.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudge.wait(), delay)
                continue
            self._due = None
            if self.job.failed:
                return
            # A checkpoint that took longer than the interval delays the next one; none overlap.
            next_start = loop.time() + self.interval
            await self.checkpoint()

    def request_soon(self, delay_ms: int) -> None:
        """Start a checkpoint within ``delay_ms`` (after the one in progress, if any)."""
        due = asyncio.get_running_loop().time() + delay_ms / 1000.0
        if self._due is None or due < self._due:
            self._due = due
            self._nudge.set()

    def request_when_idle(self, delay_ms: int) -> None:
        """The job has worked off everything in flight and holds output for a checkpoint:
        start one ``delay_ms`` from now (group commit), but not before 9x the CPU time the
        last checkpoint took has passed since it ended (early checkpoints take at most ~10%
        of a core)."""
        if self._due is not None or self._lock.locked():
            return  # one is asked for already; or one is running (the job asks again after it)
        now = asyncio.get_running_loop().time()
        self._due = max(now + delay_ms / 1000.0, self._ended + 9 * self.last_cpu_ms / 1000.0)
        self._nudge.set()

    async def stop(self) -> None:
        """End the periodic checkpoints, letting one in progress finish."""
        self._stopped.set()
        self._nudge.set()
        async with self._lock:
            pass
        if self._pruning is not None:
            await self._pruning
        if self._unpublished:
            await asyncio.to_thread(self._publish_and_prune)

    async def checkpoint(self, savepoint: bool = False) -> CompletedCheckpoint:
        async with self._lock:
            if self.job.failed:
                # After a failure, work that failed may already be dropped (a batch under
                # remote_failure_policy=fail): a cut now would lose it for good. The restart
                # goes back to the last checkpoint cut before the failure.
                raise JobFailedError("the job failed: no checkpoint is taken after a failure")
            checkpoint_id = self._next_id
            self._next_id += 1
            # 1. Cut.
            cut = self._cut(checkpoint_id)
            self._step("cut", checkpoint_id)
            try:
                root = self.savepoint_dir if savepoint else None
                folder = self.storage.begin(checkpoint_id, savepoint=savepoint, root=root)
                # 2. Write.
                previous = None if savepoint or self.last is None else self.last.path / "state"
                metadata = self._metadata(cut, savepoint)
                for sink in self.job.sinks.values():
                    if not sink.transactional:
                        await sink.flush()
                # 2. and 3. in one trip to a worker thread
                completed, write_cpu_ms, staged = await asyncio.to_thread(
                    self._write_and_complete, folder, cut, previous, metadata, savepoint
                )
            finally:
                release = getattr(cut.state, "release", None)
                if release is not None:
                    release()
            self.completed += 1
            self.last = completed
            self._step("completed", checkpoint_id)
            # 4. Commit.
            for egress_id in cut.sinks:
                began = time.perf_counter()
                await self.job.sinks[egress_id].commit(checkpoint_id)
                commits = self.commit_seconds.get(egress_id)
                if commits is None:
                    commits = self.commit_seconds[egress_id] = Histogram(LATENCY_BUCKETS)
                commits.observe(time.perf_counter() - began)
                self._step("sink-committed", checkpoint_id)
            if not savepoint:
                for source in self.job.sources:
                    await source.notify_checkpoint_complete(checkpoint_id)
            self.job.release_replies(cut.replies)
            self.job.check_sink_backlog()
            self._step("committed", checkpoint_id)
            if not savepoint:
                self._unpublished.append(staged)
                await self._prune_after_commit()
            # Long-lived state need not be scanned by every full garbage collection again
            # (it holds no reference cycles; reference counting still frees it).
            gc.freeze()
            self.last_duration_ms = (time.perf_counter() - cut.started) * 1000
            self.last_cpu_ms = cut.stall_ms + write_cpu_ms
            self._ended = asyncio.get_running_loop().time()
            self._record(completed)
            log.debug(
                "checkpoint %d complete in %.1f ms (cut %.2f ms, CPU %.1f ms, %d messages, "
                "%d timers)",
                checkpoint_id,
                self.last_duration_ms,
                cut.stall_ms,
                self.last_cpu_ms,
                len(cut.messages),
                len(cut.timers),
            )
            if savepoint:
                log.info("savepoint %d written to %s", checkpoint_id, completed.path)
            return completed

    def _record(self, completed: CompletedCheckpoint) -> None:
        """Keep the figures of a completed checkpoint (``history``, the metrics)."""
        files = completed.metadata.get("files", {})
        size = sum(int(entry[0]) for entry in files.values())
        self.bytes_written += size
        self.durations.observe(self.last_duration_ms / 1000)
        self.last_completed_at = time.time()
        self.history.append(
            {
                "id": completed.id,
                "duration_ms": round(self.last_duration_ms, 2),
                "bytes": size,
                "completed_at": round(self.last_completed_at, 3),
                "savepoint": completed.is_savepoint,
            }
        )

    def _cut(self, checkpoint_id: int) -> Cut:
        started = time.perf_counter()
        job = self.job
        cut = Cut(
            id=checkpoint_id,
            started=started,
            positions={s.ingress_id: s.snapshot_position() for s in job.sources},
            state=job.state.snapshot(),
            messages=job.messages_in_flight(),
            timers=list(job.timers.pending()),
            remote_specs={
                f.typename: [[s.name, s.typename, s.ttl_mode, s.ttl_ms] for s in f.specs.values()]
                for f in job.functions.known()
                if isinstance(f, RemoteFunction) and f.specs
            },
            sinks={
                egress_id: sink.pre_commit(checkpoint_id)
                for egress_id, sink in job.sinks.items()
                if sink.transactional
            },
            replies=job.seal_replies(),
        )
        cut.stall_ms = (time.perf_counter() - started) * 1000
        self.max_stall_ms = max(self.max_stall_ms, cut.stall_ms)
        return cut

    def _write(
        self, folder: Path, cut: Cut, previous: Path | None
    ) -> tuple[dict[str, Any], list[Path]]:
        """The cut's file and the state's files, none fsynced yet: the metadata's entries
        for them, and the files and folders to fsync before the checkpoint completes."""
        state_dir = folder / "state"
        state_dir.mkdir()
        if previous is not None and not previous.is_dir():
            previous = None
        # Messages, timers and sink transactions in one file: one fsync, not three.
        data = bytes(
            msgpack.packb(
                {
                    "messages": encode_envelopes(cut.messages),
                    "timers": encode_timers(cut.timers),
                    "sinks": cut.sinks,
                },
                use_bin_type=True,
            )
        )
        with unsynced_file(folder / CUT_FILE) as out:
            out.write(data)
        manifest, unsynced = cut.state.write_unsynced(state_dir, previous)
        files = {CUT_FILE: [len(data), crc32c(data)]}
        for name, checksum in manifest.pop("checksums", {}).items():
            files[f"state/{name}"] = list(checksum)
        return {"state": manifest, "checksum": ALGORITHM, "files": files}, [
            folder / CUT_FILE,
            *unsynced,
        ]

    def _sync(self, paths: Sequence[Path]) -> None:
        """fsync ``paths`` (files and folders) at once: overlapping fsyncs share the file
        system's journal commits, which under other I/O are most of what a small checkpoint
        costs, where one after another each waits for its own."""
        *others, last = paths
        pending = [self._io.submit(fsync_path, path) for path in others]
        try:
            fsync_path(last)
        finally:
            for future in pending:
                future.result()

    def _metadata(self, cut: Cut, savepoint: bool) -> dict[str, Any]:
        """The metadata of ``cut`` without its files (taken on the event loop's thread)."""
        settings = self.job.settings
        return {
            "format": FORMAT_VERSION,
            "id": cut.id,
            "savepoint": savepoint,
            "created_ms": int(time.time() * 1000),
            "parallelism": settings.parallelism,
            "max_parallelism": settings.max_parallelism,
            "state_backend": settings.state_backend,
            "positions": cut.positions,
            "remote_specs": cut.remote_specs,
            "messages": len(cut.messages),
            "timers": len(cut.timers),
            "sinks": sorted(cut.sinks),
            "state_types": sorted(self.job.state_types),
        }

    def _write_and_complete(
        self,
        folder: Path,
        cut: Cut,
        previous: Path | None,
        metadata: dict[str, Any],
        savepoint: bool,
    ) -> tuple[CompletedCheckpoint, float, StagedMetadata]:
        """Steps 2 (the files) and 3 in a worker thread: the metadata last, under its
        temporary name, then every file durable in one round of fsyncs: the checkpoint is
        complete. A savepoint's metadata takes its name here; a checkpoint's after step 4
        (``_publish_and_prune``), off the replies' path. Returns the checkpoint, the CPU time
        (ms) this thread spent on it and its staged metadata."""
        cpu = time.thread_time()
        files, unsynced = self._write(folder, cut, previous)
        staged = self.storage.stage(folder, {**metadata, **files})
        self._step("staged", cut.id)
        # One round of fsyncs for every file, the metadata under its temporary name, the
        # folder's entries and the folder's own name (made by begin()); then the rename.
        self._sync([*unsynced, staged.path, folder, folder.parent])
        self._step("written", cut.id)
        if savepoint:
            completed = self.storage.publish(staged)
        else:
            completed = self.storage.completed_from(staged)
        return completed, (time.thread_time() - cpu) * 1000, staged

    async def _prune_after_commit(self) -> None:
        """Step 3's deletion of the checkpoints beyond the retained ones: in a worker thread
        that runs on while the next checkpoint is taken (one deletion at a time: one still
        running now leaves this checkpoint's to the next). Once stopped, at once."""
        if self._pruning is not None and not self._pruning.done():
            if not self._stopped.is_set():
                return
            await self._pruning
        if self._stopped.is_set():
            await asyncio.to_thread(self._publish_and_prune)
            return
        self._pruning = asyncio.create_task(self._prune())

    async def _prune(self) -> None:
        try:
            await asyncio.to_thread(self._publish_and_prune)
        except OSError as exc:  # the next checkpoint tries again
            log.warning("deleting old checkpoints failed: %s", exc)

    def _publish_and_prune(self) -> None:
        """The metadata of each complete checkpoint takes its name (oldest first), then the
        checkpoints beyond the retained ones go. A crash before a rename leaves a complete
        checkpoint that the next start verifies and adopts (``CheckpointStorage.prepare``)."""
        while self._unpublished:
            self.storage.publish(self._unpublished[0])
            self._unpublished.popleft()
        self.storage.prune()
