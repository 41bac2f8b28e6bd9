"""Dispatcher subtasks: per-address mailboxes, function invocation, applying the results.

A dispatcher owns a contiguous range of key groups. Messages arrive in its inbox in order;
while the inbox is empty, a message to an address with a batch in flight goes straight to that
address's mailbox (the order is the same: nothing waits before it).

* An embedded synchronous function is called at once, in inbox order: that is already one
  invocation at a time per address, with no protobuf and no copy of state beyond a small dict.
  A slice of the inbox runs such invocations in one loop (``_batch.py``, a base class of
  ``Dispatcher``); the rest of the slice, and the invocations of addresses the timeline
  records, come here (``_dispatch``, ``_invoke_embedded``).
* A remote function (and an embedded async one) has at most one batch in flight per address.
  Messages that arrive meanwhile wait in the address's mailbox and form the next batch, up to
  the endpoint's ``maxNumBatchRequests``. All registered state of the address goes with each
  batch; an IncompleteInvocationContext registers the missing specs and the batch is retried.

The results of an invocation are applied in one loop step: state, then outgoing messages
through the feedback channel (back to keyBy), delayed messages and cancellations to the timer
service, egress records to the sinks. A failed batch changes nothing; a result that writes a
state with another type than its spec's is refused whole (``StateWriteRejectedError``: the
batch goes to the dead letters), and a stored value of another type (from before, or after a
spec changed type) is moved out of the state to the dead letters - before a remote address's
next call, or when an embedded function's read of it raises (the invocation then runs once
more) - so one bad write never blocks an address. When a remote address
has its next batch waiting, that step writes the next request (with the new state) before the
other outputs go out (``_Held``): the function server starts on it sooner, and nothing is
waited for in between, so a checkpoint cut sees all of a batch's results or none.
Where results are applied (and where an invocation fails) each invocation goes to the job's
timeline (``_timeline.py``) when it records the address (looked up on the admin port): one
tuple of references.

The job is seen through ``DispatcherJob`` (below). The module stays whole but for the slice
loop (about 800 lines): intake, mailboxes, the embedded and the remote invocation and applying
their results share one subtask's mailbox state; split into objects, each step would reach
into another object's fields or pay a call more per message (the slice loop is a base class
for that reason). TTL and the state
codec live in ``state/_expiring.py``; encoding and decoding the protocol in ``_remote.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import islice
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

from statefun._compiled import hot_loops
from statefun._exceptions import (
    FunctionInvocationError,
    InvalidValueError,
    MalformedResponseError,
    MessageValueError,
    RetryableFunctionError,
    StateTypeMismatchError,
    StateWriteRejectedError,
    TerminalFunctionError,
)
from statefun.runtime._batch import InboxEntry, InboxSlices, scheduled, with_deadlines
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import (
    EmbeddedFunction,
    RemoteFunction,
    StateSpec,
)
from statefun.runtime._remote import (
    decode_from_function,
    encode_to_function,
    ingress_encoding,
    invocation,
)
from statefun.runtime._stats import FunctionStats
from statefun.sdk._context import DelayedMessage, InvocationContext
from statefun.sdk._messages import Message
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._spec import SdkAddress, address_of
from statefun.sdk._storage import unknown_state_hint
from statefun.sdk._types import TypedValue
from statefun.state._expiring import ExpiringValue
from statefun.state._expiring import live_values as _live_values
from statefun.state.base import AddressKey

if TYPE_CHECKING:
    from statefun._settings import Settings
    from statefun.runtime._functions import FunctionRegistry
    from statefun.runtime._remote import RemoteClient
    from statefun.runtime._timeline import Timeline
    from statefun.runtime._timers import TimerService
    from statefun.state.base import StateBackend

__all__ = ["Dispatcher", "DispatcherJob", "ExpiringValue", "group_egress"]

log = logging.getLogger(__name__)

_new_object = object.__new__

#: Dispatcher.offer_run's loop, compiled (statefun/_hotloops.c), when built
_mailbox_run: Callable[..., tuple[int, int]] | None = (
    None if hot_loops is None else hot_loops.mailbox_run
)
#: a reply's egress records grouped per egress id from its bytes, compiled, when built: what
#: group_egress reads from protobuf's objects
_egress_groups: Callable[[bytes, type], dict[str, list[Any]] | None] | None = (
    None if hot_loops is None else hot_loops.egress_groups
)

_MODIFY = pb.FromFunction.PersistedValueMutation.MODIFY
#: the addresses recorded without a timeline: none
_NONE: frozenset[AddressKey] = frozenset()
_MAX_SPEC_ROUNDS = 3


def group_egress(result: Any, typename: str) -> dict[str, list[Any]]:
    """The egress records of a FromFunction's invocation result, per egress id
    (``namespace/type``) in order, ids in the order they first appear (a batch's records mostly
    go to one egress); MalformedResponseError for a record without a full egress id. The same
    as ``statefun/_hotloops.c``'s ``egress_groups`` reads from the reply's bytes."""
    egress: dict[str, list[Any]] = {}
    namespace = kind = None
    records: list[Any] = []
    for e in result.outgoing_egresses:
        if e.egress_namespace != namespace or e.egress_type != kind:
            namespace, kind = e.egress_namespace, e.egress_type
            if not namespace or not kind:
                raise MalformedResponseError(f"function {typename} sent egress without an id")
            records = egress.setdefault(f"{namespace}/{kind}", [])
        records.append(e.argument)
    return egress


def _take(mailbox: deque[Envelope], room: int, batch: list[Envelope]) -> None:
    """Move the first ``room`` messages of ``mailbox`` (all, if it holds no more) to the end
    of ``batch``, in order: in C's loops, not one ``popleft`` per message."""
    if room <= 0 or not mailbox:
        return
    if len(mailbox) <= room:
        batch.extend(mailbox)
        mailbox.clear()
        return
    batch.extend(islice(mailbox, room))
    rest = list(islice(mailbox, room, None))
    mailbox.clear()
    mailbox.extend(rest)


