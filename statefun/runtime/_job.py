"""The job: sources -> router -> keyBy -> dispatcher subtasks -> sinks, with feedback.

``Job`` wires one runtime process together and runs it:

1. Sources submit messages; ``submit`` waits while the runtime holds
   ``max_in_flight_messages`` messages or an address's mailbox is past its batch limit, until
   its next batch takes it back within the limit (backpressure). Messages sent by functions
   (the feedback channel) are never refused, so the loop cannot deadlock on itself.
2. keyBy: ``key_group = hash(address) mod max_parallelism``; the dispatcher subtask that owns
   that key group (Flink's contiguous ranges) receives the message.
3. Dispatchers invoke functions and hand their output back here: messages to keyBy (2.),
   delayed messages to the timer service, egress records to the sinks.
4. The job ends when it is stopped (SIGINT/SIGTERM, ``stop()``), when it fails, or - when
   every source is bounded - once every source is exhausted and nothing is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from statefun._exceptions import (
    FunctionInvocationError,
    JobFailedError,
    MessageValueError,
    ModuleError,
    UndeliverableError,
)
from statefun._keygroups import key_group_for, subtask_for_key_group
from statefun._settings import Settings
from statefun.checkpoint.coordinator import CheckpointCoordinator, SimulatedCrash
from statefun.checkpoint.recovery import restore, restore_latest
from statefun.checkpoint.storage import CheckpointStorage, read_checkpoint
from statefun.egress.base import Sink
from statefun.ingress.base import Source
from statefun.module._specs import ModuleSpec
from statefun.runtime._deadletters import DeadLetterFile
from statefun.runtime._dispatcher import Dispatcher
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import FunctionRegistry, RemoteFunction
from statefun.runtime._quarantine import Quarantine, signature
from statefun.runtime._remote import RemoteClient
from statefun.runtime._timers import TimerService
from statefun.sdk._spec import SdkAddress
from statefun.state.base import StateBackend
from statefun.state.memory import MemoryStateBackend

__all__ = ["REPLY_TYPENAME", "Job"]

log = logging.getLogger(__name__)

#: The caller of a request-reply call over the HTTP ingress; a message sent to it is the reply.
REPLY_TYPENAME = "pystatefun.http/reply"


def _make_state_backend(settings: Settings) -> StateBackend:
    if settings.state_backend == "rocksdb":
        from statefun.state.rocksdb import RocksDBStateBackend

        return RocksDBStateBackend(settings.state_dir)
    return MemoryStateBackend()


class Job:
    """One runtime process running a module."""

    def __init__(
        self,
        module: ModuleSpec,
        settings: Settings | None = None,
        *,
        sources: Iterable[Source] = (),
        sinks: Iterable[Sink] = (),
        state: StateBackend | None = None,
    ) -> None:
        self.module = module
        self.settings = settings or Settings()
        self.functions = FunctionRegistry(module)
        self.state: StateBackend = state or _make_state_backend(self.settings)
        self.client = RemoteClient(
            max_connections=self.settings.remote_max_connections,
            initial_backoff_ms=self.settings.remote_retry_initial_backoff_ms,
            max_backoff_ms=self.settings.remote_retry_max_backoff_ms,
            max_response_bytes=self.settings.max_response_bytes,
        )
        self.timers = TimerService(self._fire_delayed)
        #: concurrent remote calls: one per pooled connection (waiting here, not in the pool,
        #: lets a batch keep growing until it can be sent)
        self.remote_slots = asyncio.Semaphore(self.settings.remote_max_connections)
        p, max_p = self.settings.parallelism, self.settings.max_parallelism
        self.dispatchers = [Dispatcher(i, self) for i in range(p)]
        self._subtask_of = [
            self.dispatchers[subtask_for_key_group(kg, p, max_p)] for kg in range(max_p)
        ]
        self.sources = list(sources)
        self.sinks: dict[str, Sink] = {}
        for sink in sinks:
            if sink.egress_id in self.sinks:
                raise ModuleError(f"two sinks for egress {sink.egress_id!r}")
            self.sinks[sink.egress_id] = sink
        self.replies: dict[str, asyncio.Future[Any]] = {}
        #: messages inside the runtime; of them, to remote functions (limited apart)
        self.pending = 0
        self.pending_remote = 0
        #: per function typename: (a remote function?, its batch limit); see _kind
        self._kinds: dict[str, tuple[bool, int]] = {}
        self.dead_letters = 0
        self.dead_letter_file = DeadLetterFile(
            self.settings.dead_letter_path, self.settings.dead_letter_max_bytes
        )
        #: failures that stopped the job, remembered across restarts (on with checkpoints)
        self.quarantine = Quarantine(None, 0)
        #: messages a quarantine suspects: each goes to its function in a batch of its own
        self.isolated: set[Envelope] = set()
        self._room = asyncio.Event()
        self._room.set()
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._failure: BaseException | None = None
        #: addresses whose mailbox is past its batch limit: sources wait until batches take them
        #: back within it (note_mailbox, mailbox_taken)
        self._overfull_mailboxes: set[tuple[str, str]] = set()
        self._sinks_full = False
        self._key_groups: dict[tuple[str, str], int] = {}  # a cache of key_group_for
        #: function types that ever held state here (listed in checkpoints)
        self.state_types: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._source_tasks: list[asyncio.Task[None]] = []
        self._sources_done = 0
        self._missing_egress_logged: set[str] = set()
        # Checkpoints (statefun.checkpoint): on when settings.checkpoint_dir is set.
        self.checkpoints: CheckpointCoordinator | None = None
        self.restore_from: Path | None = None  # a savepoint/checkpoint folder to start from
        self.allow_dropping_state = False
        self.checkpoint_hook: Callable[[str, int], None] | None = None
        self.restored_positions: dict[str, Any] = {}
        self.restored_sinks: dict[str, Any] = {}
        self._hold_replies = False
        self._unreleased_replies: list[tuple[str, Any]] = []
        self._crashed = False
        self._auto_commit = 0
        self.admin: Any = None
        self.stopped_by_user = False

    # -- the IngressContext of sources ----------------------------------------------------

    async def submit(
        self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None
    ) -> None:
        while not self._room.is_set():
            await self._room.wait()
        self.send(Envelope(typename, id_, value, caller))

    async def room(self) -> None:
        while not self._room.is_set():
            await self._room.wait()

    def has_room(self) -> bool:
        return self._room.is_set()

    def emit(self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None) -> None:
        self.send(Envelope(typename, id_, value, caller))

    def emit_many(self, typename: str, messages: Sequence[tuple[str, Any]], start: int = 0) -> int:
        """Send ``messages[start:]`` (``(id, value)`` pairs, from no caller) to ``typename``, in
        order, while there is room: the index of the first one not sent (``len(messages)``:
        all of them). The same as ``has_room()`` then ``emit`` for each, with ``send`` inlined
        (a Kafka ingress's hot path: a polled batch's records mostly go to one function type);
        keep the two in step (tests/unit/test_job_emit_many.py compares them).
        """
        if typename == REPLY_TYPENAME:  # HTTP replies (no source sends them): as ``emit``
            for index in range(start, len(messages)):
                if not self._room.is_set():
                    return index
                id_, value = messages[index]
                self.emit(typename, id_, value)
            return len(messages)
        remote, _ = self._kinds.get(typename) or self._kind(typename)
        settings = self.settings
        limit = (
            settings.max_in_flight_remote_messages if remote else settings.max_in_flight_messages
        )
        room = self._room
        key_groups = self._key_groups
        subtask_of = self._subtask_of
        # the counts in flight, kept here and written back (offer() does not read them)
        pending, pending_remote = self.pending, self.pending_remote
        try:
            for index in range(start, len(messages)):
                if not room.is_set():
                    return index
                id_, value = messages[index]
                address = (typename, id_)
                key_group = key_groups.get(address)
                if key_group is None:
                    key_group = self._new_key_group(address)
                pending += 1
                if remote:
                    pending_remote += 1
                    if pending_remote >= limit:
                        room.clear()
                elif pending - pending_remote >= limit:
                    room.clear()
                subtask_of[key_group].offer(
                    Envelope(typename, id_, value, None), key_group, address
                )
        finally:
            self.pending, self.pending_remote = pending, pending_remote
        return len(messages)

    def is_function_type(self, typename: str) -> bool:
        return self.functions.resolve(typename) is not None

    # -- keyBy and the feedback channel ---------------------------------------------------

    def send(self, envelope: Envelope) -> None:
        """Route a message to the dispatcher that owns its address (never waits)."""
        typename = envelope.typename
        if typename == REPLY_TYPENAME:
            self._reply(envelope)
            return
        address = (typename, envelope.id)
        key_group = self._key_groups.get(address)
        if key_group is None:
            key_group = self._new_key_group(address)
        self.pending += 1
        if (self._kinds.get(typename) or self._kind(typename))[0]:
            self.pending_remote += 1
            full = self.pending_remote >= self.settings.max_in_flight_remote_messages
        else:
            full = self.pending - self.pending_remote >= self.settings.max_in_flight_messages
        if full and self._room.is_set():
            self._room.clear()
        self._subtask_of[key_group].offer(envelope, key_group, address)

    def _new_key_group(self, address: tuple[str, str]) -> int:
        """The key group of ``address`` (typename, id), computed and kept in the cache, which
        ``send`` and ``emit_many`` read first (bounded: cleared when full)."""
        if len(self._key_groups) >= 100_000:
            self._key_groups.clear()
        key_group = key_group_for(*address, self.settings.max_parallelism)
        self._key_groups[address] = key_group
        return key_group

    def release(self, count: int) -> None:
        """``count`` messages (not to remote functions) finished processing."""
        self.pending -= count
        if not self._room.is_set():
            self._open_room_if_due()
        if self.pending == 0:
            self._changed.set()
            held = self._unreleased_replies
            if (
                held
                and len(held) >= len(self.replies)
                and self.checkpoints is not None
                and self.settings.reply_commit_when_idle
            ):
                # Every open call's reply is held and nothing is in flight: no other reply
                # could join the group commit, so commit at once.
                self.checkpoints.request_soon(0)

    def release_remote(self, count: int) -> None:
        """``count`` messages to a remote function finished processing."""
        self.pending_remote -= count
        self.release(count)

    def _open_room_if_due(self) -> None:
        """Let the sources go on once nothing holds them: no overfull mailbox, no full sink,
        and messages in flight down to 80% of ``max_in_flight_messages`` (to embedded
        functions) and of ``max_in_flight_remote_messages`` (to remote ones)."""
        settings = self.settings
        if (
            not self._overfull_mailboxes
            and not self._sinks_full
            and self.pending - self.pending_remote <= settings.max_in_flight_messages * 0.8
            and self.pending_remote <= settings.max_in_flight_remote_messages * 0.8
        ):
            self._room.set()

    def note_mailbox(self, key: tuple[str, str], size: int) -> None:
        """The mailbox of ``key`` (typename, id) grew to ``size``: past its batch limit,
        sources wait until a batch takes it back within the limit (:meth:`mailbox_taken`)."""
        if size > self.batch_limit(key[0]) and key not in self._overfull_mailboxes:
            self._overfull_mailboxes.add(key)
            self._room.clear()

    def mailbox_taken(self, key: tuple[str, str], size: int) -> None:
        """A batch was taken from the mailbox of ``key``, leaving ``size`` messages (0 also
        when the mailbox is gone)."""
        if key in self._overfull_mailboxes and size <= self.batch_limit(key[0]):
            self._overfull_mailboxes.discard(key)
            if not self._overfull_mailboxes:
                self._open_room_if_due()

    def batch_limit(self, typename: str) -> int:
        """The most messages one batch to ``typename`` carries (``maxNumBatchRequests``)."""
        return (self._kinds.get(typename) or self._kind(typename))[1]

    def _kind(self, typename: str) -> tuple[bool, int]:
        """Whether ``typename`` is a remote function's, and its batch limit (cached: both are
        asked for every message)."""
        function = self.functions.resolve(typename)
        kind = (
            (True, function.max_batch) if isinstance(function, RemoteFunction) else (False, 1_000)
        )
        if len(self._kinds) >= 10_000:
            self._kinds.clear()
        self._kinds[typename] = kind
        return kind

    def _fire_delayed(self, envelope: Envelope) -> None:
        self.send(envelope)
        if not self.timers:
            self._changed.set()

    # -- output ---------------------------------------------------------------------------

    def egress(self, egress_id: str, values: list[Any]) -> None:
        """Typed values (in order) for the egress ``egress_id``."""
        sink = self.sinks.get(egress_id)
        if sink is None:
            if egress_id not in self._missing_egress_logged:
                self._missing_egress_logged.add(egress_id)
                log.error(
                    "no egress %r in the module; its records go to the dead letters", egress_id
                )
            record = {"egress": egress_id, "reason": f"unknown egress {egress_id!r}"}
            self._write_dead_letters([(record, value) for value in values])
            return
        sink.write_many(values)

    def _reply(self, envelope: Envelope) -> None:
        if self._hold_replies:
            if not self._unreleased_replies and self.checkpoints is not None:
                self.checkpoints.request_soon(self.settings.reply_checkpoint_delay_ms)
            self._unreleased_replies.append((envelope.id, envelope.value))
        else:
            self._release_reply(envelope.id, envelope.value)

    def _release_reply(self, request_id: str, value: Any) -> None:
        future = self.replies.pop(request_id, None)
        if future is None or future.done():
            log.warning("reply for request %s arrived after its caller left", request_id)
            return
        future.set_result(value)

    def seal_replies(self) -> list[tuple[str, Any]]:
        """At a checkpoint's cut: the replies produced since the last cut (released when the
        checkpoint completes). The dead letters written since are made durable here too: once
        the checkpoint completes their messages are not replayed."""
        self.dead_letter_file.sync()
        sealed, self._unreleased_replies = self._unreleased_replies, []
        return sealed

    def held_replies(self) -> list[tuple[str, Any]]:
        """The replies produced since the last cut, still held (request id, value); read-only."""
        return list(self._unreleased_replies)

    def release_replies(self, replies: list[tuple[str, Any]]) -> None:
        for request_id, value in replies:
            self._release_reply(request_id, value)

    def messages_in_flight(self) -> list[Envelope]:
        """Every message inside the runtime, per address in processing order."""
        messages: list[Envelope] = []
        for dispatcher in self.dispatchers:
            messages.extend(dispatcher.messages())
        return messages

    # -- failures -------------------------------------------------------------------------

    def on_failure(
        self,
        typename: str,
        batch: list[Envelope],
        error: FunctionInvocationError,
        cause: BaseException | None = None,
    ) -> list[Envelope]:
        """A batch failed for good: apply the remote failure policy. The messages of ``batch``
        to send again (the caller puts them back at the head of the address's mailbox, in
        order): those a quarantine left behind; usually none."""
        if isinstance(error, UndeliverableError):  # the input's problem, whatever the policy
            if isinstance(error, MessageValueError) and len(batch) > 1:
                # one message's value is bad: each goes again alone, the bad one fails alone
                log.warning(
                    "%s; the %d messages of the batch go again one by one", error, len(batch)
                )
                self.isolated.update(batch)
                return batch
            self.dead_letter(batch, str(error))
            return []
        if self.settings.remote_failure_policy == "dead-letter":
            log.error("%s; %d message(s) go to the dead letters", error, len(batch), exc_info=cause)
            self.dead_letter(batch, str(error))
            return []
        quarantined = self.quarantine.failed(batch, signature(typename, error))
        if len(quarantined) > 1:
            log.error(
                "%s; failed the job %d times the same way: its %d suspect message(s) are sent "
                "again one by one to find the one that fails",
                error,
                self.quarantine.after,
                len(quarantined),
            )
            self.isolated.update(quarantined)
            return batch
        if quarantined:
            log.error(
                "%s; failed the job %d times the same way: %d message(s) quarantined to the "
                "dead letters, the job goes on",
                error,
                self.quarantine.after,
                len(quarantined),
            )
            self.dead_letter(
                quarantined,
                f"quarantined after failing {self.quarantine.after} times the same way: {error}",
            )
            chosen = {id(envelope) for envelope in quarantined}
            return [envelope for envelope in batch if id(envelope) not in chosen]
        log.error("%s; the job stops (remote_failure_policy=fail)", error, exc_info=cause)
        self.fail(error)
        return []

    def dead_letter(self, batch: list[Envelope], reason: str) -> None:
        """Messages that cannot be delivered: to the dead-letter file (one ERROR line each,
        rate limited); a request-reply caller waiting for one hears the reason at once."""
        records = []
        limiter = self.dead_letter_file.limiter
        for envelope in batch:
            if limiter.allow():
                log.error("dead letter to %s/%s: %s", envelope.typename, envelope.id, reason)
            caller = envelope.caller
            record = {
                "target": envelope.typename,
                "id": envelope.id,
                "caller": caller.typename + "/" + caller.id if caller else None,
                "reason": reason,
            }
            records.append((record, envelope.value))
        seqs = self._write_dead_letters(records)
        for envelope, seq in zip(batch, seqs, strict=True):
            caller = envelope.caller
            if caller is not None and caller.typename == REPLY_TYPENAME:
                future = self.replies.pop(caller.id, None)
                if future is not None and not future.done():
                    future.set_exception(UndeliverableError(f"dead letter {seq}: {reason}"))

    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None:
        """Something other than a message (an ingress record, a state value) that goes to
        the dead letters; ``fields`` say what and why (``reason``). Logged (rate limited)."""
        if self.dead_letter_file.limiter.allow():
            log.error("dead letter: %s", fields.get("reason"))
        self._write_dead_letters([(fields, value)])

    def _write_dead_letters(self, records: list[tuple[dict[str, Any], Any]]) -> list[int]:
        """Append records (with their values) to the dead-letter file, in one open."""
        seqs = self.dead_letter_file.append(records)
        self.dead_letters += len(seqs)
        return seqs

    @property
    def failed(self) -> bool:
        """Whether the job failed (it is stopping; no checkpoint may be cut any more)."""
        return self._failure is not None

    def fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._stopping.set()
        self._changed.set()

    # -- lifecycle ------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the job to stop (graceful: in-flight batches finish, sinks are flushed)."""
        self._stopping.set()
        self._changed.set()

    def _finished(self) -> bool:
        if self._stopping.is_set():
            return True
        bounded = all(s.bounded for s in self.sources)
        return (
            bounded
            and self._sources_done == len(self.sources)
            and self.pending == 0
            and not self.timers
        )

    async def run(self) -> None:
        """Run until stopped, failed, or (bounded sources only) done."""
        await self._start()
        try:
            while not self._finished():
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=0.05)
                await self._flush_sinks()
                self.check_sink_backlog()
                idle_delay = self.settings.idle_checkpoint_delay_ms
                if self.checkpoints is not None and idle_delay and self._idle_with_output():
                    self.checkpoints.request_when_idle(idle_delay)
        finally:
            await self._shutdown()
        if self._failure is not None:
            raise JobFailedError(f"the job failed: {self._failure}") from self._failure

    def _idle_with_output(self) -> bool:
        """Nothing in flight, and an exactly-once egress holds records no cut sealed yet."""
        return self.pending == 0 and any(sink.unsealed() for sink in self.sinks.values())

    def _setup_checkpoints(self) -> None:
        settings = self.settings
        if not settings.checkpoint_dir:
            if self.restore_from is not None:
                checkpoint = read_checkpoint(self.restore_from)
                restore(self, checkpoint, self.allow_dropping_state)
            return
        storage = CheckpointStorage(settings.checkpoint_dir, settings.checkpoints_retained)
        storage.prepare()
        self.quarantine = Quarantine(
            storage.root / "quarantine.json", settings.quarantine_after_failures
        )
        savepoints = Path(settings.savepoint_dir) if settings.savepoint_dir else None
        self.checkpoints = CheckpointCoordinator(
            self, storage, settings.checkpoint_interval_ms, savepoints, self.checkpoint_hook
        )
        self._hold_replies = settings.reply_release == "on-checkpoint"
        if self.restore_from:
            restore(self, read_checkpoint(self.restore_from), self.allow_dropping_state)
        else:  # the newest intact checkpoint, skipping damaged ones
            restore_latest(self, storage, self.allow_dropping_state)

    async def _start(self) -> None:
        # A checkpoint writer thread that gives the GIL back waits for it up to the switch
        # interval while the loop is busy: 5 ms by default, 1 ms here.
        if sys.getswitchinterval() > 0.001:
            sys.setswitchinterval(0.001)
        # Messages allocate many short-lived objects: collect the young generation less
        # often (state itself is frozen out of collections after each checkpoint).
        gen0, _, _ = gc.get_threshold()
        if gen0 < 50_000:
            gc.set_threshold(50_000, 20, 100)
        self._setup_checkpoints()
        gc.freeze()  # restored state: see CheckpointCoordinator
        for sink in self.sinks.values():
            await sink.start()
            if sink.egress_id in self.restored_sinks:
                await sink.recover(self.restored_sinks[sink.egress_id])
        for source in self.sources:
            if source.ingress_id in self.restored_positions:
                await source.restore_position(self.restored_positions[source.ingress_id])
            await source.start()
        await self.client.start()
        self.timers.start()
        loop = asyncio.get_running_loop()
        for dispatcher in self.dispatchers:
            self._tasks.append(loop.create_task(self._guard(dispatcher.run())))
        for source in self.sources:
            self._source_tasks.append(loop.create_task(self._run_source(source)))
        if self.checkpoints is not None:
            self._tasks.append(loop.create_task(self._guard(self.checkpoints.run())))
        if self.settings.admin_port:
            from statefun.runtime._admin import AdminServer

            self.admin = AdminServer(self, self.settings.admin_port)
            await self.admin.start()
        log.info(
            "job started: %d source(s), %d dispatcher subtask(s), %d key groups, %d sink(s)",
            len(self.sources),
            len(self.dispatchers),
            self.settings.max_parallelism,
            len(self.sinks),
        )

    async def _guard(self, work: Any) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except SimulatedCrash as exc:
            self._crashed = True
            self.fail(exc)
        except BaseException as exc:
            log.exception("internal error; the job stops")
            self.fail(exc)

    async def _run_source(self, source: Source) -> None:
        try:
            await source.run(self)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("ingress %s failed", source.ingress_id)
            self.fail(exc)
        finally:
            self._sources_done += 1
            self._changed.set()

    def check_sink_backlog(self) -> None:
        """Close the sources' gate while a sink holds too many records; open it after."""
        limit = self.settings.max_egress_backlog
        full = any(sink.backlog() > limit for sink in self.sinks.values())
        if full and not self._sinks_full:
            log.info("an egress holds more than %d records: ingresses wait for a commit", limit)
            self._sinks_full = True
            self._room.clear()
        elif not full and self._sinks_full:
            self._sinks_full = False
            self._open_room_if_due()

    async def _flush_sinks(self) -> None:
        for sink in self.sinks.values():
            if not sink.transactional or self.checkpoints is not None:
                # A transactional sink may send into its open transaction (Kafka does).
                await sink.flush()
            else:
                # No checkpoints: a transactional sink commits what it has at every flush.
                self._auto_commit += 1
                sink.pre_commit(self._auto_commit)
                await sink.commit(self._auto_commit)

    async def _shutdown(self) -> None:
        for task in self._source_tasks:
            task.cancel()
        await asyncio.gather(*self._source_tasks, return_exceptions=True)
        if self._crashed:  # as if the process died: nothing more leaves or is committed
            for dispatcher in self.dispatchers:
                dispatcher.cancel()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self.timers.stop()
            for source in self.sources:
                await source.close()
            await self.client.close()
            self.state.close()
            return
        if self._failure is None:
            # Let batches in flight finish, so their effects reach the sinks.
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(d.drain() for d in self.dispatchers)), timeout=10
                )
            except TimeoutError:
                log.warning("batches still in flight after 10 s; stopping anyway")
        if self.checkpoints is not None and self._failure is None:
            await self.checkpoints.stop()
        for dispatcher in self.dispatchers:
            dispatcher.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.checkpoints is not None and self._failure is None:
            # A last checkpoint commits the transactional sinks' final records and keeps
            # whatever is still in flight for the next start.
            try:
                await self.checkpoints.checkpoint()
            except SimulatedCrash:
                return
        else:
            await self._flush_sinks()
        self.timers.stop()
        for future in self.replies.values():
            if not future.done():
                future.cancel()
        for source in self.sources:
            await source.close()
        for sink in self.sinks.values():
            await sink.close()
        await self.client.close()
        if self.admin is not None:
            await self.admin.close()
        self.state.close()
        self.dead_letter_file.sync()
        self.dead_letter_file.limiter.flush()
        log.info("job stopped: %d message(s) still in flight", self.pending)
