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

The parts it wires: ``Router`` (``_router.py``: keyBy, and as an ``Admission``,
``_admission.py``, the in-flight counts and the sources' gate), ``Outputs`` (``_outputs.py``:
sinks, replies, dead letters), the dispatchers, the timer service, the state backend and the
checkpoint coordinator. The job lends the router's and the outputs' methods as its own
(``job.send is job.router.send``), so a dispatcher's call costs no extra hop. Dispatchers, the
checkpoint coordinator, recovery and the admin server see the job through the Protocols they
define (``DispatcherJob``, ``CheckpointedJob``, ``RestorableJob``, ``AdminJob``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from statefun._addresses import REPLY_TYPENAME
from statefun._exceptions import (
    FunctionInvocationError,
    JobFailedError,
    MessageValueError,
    UndeliverableError,
)
from statefun._oserrors import describe as describe_os_error
from statefun._settings import Settings
from statefun.checkpoint.coordinator import CheckpointCoordinator, SimulatedCrash
from statefun.checkpoint.recovery import restore, restore_latest
from statefun.checkpoint.storage import CheckpointStorage, read_checkpoint
from statefun.egress.base import Sink
from statefun.ingress.base import Source
from statefun.module._specs import ModuleSpec
from statefun.runtime._dispatcher import Dispatcher
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import FunctionRegistry
from statefun.runtime._ingress_port import IngressPort
from statefun.runtime._outputs import Outputs
from statefun.runtime._probe import probe_endpoints
from statefun.runtime._quarantine import Quarantine, signature
from statefun.runtime._remote import RemoteClient
from statefun.runtime._router import Router
from statefun.runtime._stats import IngressStats, LoopLag
from statefun.runtime._timeline import Timeline
from statefun.runtime._timers import TimerService, now_ms
from statefun.runtime._unanswered import UnansweredCalls
from statefun.sdk._spec import SdkAddress
from statefun.state._registry import create_backend
from statefun.state.base import StateBackend

__all__ = ["REPLY_TYPENAME", "Job"]

log = logging.getLogger(__name__)


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
        clock: Callable[[], int] = now_ms,
        client: RemoteClient | None = None,
        poll_interval_s: float | None = 0.05,
        serve_admin: bool = True,
    ) -> None:
        self.module = module
        #: False: someone else serves the admin port for this job (a cluster worker, whose
        #: admin server outlives the job of each assignment); the timeline is kept all the same
        self._serve_admin = serve_admin
        self.settings = settings or Settings()
        self.functions = FunctionRegistry(module)
        self.state: StateBackend = state or create_backend(
            self.settings.state_backend, self.settings.state_dir
        )
        #: how remote functions are called: pooled HTTP, or what the caller gives (the test
        #: kit's JobHarness calls in-process functions, bytes in and bytes out)
        self.client = client or RemoteClient(
            max_connections=self.settings.remote_max_connections,
            initial_backoff_ms=self.settings.remote_retry_initial_backoff_ms,
            max_backoff_ms=self.settings.remote_retry_max_backoff_ms,
            max_response_bytes=self.settings.max_response_bytes,
            log_interval_s=self.settings.remote_log_interval_ms / 1000.0,
        )
        #: how long the main loop waits for a change before it flushes the sinks anyway (None:
        #: only on a change; a harness on a virtual clock would otherwise wake 20 times for
        #: every virtual second it skips)
        self._poll_interval_s = poll_interval_s
        #: why a /call over the HTTP ingress got no reply in time (asked on its timeout)
        self.unanswered_calls = UnansweredCalls(self, REPLY_TYPENAME)
        #: the wall clock (ms since the epoch) of delayed messages and state TTL
        self.clock = clock
        self.timers = TimerService(self._fire_delayed, clock)
        #: the last invocations of the addresses looked up on the admin port, kept while the
        #: admin server (which shows them) runs; None: not kept
        self.timeline: Timeline | None = (
            Timeline(
                self.settings.timeline_invocations,
                self.settings.timeline_addresses,
                self.settings.timeline_entries,
            )
            if self.settings.timeline_invocations and self.settings.admin_port
            else None
        )
        #: concurrent remote calls: one per pooled connection (waiting here, not in the pool,
        #: lets a batch keep growing until it can be sent)
        self.remote_slots = asyncio.Semaphore(self.settings.remote_max_connections)
        self.sources = list(sources)
        self._changed = asyncio.Event()
        #: egress sinks, replies, dead letters
        self.outputs = Outputs(self.settings, sinks)
        self.sinks = self.outputs.sinks
        self.replies = self.outputs.replies
        self.dead_letter_file = self.outputs.dead_letter_file
        self.egress = self.outputs.egress
        self.dead_letter = self.outputs.dead_letter
        self.dead_letter_record = self.outputs.dead_letter_record
        self.seal_replies = self.outputs.seal_replies
        self.held_replies = self.outputs.held_replies
        self.release_replies = self.outputs.release_replies
        #: keyBy and admission (the in-flight counts, the sources' gate)
        self.router = router = Router(
            self.settings, self.functions, self._changed, self.outputs.reply
        )
        self.send = router.send
        self.emit = router.emit
        self.emit_many = router.emit_many
        self.release = router.release
        self.release_remote = router.release_remote
        if self.settings.reply_commit_when_idle:
            router.on_idle = self._commit_held_replies
        self.note_mailbox = router.note_mailbox
        self.mailbox_taken = router.mailbox_taken
        self.batch_limit = router.batch_limit
        self._room = router.room
        self._overfull_mailboxes = router.overfull_mailboxes
        self._subtask_of = router.subtask_of
        self.dispatchers = [Dispatcher(i, self) for i in range(self.settings.parallelism)]
        router.connect(self.dispatchers)
        #: failures that stopped the job, remembered across restarts (on with checkpoints)
        self.quarantine = Quarantine(None, 0)
        #: messages a quarantine suspects: each goes to its function in a batch of its own
        self.isolated: set[Envelope] = set()
        self._stopping = asyncio.Event()
        self._failure: BaseException | None = None
        #: function types that ever held state here (listed in checkpoints)
        self.state_types: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._source_tasks: list[asyncio.Task[None]] = []
        self._sources_done = 0
        # Checkpoints (statefun.checkpoint): on when settings.checkpoint_dir is set.
        self.checkpoints: CheckpointCoordinator | None = None
        self.restore_from: Path | None = None  # a savepoint/checkpoint folder to start from
        self.allow_dropping_state = False
        self.checkpoint_hook: Callable[[str, int], None] | None = None
        self.restored_positions: dict[str, Any] = {}
        self.restored_sinks: dict[str, Any] = {}
        self._crashed = False
        self.admin: Any = None
        self.stopped_by_user = False
        #: per ingress id, the records it handed over and its time blocked (metrics)
        self.ingress_stats: dict[str, IngressStats] = {}
        #: how late the event loop runs (probed while metrics are on)
        self.loop_lag = LoopLag()

    # -- the IngressContext of sources ----------------------------------------------------

    async def submit(
        self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None
    ) -> None:
        while not self._room.is_set():
            await self._room.wait()
        self.send(Envelope(typename, id_, value, caller))

    @property
    def pending(self) -> int:
        """Messages inside the runtime (``pending_remote`` of them to remote functions)."""
        return self.router.pending

    @pending.setter
    def pending(self, count: int) -> None:
        self.router.pending = count

    @property
    def pending_remote(self) -> int:
        return self.router.pending_remote

    @pending_remote.setter
    def pending_remote(self, count: int) -> None:
        self.router.pending_remote = count

    @property
    def dead_letters(self) -> int:
        """Dead letters written since the job started."""
        return self.outputs.dead_letters

    async def room(self) -> None:
        while not self._room.is_set():
            await self._room.wait()

    def has_room(self) -> bool:
        return self._room.is_set()

    def is_function_type(self, typename: str) -> bool:
        return self.functions.resolve(typename) is not None

    def _commit_held_replies(self) -> None:
        """Nothing is in flight: if every open call's reply is held, no other reply could join
        the group commit, so the checkpoint that releases them starts at once."""
        if self.checkpoints is not None and self.outputs.every_reply_held():
            self.checkpoints.request_soon(0)

    def _fire_delayed(self, envelope: Envelope) -> None:
        self.send(envelope)
        if not self.timers:
            self._changed.set()

    # -- what checkpoints and the admin server read ----------------------------------------

    def messages_in_flight(self) -> list[Envelope]:
        """Every message inside the runtime, per address in processing order."""
        messages: list[Envelope] = []
        for dispatcher in self.dispatchers:
            messages.extend(dispatcher.messages())
        return messages

    def counters(self) -> dict[str, int]:
        """What the admin server's status reports (``runtime/_admin.py``)."""
        return {
            "messages_in_flight": self.pending,
            "remote_messages_in_flight": self.pending_remote,
            "invocations": sum(f.stats.invocations for f in self.functions.known()),
            "delayed_messages": len(self.timers),
            "dead_letters": self.dead_letters,
            "parallelism": len(self.dispatchers),
        }

    # -- restoring a checkpoint (statefun.checkpoint.recovery) ------------------------------

    def restored(self, positions: dict[str, Any], sinks: dict[str, Any]) -> None:
        """The sources' positions and the sinks' transactions to resume from, per id."""
        self.restored_positions = positions
        self.restored_sinks = sinks

    def add_state_types(self, typenames: Iterable[str]) -> None:
        self.state_types.update(typenames)

    def drop_state_type(self, typename: str) -> None:
        self.state_types.discard(typename)

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
            if self.dead_letter_file.limiter.allow():  # (a flood of failures: a few lines)
                log.error(
                    "%s; %d message(s) go to the dead letters", error, len(batch), exc_info=cause
                )
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
        if self._failure is None:  # (the other batches failing meanwhile add nothing)
            log.error("%s; the job stops (remote_failure_policy=fail)", error, exc_info=cause)
        self.fail(error)
        return []

    @property
    def failed(self) -> bool:
        """Whether the job failed (it is stopping; no checkpoint may be cut any more)."""
        return self._failure is not None

    def fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._stopping.set()
        self._changed.set()

    def crash(self) -> None:
        """Stop at once as if the process died here: the dispatchers are cancelled, nothing
        more is committed or checkpointed, the state is dropped (``run`` then raises
        ``JobFailedError``). The test kit's ``crash_and_restore``; the runtime never calls it."""
        self._crashed = True
        self.fail(SimulatedCrash("simulated crash"))

    # -- lifecycle ------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the job to stop (graceful: in-flight batches finish, sinks are flushed)."""
        self._stopping.set()
        self._changed.set()

    def abandon(self) -> None:
        """Stop as if the process died: nothing more leaves, nothing is flushed or committed
        (a clustered worker drops the job of partitions it gave up after their checkpoint)."""
        self._crashed = True
        self.stop()

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
                    await asyncio.wait_for(self._changed.wait(), timeout=self._poll_interval_s)
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
        return self.router.pending == 0 and self.outputs.unsealed()

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
        self.checkpoints = checkpoints = CheckpointCoordinator(
            self, storage, settings.checkpoint_interval_ms, savepoints, self.checkpoint_hook
        )
        if settings.reply_release == "on-checkpoint":
            delay = settings.reply_checkpoint_delay_ms
            self.outputs.hold_replies(lambda: checkpoints.request_soon(delay))
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
        if self.settings.metrics and self.settings.admin_port:
            # read only through the admin port; a job without one (or on a virtual clock,
            # where four wake-ups a second are millions a month) does not probe
            self._tasks.append(loop.create_task(self._guard(self.loop_lag.run())))
        if self.checkpoints is not None:
            self._tasks.append(loop.create_task(self._guard(self.checkpoints.run())))
        # one connect per remote endpoint, in the background: the job does not wait for it
        probe = probe_endpoints(self.module.endpoints, self.settings.remote_probe_timeout_ms / 1000)
        self._tasks.append(loop.create_task(self._guard(probe)))
        if self.settings.admin_port and self._serve_admin:
            from statefun.runtime._admin import AdminServer

            self.admin = AdminServer(self, self.settings.admin_port, self.settings.admin_host)
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
        except OSError as exc:  # the machine refused (a file too large, a full disk): one line
            log.debug("the job stops", exc_info=exc)
            log.error("%s; the job stops", describe_os_error(exc))
            self.fail(exc)
        except BaseException as exc:
            log.exception("internal error; the job stops")
            self.fail(exc)

    async def _run_source(self, source: Source) -> None:
        port = IngressPort(self, self.router)
        self.ingress_stats[source.ingress_id] = port
        try:
            await source.run(port)
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
        full = self.outputs.backlog_over(limit)
        if self.router.sinks_full(full) and full:
            log.info("an egress holds more than %d records: ingresses wait for a commit", limit)

    async def _flush_sinks(self) -> None:
        await self.outputs.flush_sinks(self.checkpoints is not None)

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
        self.outputs.cancel_replies()
        for source in self.sources:
            await source.close()
        await self.outputs.close()
        await self.client.close()
        if self.admin is not None:
            await self.admin.close()
        self.state.close()
        log.info("job stopped: %d message(s) still in flight", self.pending)