class _Held:
    """A remote batch's outputs and its release, sent once, when first called."""

    __slots__ = ("_count", "_outputs", "_release")

    def __init__(
        self, outputs: Callable[[], None], release: Callable[[int], None], count: int
    ) -> None:
        self._outputs: Callable[[], None] | None = outputs
        self._release = release
        self._count = count

    def __call__(self) -> None:
        outputs, self._outputs = self._outputs, None
        if outputs is not None:
            outputs()
            self._release(self._count)


class DispatcherJob(Protocol):
    """What a dispatcher needs of the job it runs in (``runtime/_job.py``'s ``Job``).

    The job owns ``state_types`` (function types that ever held state here) and ``isolated``
    (messages a quarantine sends one by one); a dispatcher adds to and takes from them.
    """

    @property
    def settings(self) -> Settings: ...
    @property
    def functions(self) -> FunctionRegistry: ...
    @property
    def state(self) -> StateBackend: ...
    @property
    def state_types(self) -> set[str]: ...
    @property
    def isolated(self) -> set[Envelope]: ...
    @property
    def remote_slots(self) -> asyncio.Semaphore: ...
    @property
    def timers(self) -> TimerService: ...
    @property
    def client(self) -> RemoteClient: ...
    @property
    def clock(self) -> Callable[[], int]: ...
    @property
    def timeline(self) -> Timeline | None: ...

    # routing and admission (keyBy, the sources' gate)
    def send(self, envelope: Envelope) -> None: ...
    def release(self, count: int) -> None: ...
    def release_remote(self, count: int) -> None: ...
    def batch_limit(self, typename: str) -> int: ...
    def note_mailbox(self, key: AddressKey, size: int) -> None: ...
    def mailbox_taken(self, key: AddressKey, size: int) -> None: ...

    # outputs and failures
    def egress(self, egress_id: str, values: list[Any]) -> None: ...
    def dead_letter(self, batch: list[Envelope], reason: str) -> None: ...
    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None: ...
    def on_failure(
        self,
        typename: str,
        batch: list[Envelope],
        error: FunctionInvocationError,
        cause: BaseException | None = None,
    ) -> list[Envelope]: ...
    def fail(self, error: BaseException) -> None: ...


