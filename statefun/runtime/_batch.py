"""A dispatcher's inbox, a slice at a time: synchronous embedded invocations in one loop.

``Dispatcher.run`` hands each slice of its inbox (at most ``dispatcher_slice`` messages, and
at most ``SLICE_SECONDS`` of work) to ``InboxSlices._run_slice``. Messages to synchronous
embedded functions run there, one after another, in inbox order, without a call per step of
the per-message path: the function type's plan (its code, storage class, specs, counters) is
looked up once per run of messages to one type, the address's state is read once for a run of
messages to one address (the values each invocation stored are the next one's; no other code
writes state inside the slice), egress records are gathered per egress id and handed to the
sinks in one ``write_many`` per egress id when the slice ends, and so are the messages handled
taken out of the inbox, in one deletion. Everything else - a message to an
address with a batch in flight, a remote or ``async def`` function, an unknown type, a
function that raised, and a message to an address the admin port's timeline records (every
message when it records every address) - goes to the
per-message path (``Dispatcher._dispatch``, ``Dispatcher._embedded_raised``), and the gathered
egress records are handed on first, so that every output keeps its order: the sinks, the dead
letters and the feedback channel see what the per-message path would show them, in the same
order.

Guarantees, as for the per-message path:

* per address, messages run in inbox order, each with the state the previous one left;
* a slice runs in one event-loop step (nothing is awaited): a checkpoint cut sees every effect
  of a slice's invocations or none, and the in-flight count is released in the same step;
* a function that raises changes nothing of its invocation and goes to the failure policy, as
  before; the other messages of the slice are not affected;
* counters (invocations, messages out, sampled latency) are kept per invocation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from sys import getrefcount
from time import perf_counter
from typing import TYPE_CHECKING, Any

from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import TTL_AFTER_CALL, TTL_AFTER_WRITE, EmbeddedFunction
from statefun.sdk._context import NOTHING_SENT, DelayedMessage, InvocationContext
from statefun.sdk._messages import Message
from statefun.sdk._spec import SdkAddress
from statefun.sdk._storage import UNWRITTEN, Deleting
from statefun.state._expiring import ExpiringValue
from statefun.state._expiring import live_values as _live_values
from statefun.state.base import AddressKey
from statefun.state.memory import MemoryStateBackend

if TYPE_CHECKING:
    from statefun.runtime._dispatcher import DispatcherJob
    from statefun.runtime._functions import StateSpec
    from statefun.runtime._timeline import Timeline

__all__ = ["SLICE_SECONDS", "InboxEntry", "InboxSlices", "scheduled", "with_deadlines"]

#: the longest a slice runs before the dispatcher yields to the loop (checked every 32
#: messages: ``_CLOCK_MASK``), however many messages it has handled
SLICE_SECONDS = 0.005
_CLOCK_MASK = 31
#: most function types whose plan a dispatcher keeps
_MAX_PLANS = 10_000

#: a message in the inbox: the envelope, its key group and its address (typename, id)
InboxEntry = tuple[Envelope, int, AddressKey]


def with_deadlines(
    values: dict[str, Any], specs: dict[str, StateSpec], written: Collection[str], now: int
) -> dict[str, Any]:
    """Set the expiration of each TTL state: after a write, or after any call."""
    for name, spec in specs.items():
        value = values.get(name)
        if value is None or not spec.ttl_mode:
            continue
        if spec.ttl_mode == TTL_AFTER_CALL or (
            spec.ttl_mode == TTL_AFTER_WRITE and name in written
        ):
            values[name] = ExpiringValue(value, now + spec.ttl_ms)
    return values


def scheduled(delayed: list[DelayedMessage]) -> int:
    """Delayed messages sent, without the cancellations among them (not messages)."""
    return sum(1 for entry in delayed if entry.message is not None)


class _Plan:
    """What the slice loop needs of a synchronous embedded function, looked up once."""

    __slots__ = ("fun", "function", "has_ttl", "specs", "stats", "storage_class")

    def __init__(self, function: EmbeddedFunction) -> None:
        self.function = function
        self.fun = function.function.fun
        self.storage_class = function.function.storage_class
        self.has_ttl = function.has_ttl
        self.specs = function.specs
        self.stats = function.stats


_new_object = object.__new__
#: the values of an address without state (the storage never changes the dict it is given)
_NO_VALUES: dict[str, Any] = {}


def _alone() -> int:
    """What ``getrefcount`` tells of an object that one local variable alone holds."""
    held = _Plan.__new__(_Plan)
    return getrefcount(held)


#: (2 on CPython 3.11 to 3.13: the local and the call's argument)
_ALONE = _alone()

#: a function type the slice loop hands to the per-message path
_ELSEWHERE: Any = object()


class InboxSlices:
    """The slice loop of a ``Dispatcher`` (a base class of it: the loop reads the
    dispatcher's own fields, declared here, and calls its per-message path)."""

    job: DispatcherJob
    _timeline: Timeline | None
    #: the addresses the timeline records (their messages take the per-message path); empty
    #: (false): none, and no key is hashed to find out
    _recorded: Collection[AddressKey]
    #: the timeline records every address: every message takes the per-message path
    _record_every: bool
    _sample_mask: int
    _clock: Callable[[], int]
    #: function typename -> its plan, or _ELSEWHERE
    _plans: dict[str, Any]
    #: False: every message takes the per-message path (tests compare the two)
    batched: bool = True

    def _dispatch(self, envelope: Envelope, key_group: int, key: AddressKey) -> int:
        raise NotImplementedError

    def _emit(
        self,
        key: AddressKey,
        address: SdkAddress,
        messages: list[Message],
        delayed: list[DelayedMessage],
        egress: Any,
    ) -> None:
        raise NotImplementedError

    def _embedded_raised(
        self,
        function: EmbeddedFunction,
        envelope: Envelope,
        key: AddressKey,
        key_group: int,
        exc: Exception,
        started: float,
    ) -> None:
        raise NotImplementedError

    def _plan(self, typename: str) -> Any:
        """The plan of ``typename``, or _ELSEWHERE (not a synchronous embedded function, or
        the timeline records every address, which the per-message path does)."""
        function = self.job.functions.resolve(typename)
        plan: Any = _ELSEWHERE
        if (
            self.batched
            and not self._record_every
            and type(function) is EmbeddedFunction
            and not function.function.is_async
        ):
            plan = _Plan(function)
        plans = self._plans
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plans[typename] = plan
        return plan

    def _run_slice(self, inbox: list[InboxEntry], limit: int) -> int:
        """Handle messages from the head of ``inbox`` until ``limit`` of them finished (or
        ``SLICE_SECONDS`` passed), take them out of it (in one deletion, when the slice ends)
        and release them; how many finished."""
        job = self.job
        plans = self._plans
        state = job.state
        get, put = state.get, state.put
        # the memory backend's dicts while no snapshot shares them, read and written here
        # without a call of its get and put (see MemoryStateBackend.unshared_groups)
        memory = state if type(state) is MemoryStateBackend else None
        groups = None if memory is None else memory.unshared_groups()
        group: dict[AddressKey, Any] | None = None  # (of the address, with ``groups`` only)
        written: set[int] = set()  # the key groups written in ``groups`` (told when it ends)
        state_types = job.state_types
        with_state: str | None = None  # the typename last added to state_types
        sample_mask = self._sample_mask
        recorded = self._recorded
        #: egress id -> records gathered in this slice, in order (handed on by ``flush``)
        gathered: dict[str, list[Any]] = {}
        # the address of the previous invocation (the router's own tuple of it: see
        # Router.send) and the values it left in the state: a run of messages to one address
        # reads them once (reset whenever other code runs)
        last_key: AddressKey | None = None
        last_values: Any = None
        deadline = perf_counter() + SLICE_SECONDS
        taken = 0  # messages taken from the head of the inbox (deleted when the slice ends)
        done = 0

        last_egress: str | None = None  # the egress id of ``records``, the list appended to
        records: list[Any] = []
        # the plan of the previous message's type, and its fields: looked up once for a run
        # of messages to one function type
        last_typename: str | None = None
        plan: Any = None
        fun: Any = None
        storage_class: Any = None
        stats: Any = None
        has_ttl = False
        now = 0
        # the previous invocation's objects (None: none yet; never reused)
        storage: Any = None
        context: Any = None
        message: Any = None
        refs = getrefcount
        alone = _ALONE
        alone_in_context = alone + 2  # (a storage: the local and its context's two fields)
        unwritten = UNWRITTEN
        deleting = Deleting
        clock_mask = _CLOCK_MASK
        nothing_sent = NOTHING_SENT
        elsewhere = _ELSEWHERE
        new_object = _new_object

        def flush() -> None:
            nonlocal last_egress
            if gathered:
                egress = job.egress
                for egress_id, values in gathered.items():
                    egress(egress_id, values)
                gathered.clear()
                last_egress = None

        try:
            # (a list iterator: messages appended meanwhile, by keyBy, are seen too)
            for envelope, key_group, key in inbox:
                if done >= limit or (
                    taken & clock_mask == clock_mask and perf_counter() > deadline
                ):
                    break
                taken += 1
                typename = key[0]
                if typename is not last_typename:
                    plan = plans.get(typename)
                    if plan is None:
                        plan = self._plan(typename)
                    last_typename = typename
                    if plan is not elsewhere:
                        fun = plan.fun
                        has_ttl = plan.has_ttl
                        stats = plan.stats
                        storage_class = plan.storage_class
                        if type(storage) is not storage_class or storage._typename != typename:
                            context = None  # (a new context and storage for this type)
                # the per-message path: not a synchronous embedded function, or an address
                # the timeline records (a synchronous function's address is never busy)
                if plan is elsewhere or (recorded and key in recorded):
                    if gathered:
                        flush()
                    last_key = None
                    done += self._dispatch(envelope, key_group, key)
                    continue
                # -- prepare: the values, the storage and the context
                if key is last_key:
                    stored = last_values  # (and ``group`` is still the address's)
                elif groups is not None:
                    group = groups.get(key_group)
                    stored = None if group is None else group.get(key)
                else:
                    stored = get(key_group, key)
                if has_ttl:
                    now = self._clock()
                    values = _live_values(stored, now)
                else:
                    # the state's own dict: the storage copies it at its first write
                    if type(stored) is not dict:
                        stored = dict(stored) if stored else _NO_VALUES
                    values = stored
                # the storage and the context as their __init__ makes them, without its call
                # (a Python frame each; see ``AddressStorage`` and ``InvocationContext``): the
                # previous invocation's objects, made as new, where nothing but this loop holds
                # them any more (a local's count; the storage's, plus its context's two
                # fields), so that no code can tell them from new ones (as CPython's zip()
                # reuses its tuple); both are of this type (see the type's change above)
                if refs(context) == alone:
                    if refs(storage) == alone_in_context:
                        cache = storage._cache
                        if cache:
                            cache.clear()
                    else:
                        storage = new_object(storage_class)
                        storage._typename = typename
                        storage._cache = {}
                        context._storage = context.storage = storage
                else:
                    storage = new_object(storage_class)
                    storage._typename = typename
                    storage._cache = {}
                    context = new_object(InvocationContext)
                    context._storage = context.storage = storage
                storage._values = values
                storage._dirty = unwritten
                context._address = key
                context._caller = envelope.caller
                context.messages = context.delayed = context.egress = nothing_sent
                value = envelope.value
                id_ = key[1]
                if id_ and value is not None:  # what Message() checks (the typename: a plan's)
                    if refs(message) != alone:
                        message = new_object(Message)
                    message.target_typename = typename
                    message.target_id = id_
                    message.typed_value = value
                else:  # (it raises, in the call's try, as the per-message path's does)
                    message = None
                began = 0.0 if stats.invocations & sample_mask else perf_counter()
                # -- call
                try:
                    if message is None:
                        message = Message(typename, id_, value)
                    fun(context, message)
                except Exception as exc:
                    if gathered:
                        flush()
                    last_key = None
                    self._embedded_raised(plan.function, envelope, key, key_group, exc, 0.0)
                    done += 1
                    continue
                if began:
                    stats.latency.observe(perf_counter() - began)
                # -- apply: state, then messages and delayed messages, then egress (gathered)
                stats.invocations += 1
                dirty = storage._dirty
                if dirty or has_ttl:
                    if has_ttl:  # (the storage may be kept past the call: a copy)
                        new = storage._values.copy()
                    else:
                        # the copy the storage made at its first write, from now on the
                        # state's: the storage's next write (kept past the call) copies again
                        new = storage._values
                        storage._dirty = unwritten
                    if type(dirty) is deleting:  # a deleted state is None in values
                        for name in dirty:
                            if new.get(name, elsewhere) is None:
                                del new[name]
                    if has_ttl:
                        new = with_deadlines(new, plan.specs, dirty, now)
                    if group is not None and new:
                        group[key] = new
                        written.add(key_group)
                    else:  # (a new group, or no values left, or not the memory backend)
                        put(key_group, key, new)
                    if typename is not with_state:  # (once per type and slice)
                        state_types.add(typename)
                        with_state = typename
                    last_values = new
                else:
                    last_values = stored
                last_key = key
                messages = context.messages
                delayed = context.delayed
                if messages is not nothing_sent or delayed is not nothing_sent:
                    # the records so far reach the sinks first: whatever a send sets off (a
                    # reply released, a clustered worker's exchange) sees them there
                    if gathered:
                        flush()
                    if messages:
                        stats.messages_out += len(messages)
                    if delayed:
                        stats.messages_out += scheduled(delayed)
                    self._emit(key, context.address, messages, delayed, ())
                for record in context.egress:
                    egress_id = record.typename
                    if egress_id is not last_egress:  # (one egress id, mostly)
                        last_egress = egress_id
                        found = gathered.get(egress_id)
                        if found is None:
                            found = gathered[egress_id] = []
                        records = found
                    records.append(record.typed_value)
                done += 1
        finally:
            if written and memory is not None:
                memory.written(written)
            try:
                del inbox[:taken]
                flush()
            finally:
                if done:
                    job.release(done)
        return done