class Dispatcher(InboxSlices):
    """One dispatcher subtask."""

    def __init__(self, index: int, job: DispatcherJob) -> None:
        self.index = index
        self.job = job
        self._clock = job.clock  # ms since the epoch: the TTL deadlines
        self.inbox: list[InboxEntry] = []
        #: addresses with a batch in flight -> the messages waiting for the next batch
        self.busy: dict[AddressKey, deque[Envelope]] = {}
        #: addresses with a batch in flight -> that batch (its effects are not applied yet)
        self.in_flight: dict[AddressKey, list[Envelope]] = {}
        #: busy addresses of remote functions -> their batch limit: messages waiting in their
        #: mailboxes are encoded there, while the batch in flight is away, not when their own
        #: batch is sent
        self._encode_ahead: dict[AddressKey, int] = {}
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        #: per function type, the longest mailbox one of its addresses had (metrics)
        self.mailbox_max: dict[str, int] = {}
        #: remote batches waiting for one of the job's connection slots (metrics)
        self.waiting_for_slot = 0
        #: synchronous embedded invocations: one in (this + 1) is timed (-1, metrics off: none)
        self._sample_mask = FunctionStats.EMBEDDED_SAMPLE - 1 if job.settings.metrics else -1
        #: the admin port's timeline (None: off): the addresses it records (those looked up;
        #: empty: none, one test per invocation) or every address
        self._timeline = job.timeline
        self._recorded: Collection[AddressKey] = (
            _NONE if job.timeline is None else job.timeline.recorded
        )
        self._record_every = job.timeline is not None and job.timeline.every
        #: function typename -> how the slice loop runs it (``_batch.py``)
        self._plans: dict[str, Any] = {}

    # -- intake ----------------------------------------------------------------------------

    def offer(self, envelope: Envelope, key_group: int, key: AddressKey) -> None:
        """Take ``envelope`` for ``key`` (its typename and id) in ``key_group``."""
        inbox = self.inbox
        if inbox:
            # (``run`` waits for ``_wake`` only once it found the inbox empty: it is set)
            # (the router's ``send`` does this itself: keep the two in step)
            inbox.append((envelope, key_group, key))
            return
        # Nothing waits before it: a message to an address with a batch in flight joins
        # its mailbox now, so an ingress stops (``note_mailbox``) as soon as the mailbox
        # is full, not a whole poll later, and the loop is free when the reply comes.
        mailbox = self.busy.get(key)
        if mailbox is not None:
            self._wait_in_mailbox(key, mailbox, envelope)
            return
        inbox.append((envelope, key_group, key))
        self._wake.set()

    def offer_run(
        self, messages: Sequence[tuple[str, Any]], start: int, stop: int, key: AddressKey
    ) -> int:
        """Take ``messages[start:stop]`` (``(id, value)`` pairs from no caller, to ``key``'s
        type) from ``start`` on while they go to ``key``'s id, as ``offer`` takes each; the
        index of the first not taken. Only while ``key`` is a remote function's address with
        a batch in flight and the inbox is empty (else it takes none: ``start``); it stops
        after the message that fills the mailbox past its batch limit, as ``offer`` does."""
        mailbox = self.busy.get(key)
        limit = self._encode_ahead.get(key)
        if mailbox is None or limit is None or self.inbox or start >= stop:
            return start
        typename, id_ = key
        append = mailbox.append
        encoding = ingress_encoding(messages[start][1].typename)  # (a run's: the ingress's type)
        size = len(mailbox)
        index = start
        if _mailbox_run is not None and type(messages) is list:
            # the loop below, compiled (the same results); it leaves any message that is not
            # an (id, value) tuple to the loop below
            index, size = _mailbox_run(
                append, messages, start, stop, id_, typename, Envelope, encoding, size, limit
            )
            if index > start and size > limit:  # (it stopped at the limit)
                stop = index
        encode = encoding.encode
        new_object = _new_object
        while index < stop:
            message = messages[index]
            if message[0] != id_:
                break
            index += 1
            # Envelope(typename, id_, value, None) without the call of its __init__, encoded
            # ahead as ``_wait_in_mailbox`` encodes it
            envelope = new_object(Envelope)
            envelope.typename = typename
            envelope.id = id_
            envelope.value = value = message[1]
            envelope.caller = None
            envelope.wire = encode(value)
            append(envelope)
            size += 1
            if size > limit:
                break
        if index > start and size > limit:
            self.job.note_mailbox(key, size)
        if size > self.mailbox_max.get(typename, 0):
            self.mailbox_max[typename] = size
        return index

    def messages(self) -> list[Envelope]:
        """Every message this subtask holds, in the order it would handle them per address."""
        pending: list[Envelope] = []
        for key, mailbox in self.busy.items():
            pending.extend(self.in_flight.get(key, ()))
            pending.extend(mailbox)
        pending.extend(entry[0] for entry in self.inbox)
        return pending

    def callers_waiting(self, caller_typename: str) -> dict[str, str]:
        """For the messages held here whose caller is of ``caller_typename``: caller id ->
        where the message is ("in-flight": in a batch being processed; "its address's
        mailbox"; "the dispatcher's inbox"). Not on the hot path: one pass over them all."""
        where: dict[str, str] = {}
        for key, mailbox in self.busy.items():
            for envelope in self.in_flight.get(key, ()):
                caller = envelope.caller
                if caller is not None and caller.typename == caller_typename:
                    where[caller.id] = "in-flight"
            for envelope in mailbox:
                caller = envelope.caller
                if caller is not None and caller.typename == caller_typename:
                    where[caller.id] = "its address's mailbox (behind a batch in flight)"
        for envelope, _, _ in self.inbox:
            caller = envelope.caller
            if caller is not None and caller.typename == caller_typename:
                where[caller.id] = "the dispatcher's inbox"
        return where

    async def run(self) -> None:
        inbox = self.inbox
        slice_size = self.job.settings.dispatcher_slice
        while True:
            if not inbox:
                self._wake.clear()
                await self._wake.wait()
            self._run_slice(inbox, slice_size)  # (_batch.py; releases what it finished)
            await asyncio.sleep(0)

    async def drain(self) -> None:
        """Wait until every batch in flight has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    # -- dispatch --------------------------------------------------------------------------

    @staticmethod
    def _address(key: AddressKey) -> SdkAddress:
        return address_of(key)

    def _record(self, key: AddressKey, started: float, envelope: Envelope, context: Any) -> None:
        """An embedded invocation to the admin port's timeline, if it records the address
        (``started``: its perf_counter at the start)."""
        if self._timeline is not None and (self._record_every or key in self._recorded):
            self._timeline.record(key, started, envelope, context)

    def _dispatch(self, envelope: Envelope, key_group: int, key: AddressKey) -> int:
        """Handle one message; return how many messages finished (0 if it now waits)."""
        mailbox = self.busy.get(key)
        if mailbox is not None:
            self._wait_in_mailbox(key, mailbox, envelope)
            return 0
        function = self.job.functions.resolve(envelope.typename)
        if type(function) is EmbeddedFunction and not function.function.is_async:
            self._invoke_embedded(function, envelope, key, key_group)
            return 1
        if function is None:
            self.job.dead_letter(
                [envelope], f"no endpoint in the module serves function type {envelope.typename!r}"
            )
            return 1
        self.busy[key] = deque()
        if type(function) is RemoteFunction:
            self._encode_ahead[key] = function.max_batch
        # In flight from now on (not from when the task first runs): a checkpoint cut in
        # between must still see this message.
        self.in_flight[key] = [envelope]
        task = asyncio.get_running_loop().create_task(
            self._run_batches(function, key, key_group, [envelope])
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return 0

    def _wait_in_mailbox(
        self, key: AddressKey, mailbox: deque[Envelope], envelope: Envelope
    ) -> None:
        mailbox.append(envelope)
        if len(mailbox) > self.mailbox_max.get(key[0], 0):
            self.mailbox_max[key[0]] = len(mailbox)
        limit = self._encode_ahead.get(key)
        if limit is not None:
            envelope.wire = invocation(envelope)
        else:
            limit = self.job.batch_limit(key[0])
        if len(mailbox) > limit:
            self.job.note_mailbox(key, len(mailbox))

    # -- embedded functions: prepare, call, apply ---------------------------------------------

    def _prepare_embedded(
        self, function: EmbeddedFunction, envelope: Envelope, key: AddressKey, key_group: int
    ) -> tuple[InvocationContext, int]:
        """The context and the time of one invocation (its storage copies the values at its
        first write: the state's own dict stays as it is)."""
        stored = self.job.state.get(key_group, key)
        now = 0
        if function.has_ttl:
            now = self._clock()
            values = _live_values(stored, now)
        else:
            values = stored if type(stored) is dict else dict(stored) if stored else {}
        storage = function.function.storage_class(envelope.typename, values)
        return InvocationContext(key, storage, envelope.caller), now

    def _failed_embedded(
        self, function: EmbeddedFunction, envelope: Envelope, exc: Exception, started: float
    ) -> None:
        """The function raised: nothing of the invocation is applied; the policy decides (a
        value that fails its own type is the sender's error: a dead letter)."""
        if self._timeline is not None:
            self._timeline.failed((envelope.typename, envelope.id), envelope, started, exc)
        kind = MessageValueError if isinstance(exc, InvalidValueError) else TerminalFunctionError
        function.stats.failures_terminal += 1
        self.job.on_failure(
            function.typename,
            [envelope],
            kind(
                f"function {function.typename} failed on {envelope.id!r}: "
                f"{type(exc).__name__}: {exc}{unknown_state_hint(exc)}"
            ),
            cause=exc,
        )

    def _apply_embedded(
        self,
        function: EmbeddedFunction,
        key: AddressKey,
        key_group: int,
        context: InvocationContext,
        now: int,
        envelope: Envelope,
        started: float,
    ) -> None:
        """State, then messages (feedback), delayed messages and egress, in one step."""
        stats = function.stats
        stats.invocations += 1
        if context.messages:
            stats.messages_out += len(context.messages)
        if context.delayed:
            stats.messages_out += scheduled(context.delayed)
        job = self.job
        storage = context._storage
        dirty = storage._dirty
        if dirty or function.has_ttl:
            new = {k: v for k, v in storage._values.items() if v is not None}
            if function.has_ttl:
                new = with_deadlines(new, function.specs, dirty, now)
            job.state.put(key_group, key, new)
            job.state_types.add(key[0])
        if started:  # the admin port's timeline records this address: references only
            self._record(key, started, envelope, context)
        if context.messages or context.delayed:
            egress = [(r.typename, [r.typed_value]) for r in context.egress]
            self._emit(key, context.address, context.messages, context.delayed, egress)
        else:  # only egress records, or nothing: the common case, without _emit's loops
            for record in context.egress:
                job.egress(record.typename, [record.typed_value])

    def _invoke_embedded(
        self, function: EmbeddedFunction, envelope: Envelope, key: AddressKey, key_group: int
    ) -> None:
        """A synchronous embedded function: the hot path, called from the inbox loop."""
        recorded = self._recorded  # the admin port's timeline: the addresses looked up
        started = perf_counter() if self._record_every or (recorded and key in recorded) else 0.0
        context, now = self._prepare_embedded(function, envelope, key, key_group)
        began = 0.0 if function.stats.invocations & self._sample_mask else perf_counter()
        try:
            function.function.fun(context, Message(envelope.typename, envelope.id, envelope.value))
        except Exception as exc:
            self._embedded_raised(function, envelope, key, key_group, exc, started)
            return
        if began:
            function.stats.latency.observe(perf_counter() - began)
        self._apply_embedded(function, key, key_group, context, now, envelope, started)

    def _embedded_raised(
        self,
        function: EmbeddedFunction,
        envelope: Envelope,
        key: AddressKey,
        key_group: int,
        exc: Exception,
        started: float,
    ) -> None:
        """A synchronous embedded invocation raised ``exc`` (nothing of it is applied)."""
        if type(exc) is StateTypeMismatchError and self._moved_out(function, key, key_group):
            self._invoke_embedded(function, envelope, key, key_group)  # (once: none left)
            return
        self._failed_embedded(function, envelope, exc, started)

    # -- one batch in flight per address -------------------------------------------------------

    async def _run_batches(
        self,
        function: EmbeddedFunction | RemoteFunction,
        key: AddressKey,
        key_group: int,
        batch: list[Envelope],
    ) -> None:
        job = self.job
        release = job.release_remote if isinstance(function, RemoteFunction) else job.release
        # The outputs of a remote batch whose state is applied (messages, delayed messages,
        # egress records, and its release) wait until the address's next request is written,
        # so that the function server gets it sooner: they are sent before the dispatcher
        # first waits for anything (``_Held``), in the step that applied the state, so no
        # checkpoint cut falls between the two.
        held: _Held | None = None
        try:
            while True:
                self.in_flight[key] = batch
                try:
                    if isinstance(function, RemoteFunction):
                        if held is not None and job.remote_slots.locked():
                            held()  # no slot free: this would wait
                            held = None
                        self.waiting_for_slot += 1
                        async with job.remote_slots:
                            self.waiting_for_slot -= 1
                            # Top the batch up with what arrived while waiting for a slot
                            # (in the same step as taking it from the mailbox).
                            mailbox = self.busy[key]
                            room = function.max_batch - len(batch)
                            if job.isolated:
                                room = self._isolated_room(batch, mailbox, room)
                            _take(mailbox, room, batch)
                            job.mailbox_taken(key, len(mailbox))
                            stats = function.stats
                            stats.batches += 1
                            stats.batch_sizes.observe(len(batch))
                            began = perf_counter()
                            try:
                                outputs = await self._call_remote(
                                    function, key, key_group, batch, held
                                )
                                stats.latency.observe(perf_counter() - began)
                            finally:
                                if held is not None:
                                    held()  # (if the call did not)
                                    held = None
                        held = _Held(outputs, release, len(batch))
                    else:
                        await self._call_embedded_async(function, key, key_group, batch)
                        release(len(batch))
                except FunctionInvocationError as exc:
                    if isinstance(exc, RetryableFunctionError):
                        function.stats.failures_retryable += len(batch)
                    else:
                        function.stats.failures_terminal += len(batch)
                    if self._timeline is not None:
                        self._timeline.failed(key, batch, perf_counter(), exc)
                    again = job.on_failure(function.typename, batch, exc)
                    self._put_back(key, again)
                    release(len(batch) - len(again))
                except MalformedResponseError as exc:  # garbage from the function: terminal
                    function.stats.failures_terminal += len(batch)
                    if self._timeline is not None:
                        self._timeline.failed(key, batch, perf_counter(), exc)
                    again = job.on_failure(
                        function.typename, batch, TerminalFunctionError(str(exc))
                    )
                    self._put_back(key, again)
                    release(len(batch) - len(again))
                mailbox = self.busy[key]
                if not mailbox:
                    if held is not None:
                        held()
                        held = None
                    return
                size = min(len(mailbox), job.batch_limit(function.typename))
                if job.isolated:
                    size = self._isolated_room([], mailbox, size)
                batch = [mailbox.popleft() for _ in range(size)]
                job.mailbox_taken(key, len(mailbox))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: fail the job loudly rather than hang
            job.fail(exc)
            raise
        finally:
            self.busy.pop(key, None)
            self.in_flight.pop(key, None)
            self._encode_ahead.pop(key, None)
            job.mailbox_taken(key, 0)

    def _isolated_room(self, batch: list[Envelope], mailbox: deque[Envelope], room: int) -> int:
        """How many messages from the head of ``mailbox`` may join ``batch`` (at most
        ``room``) while a quarantine looks for the message behind a failure: a message it
        suspects travels alone (see Job.on_failure)."""
        isolated = self.job.isolated
        if batch:
            if batch[0] in isolated:
                isolated.discard(batch[0])
                return 0
            allowed = 0
        else:
            if mailbox and mailbox[0] in isolated:
                isolated.discard(mailbox[0])
                return 1
            allowed = 0
        for envelope in mailbox:
            if allowed >= room or envelope in isolated:
                break
            allowed += 1
        return allowed

    def _put_back(self, key: AddressKey, envelopes: list[Envelope]) -> None:
        """Messages of a failed batch to send again (a quarantine took others out of it):
        at the head of the address's mailbox, in order, still in flight."""
        if envelopes:
            self.busy[key].extendleft(reversed(envelopes))

    async def _call_embedded_async(
        self, function: EmbeddedFunction, key: AddressKey, key_group: int, batch: list[Envelope]
    ) -> None:
        stats = function.stats
        stats.batches += 1
        stats.batch_sizes.observe(len(batch))
        for index, envelope in enumerate(batch):
            # Each message is its own invocation, with the state the previous one left; once
            # applied, it is no longer in flight (a checkpoint must not hold it twice).
            self.in_flight[key] = batch[index:]
            for attempt in range(2):
                started = perf_counter()
                context, now = self._prepare_embedded(function, envelope, key, key_group)
                began = perf_counter()
                try:
                    await function.function.fun(
                        context, Message(envelope.typename, envelope.id, envelope.value)
                    )
                    stats.latency.observe(perf_counter() - began)
                except Exception as exc:
                    if (
                        attempt == 0
                        and type(exc) is StateTypeMismatchError
                        and self._moved_out(function, key, key_group)
                    ):
                        continue  # once more, without the values of another type
                    self._failed_embedded(function, envelope, exc, started)
                    break
                self._apply_embedded(function, key, key_group, context, now, envelope, started)
                break

    def _emit(
        self,
        key: AddressKey,
        address: SdkAddress,
        messages: list[Message],
        delayed: list[DelayedMessage],
        egress: Iterable[tuple[str, list[Any]]],
    ) -> None:
        """The output of one invocation: messages to keyBy (feedback), delayed messages and
        cancellations to the timer service, records to the sinks (``egress``: per egress id,
        its typed values in order)."""
        job = self.job
        send = job.send
        for message in messages:
            send(Envelope(message.target_typename, message.target_id, message.typed_value, address))
        for entry in delayed:
            later = entry.message
            if later is None:
                job.timers.cancel(key, entry.cancellation_token)
            else:
                job.timers.schedule(
                    entry.delay_ms,
                    Envelope(later.target_typename, later.target_id, later.typed_value, address),
                    key,
                    entry.cancellation_token,
                )
        for egress_id, values in egress:
            job.egress(egress_id, values)

    async def _call_remote(
        self,
        function: RemoteFunction,
        key: AddressKey,
        key_group: int,
        batch: list[Envelope],
        before_wait: Callable[[], None] | None = None,
    ) -> Callable[[], None]:
        """Call ``function`` with ``batch`` and apply the state it returns; its other outputs,
        to send. ``before_wait`` is called once the request is written, or before anything
        else is waited for."""
        job = self.job
        typename, id_ = key
        started = perf_counter()
        for _ in range(_MAX_SPEC_ROUNDS):
            now = self._clock()
            stored = job.state.get(key_group, key)
            values = _live_values(stored, now) if function.has_ttl else dict(stored or {})
            if values and self._mistyped(function, values):
                self._move_out_mistyped(function, key, key_group, values)
            states = [
                (name, spec.typename, values.get(name)) for name, spec in function.specs.items()
            ]
            body = encode_to_function(typename, id_, states, batch)
            raw = await job.client.call(
                function.url, body, function.endpoint.transport, typename, before_wait
            )
            response = decode_from_function(raw, typename)
            if response.HasField("incomplete_invocation_context"):
                self._register_specs(function, response.incomplete_invocation_context)
                continue
            egress = None if _egress_groups is None else _egress_groups(raw, TypedValue)
            outputs = self._apply_remote(
                function, key, key_group, values, response.invocation_result, now, egress
            )
            if self._timeline is not None:
                self._timeline.remote(key, batch, started, values, response.invocation_result)
            function.stats.invocations += len(batch)
            return outputs
        raise TerminalFunctionError(
            f"function {typename} still reports missing state after {_MAX_SPEC_ROUNDS} rounds"
        )

    def _moved_out(self, function: EmbeddedFunction, key: AddressKey, key_group: int) -> bool:
        """An embedded function read a state value of another type than its spec's: move such
        values out of the address (``_move_out_mistyped``); whether there were any."""
        values = dict(self.job.state.get(key_group, key) or {})
        if not self._mistyped(function, values):
            return False
        self._move_out_mistyped(function, key, key_group, values)
        return True

    @staticmethod
    def _mistyped(function: EmbeddedFunction | RemoteFunction, values: dict[str, Any]) -> bool:
        specs = function.specs
        for name, value in values.items():
            spec = specs.get(name)
            if spec is not None and str(value.typename) != spec.typename:
                return True
        return False

    def _move_out_mistyped(
        self,
        function: EmbeddedFunction | RemoteFunction,
        key: AddressKey,
        key_group: int,
        values: dict[str, Any],
    ) -> None:
        """Stored values whose type is not their spec's (written before such writes were
        refused, or the spec changed type): sent, they would fail every batch of the address.
        Each goes to the dead letters (a record with ``state``: name, value and both types) and
        out of the state, so the address works again; nothing is lost."""
        job = self.job
        stored = dict(job.state.get(key_group, key) or {})
        for name, value in list(values.items()):
            spec = function.specs.get(name)
            if spec is None or str(value.typename) == spec.typename:
                continue
            job.dead_letter_record(
                {
                    "target": key[0],
                    "id": key[1],
                    "state": name,
                    "reason": f"stored state {name!r} of {key[0]}/{key[1]} has type "
                    f"{value.typename}, but its spec says {spec.typename}: moved out of the state",
                },
                value,
            )
            del values[name]
            stored.pop(name, None)
        job.state.put(key_group, key, stored)

    @staticmethod
    def _register_specs(function: RemoteFunction, incomplete: Any) -> None:
        for missing in incomplete.missing_values:
            name = missing.state_name
            if not name or not missing.type_typename:
                raise MalformedResponseError(
                    f"function {function.typename} asked for a state without a name or type"
                )
            expiration = missing.expiration_spec
            spec = StateSpec(
                name,
                missing.type_typename,
                int(expiration.mode),
                int(expiration.expire_after_millis),
            )
            if function.specs.get(name) == spec:
                continue  # (concurrent calls each ask for it: logged by the first)
            function.register(spec)
            log.info(
                "function %s registered state %r (%s)",
                function.typename,
                name,
                missing.type_typename,
            )

    def _apply_remote(
        self,
        function: RemoteFunction,
        key: AddressKey,
        key_group: int,
        values: dict[str, Any],
        result: Any,
        now: int,
        egress: dict[str, list[Any]] | None = None,
    ) -> Callable[[], None]:
        """Apply the state of a batch's result (checked whole first); its other outputs, to
        send (``_emit``). ``egress``: its egress records grouped per egress id, when already
        read from the reply's bytes (``statefun/_hotloops.c``: ``egress_groups``)."""
        typename = function.typename
        # Check everything first: a malformed response must change nothing.
        messages: list[Message] = []
        for outgoing in result.outgoing_messages:
            target = outgoing.target
            if not target.namespace or not target.type or not target.id:
                raise MalformedResponseError(
                    f"function {typename} sent a message without a full target address"
                )
            messages.append(
                Message(f"{target.namespace}/{target.type}", target.id, outgoing.argument)
            )
        delayed: list[DelayedMessage] = []
        for d in result.delayed_invocations:
            if d.is_cancellation_request:
                if not d.cancellation_token:
                    raise MalformedResponseError(
                        f"function {typename} sent a cancellation without a token"
                    )
                delayed.append(DelayedMessage(0, None, d.cancellation_token))
                continue
            target = d.target
            if not target.namespace or not target.type or not target.id:
                raise MalformedResponseError(
                    f"function {typename} sent a delayed message without a full target address"
                )
            if d.delay_in_ms < 0:
                raise MalformedResponseError(f"function {typename} sent a negative delay")
            argument = d.argument
            value = TypedValue(argument.typename, argument.value if argument.has_value else None)
            delayed.append(
                DelayedMessage(
                    d.delay_in_ms,
                    Message(f"{target.namespace}/{target.type}", target.id, value),
                    d.cancellation_token,
                )
            )
        if egress is None:
            egress = group_egress(result, typename)
        written: list[str] = []
        for mutation in result.state_mutations:
            name = mutation.state_name
            if name not in function.specs:
                raise MalformedResponseError(
                    f"function {typename} changed state {name!r}, which it never registered"
                )
            if mutation.mutation_type == _MODIFY:
                tv = mutation.state_value
                expected = function.specs[name].typename
                if tv.typename != expected:
                    raise StateWriteRejectedError(
                        f"function {typename} wrote state {name!r} with type "
                        f"{tv.typename or '(none)'}, but its spec says {expected}: the batch's "
                        "effects are refused and the state is unchanged"
                    )
                values[name] = TypedValue(tv.typename, tv.value if tv.has_value else None)
            else:
                values.pop(name, None)
            written.append(name)
        if written or function.has_ttl:
            if function.has_ttl:
                values = with_deadlines(values, function.specs, written, now)
            self.job.state.put(key_group, key, values)
            self.job.state_types.add(key[0])
        if messages or delayed:
            function.stats.messages_out += len(messages) + scheduled(delayed)
        return functools.partial(
            self._emit, key, self._address(key), messages, delayed, egress.items()
        )
