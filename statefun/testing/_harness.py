"""``FunctionHarness``: a registry's functions called in this process, with a virtual clock.

The invocation is the runtime's embedded one: the SDK's ``InvocationContext`` and generated
storage class, the values a runtime would pass (expired TTL state left out, the same helpers as
the dispatcher), the results applied as the dispatcher applies them (state, then messages,
delayed messages and cancellations, egress). Delayed messages wait in the runtime's
``TimerService``, driven by the harness's clock instead of the event loop.

Order: messages produced by invocations wait in one FIFO queue and ``run_until_idle`` delivers
them in the order they were sent. That is the order of a runtime with one dispatcher (every
message goes to the back of its inbox; a synchronous embedded function runs at once), and it
keeps the one order a runtime guarantees at any parallelism: the messages of one sender to one
address arrive in the order they were sent.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from statefun._exceptions import FunctionFailedError, InvalidSpecError, UnknownFunctionError
from statefun.runtime._batch import with_deadlines as _with_deadlines
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import StateSpec
from statefun.runtime._timers import TimerService
from statefun.sdk._context import InvocationContext
from statefun.sdk._functions import StatefulFunction, StatefulFunctions
from statefun.sdk._handler import RequestReplyHandler
from statefun.sdk._messages import Message
from statefun.sdk._spec import SdkAddress
from statefun.sdk._storage import storage_mutations
from statefun.sdk._types import Type, TypedValue, validate_typename
from statefun.state._expiring import live_values as _live_values
from statefun.testing._outcome import Delayed, EgressRecord, Outcome, Sent
from statefun.testing._remote import Effects, RemoteCall, SdkProcess, call_remote
from statefun.testing._values import TypeTable

__all__ = ["FunctionHarness"]

#: The clock's start unless told otherwise: fixed, so that deadlines are the same every run.
DEFAULT_START = datetime(2025, 1, 1, tzinfo=UTC)
#: The caller ``call`` uses: the HTTP ingress's reply address, as ``statefun send --call``.
CALL_TYPENAME = "pystatefun.http/reply"

_ONE_MS = timedelta(milliseconds=1)

Address = tuple[str, str]


class _Function:
    """A function of the harness with its state specs as the runtime sees them: embedded (a
    ``StatefulFunction``) or remote (``call``: request bytes in, response bytes out; its specs
    are the ones it asked for)."""

    __slots__ = ("call", "function", "has_ttl", "specs", "value_specs")

    def __init__(self, function: StatefulFunction | None, call: RemoteCall | None = None) -> None:
        self.function = function
        self.call = call
        self.value_specs = function.storage_class._specs if function is not None else {}
        self.specs = {
            s.name: StateSpec.from_value_spec(s) for s in (function.specs if function else ())
        }
        self.has_ttl = any(s.ttl_mode for s in self.specs.values())

    def specs_changed(self) -> None:
        self.has_ttl = any(s.ttl_mode for s in self.specs.values())


def _address(typename: str, id_: str) -> SdkAddress:
    namespace, _, name = typename.rpartition("/")
    return SdkAddress(namespace, name, id_, typename)


def _parse_caller(caller: str | tuple[str, str] | SdkAddress | None) -> SdkAddress | None:
    if caller is None or isinstance(caller, SdkAddress):
        return caller
    if isinstance(caller, str):
        typename, _, id_ = caller.rpartition("/")
        if "/" not in typename or not id_:
            raise ValueError(f"caller {caller!r}: expected 'namespace/type/id'")
        return _address(typename, id_)
    typename, id_ = caller
    return _address(typename, id_)


class FunctionHarness:
    """Runs the functions of a ``StatefulFunctions`` in this process: no sockets, no threads,
    no real time. See docs/guide/testing.md."""

    def __init__(
        self,
        functions: StatefulFunctions | RequestReplyHandler | None = None,
        *,
        remote: Mapping[str, RemoteCall] | SdkProcess | None = None,
        types: Iterable[Type] = (),
        start: datetime = DEFAULT_START,
        max_invocations: int = 100_000,
    ) -> None:
        if isinstance(functions, RequestReplyHandler):
            functions = functions.functions
        if functions is None:
            functions = StatefulFunctions()
        if not isinstance(functions, StatefulFunctions):
            raise TypeError(
                "FunctionHarness takes a statefun.StatefulFunctions (or a RequestReplyHandler "
                f"of one), got {type(functions).__name__}"
            )
        if start.tzinfo is None:
            raise ValueError("start must be an aware datetime (e.g. tzinfo=datetime.UTC)")
        self._functions: dict[str, _Function] = {}
        self._types = TypeTable(types)
        for function in functions:
            self._functions[function.typename] = _Function(function)
            for spec in function.specs:
                self._types.add(spec.type)
            self._types.add_module_types(function.fun)
        if isinstance(remote, SdkProcess):
            remote = dict.fromkeys(remote.typenames, remote)
        for typename, call in (remote or {}).items():
            validate_typename(typename, "remote function typename")
            if typename in self._functions:
                raise ValueError(f"{typename!r} is both a function of the registry and remote")
            if not callable(call):
                raise TypeError(f"remote {typename!r}: expected a callable (bytes -> bytes)")
            self._functions[typename] = _Function(None, call)
        self._now_ms = int(start.timestamp() * 1000)
        self._state: dict[Address, dict[str, Any]] = {}
        self._queue: deque[Envelope] = deque()
        self._timers = TimerService(self._fired, clock=lambda: self._now_ms)
        self._delayed: dict[Envelope, Delayed] = {}
        #: the deadlines of the delayed messages scheduled (cancelled ones too: at those
        #: times nothing fires), earliest first
        self._deadlines: list[int] = []
        self._fired_now: list[Envelope] = []
        self._callers: set[Address] = set()
        self._calls = 0
        self.max_invocations = max_invocations
        #: messages to function types that are not in the harness, in the order they were sent
        self.undelivered: list[Sent] = []

    # -- the clock -------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """The harness's clock (UTC); it moves only with ``advance``."""
        return datetime.fromtimestamp(self._now_ms / 1000, tz=UTC)

    def advance(self, duration: timedelta) -> Outcome:
        """Move the clock by ``duration``: delayed messages that fall due fire in deadline
        order (each at its deadline, with what they cause delivered before the next), and TTL
        state expires. Messages waiting in the queue are delivered first, at the current time.
        What the invocations produced, as one Outcome."""
        if not isinstance(duration, timedelta):
            raise TypeError(f"advance() takes a datetime.timedelta, got {type(duration).__name__}")
        if duration < timedelta(0):
            raise ValueError(f"advance() cannot go back in time ({duration})")
        target = self._now_ms + duration // _ONE_MS
        outcome = Outcome()
        self._drain(outcome)
        deadlines = self._deadlines
        while deadlines and deadlines[0] <= target:
            self._now_ms = max(self._now_ms, heapq.heappop(deadlines))
            self._timers._fire_due()  # every message due now, in deadline order, to _fired
            fired, self._fired_now = self._fired_now, []
            for envelope in fired:
                self._route(envelope, outcome)
            self._drain(outcome)
        self._now_ms = target
        return outcome

    # -- messages in -----------------------------------------------------------------------

    def send(
        self,
        target: str,
        id: str,
        value: Any,
        typename: str | None = None,
        *,
        type: Type | None = None,
        caller: str | tuple[str, str] | SdkAddress | None = None,
    ) -> Outcome:
        """Invoke ``target``/``id`` with ``value`` now; what the invocation produced.

        ``value``: with ``type`` (a statefun Type), encoded by it; a TypedValue as it is; else
        as the file ingress reads a record's value: a str, bool, int or float without
        ``typename`` is the built-in type, with a ``typename`` of a known type that type, bytes
        with a ``typename`` as they are, anything else JSON text of ``typename``. ``caller``
        (``"namespace/type/id"``): what ``context.caller`` is; messages the function sends
        there are the outcome's ``replies``. Messages it sends to functions of the harness wait
        for ``run_until_idle``; those to other function types go to ``undelivered``."""
        if target not in self._functions:
            raise UnknownFunctionError(target, list(self._functions))
        if not isinstance(id, str) or not id:
            raise ValueError(f"the id must be a non-empty str, got {id!r}")
        sender = _parse_caller(caller)
        if sender is not None and sender.typename not in self._functions:
            self._callers.add((sender.typename, sender.id))
        envelope = Envelope(target, id, self._types.encode(value, typename, type), sender)
        outcome = Outcome()
        self._invoke(envelope, outcome)
        return outcome

    def call(
        self,
        target: str,
        id: str,
        value: Any,
        typename: str | None = None,
        *,
        type: Type | None = None,
    ) -> Outcome:
        """``send`` with the caller an HTTP request-reply call has (``statefun send --call``),
        then ``run_until_idle``: the reply, if any, is ``outcome.reply``."""
        self._calls += 1
        outcome = self.send(
            target, id, value, typename, type=type, caller=(CALL_TYPENAME, f"call-{self._calls}")
        )
        outcome.extend(self.run_until_idle())
        return outcome

    def run_until_idle(self) -> Outcome:
        """Deliver the waiting messages to the functions of the harness, and what those send,
        until none is left (delayed messages wait for ``advance``); what they produced."""
        outcome = Outcome()
        self._drain(outcome)
        return outcome

    @property
    def waiting(self) -> list[Sent]:
        """The messages waiting for ``run_until_idle``, in delivery order."""
        return [Sent(e.typename, e.id, self._types.decode(e.value)) for e in self._queue]

    def pending_delayed(self) -> list[Delayed]:
        """The delayed messages not yet due, in deadline order (cancelled ones are gone)."""
        return [self._delayed[entry.envelope] for entry in self._timers.pending()]

    # -- state -----------------------------------------------------------------------------

    def state(self, typename: str, id: str) -> dict[str, Any]:
        """The state of ``typename``/``id`` now, decoded: one entry per value it holds
        (expired TTL values are gone, as a function would find them)."""
        function = self._function(typename)
        values = _live_values(self._state.get((typename, id)), self._now_ms)
        return self._types.decode_state(values, function.value_specs)

    def set_state(self, typename: str, id: str, **values: Any) -> None:
        """Give ``typename``/``id`` these state values (by ValueSpec name, encoded with its
        type; None deletes one), as if the function had written them now."""
        function = self._function(typename)
        key = (typename, id)
        current = dict(self._state.get(key) or {})
        for name, value in values.items():
            spec = function.specs.get(name)
            if spec is None:
                known = ", ".join(sorted(function.specs)) or "none"
                if function.call is not None:
                    known += " (a remote function tells its specs on its first invocation)"
                raise InvalidSpecError(
                    f"{name!r} is not a ValueSpec of {typename!r}; it has: {known}"
                )
            if value is None:
                current.pop(name, None)
                continue
            value_spec = function.value_specs.get(name)
            if value_spec is not None:
                data = value_spec.type.serializer().serialize(value)
                current[name] = TypedValue(spec.typename, data)
            else:
                current[name] = self._types.encode(value, spec.typename, None)
        if function.has_ttl:
            current = _with_deadlines(current, function.specs, list(values), self._now_ms)
        self._state[key] = current

    # -- the invocation --------------------------------------------------------------------

    def _function(self, typename: str) -> _Function:
        function = self._functions.get(typename)
        if function is None:
            raise UnknownFunctionError(typename, list(self._functions))
        return function

    def _drain(self, outcome: Outcome) -> None:
        queue = self._queue
        budget = self.max_invocations
        while queue:
            if budget <= 0:
                raise RuntimeError(
                    f"still {len(queue)} message(s) waiting after {self.max_invocations} "
                    "invocations: do the functions send each other messages forever? "
                    "(FunctionHarness(max_invocations=...))"
                )
            self._invoke(queue.popleft(), outcome)
            budget -= 1

    def _invoke(self, envelope: Envelope, outcome: Outcome) -> None:
        typename, id_ = envelope.typename, envelope.id
        function = self._functions[typename]
        key = (typename, id_)
        now = self._now_ms
        stored = self._state.get(key)
        values = _live_values(stored, now) if function.has_ttl else dict(stored or {})
        try:
            if function.function is not None:
                effects = _call_embedded(function.function, envelope, values)
            else:
                assert function.call is not None
                effects = call_remote(function.call, envelope, function.specs, values)
                function.specs_changed()
        except Exception as exc:
            raise FunctionFailedError(
                f"function {typename}/{id_} raised {type(exc).__name__}: {exc} "
                f"(message {self._describe(envelope)})"
            ) from exc
        self._apply(function, key, values, effects, now, outcome)

    def _apply(
        self,
        function: _Function,
        key: Address,
        values: dict[str, Any],
        effects: Effects,
        now: int,
        outcome: Outcome,
    ) -> None:
        """As the dispatcher applies an invocation: state, then messages, delayed messages and
        cancellations, egress."""
        outcome.invocations += 1
        mutations = effects.mutations
        if mutations or function.has_ttl:
            for name, typed in mutations:
                if typed is None:
                    values.pop(name, None)
                else:
                    values[name] = typed
            new = {k: v for k, v in values.items() if v is not None}
            if function.has_ttl:
                new = _with_deadlines(new, function.specs, [n for n, _ in mutations], now)
            self._state[key] = new
        if mutations:
            written = outcome.states.setdefault(key, {})
            for name, typed in mutations:
                written[name] = self._types.decode(typed)
        address = _address(*key)
        for message in effects.messages:
            sent = Envelope(
                message.target_typename, message.target_id, message.typed_value, address
            )
            self._route(sent, outcome)
        for entry in effects.delayed:
            later = entry.message
            if later is None:
                self._timers.cancel(key, entry.cancellation_token)
                outcome.cancellations.append(entry.cancellation_token)
                continue
            delayed_envelope = Envelope(
                later.target_typename, later.target_id, later.typed_value, address
            )
            record = Delayed(
                later.target_typename,
                later.target_id,
                self._types.decode(later.typed_value),
                timedelta(milliseconds=entry.delay_ms),
                entry.cancellation_token,
                datetime.fromtimestamp((now + entry.delay_ms) / 1000, tz=UTC),
            )
            self._delayed[delayed_envelope] = record
            self._timers.schedule(entry.delay_ms, delayed_envelope, key, entry.cancellation_token)
            heapq.heappush(self._deadlines, now + entry.delay_ms)
            outcome.delayed.append(record)
        for egress_id, typed in effects.egress:
            outcome.egress_records.append(EgressRecord(egress_id, self._types.decode(typed)))

    def _route(self, envelope: Envelope, outcome: Outcome) -> None:
        """A message from a function: to the queue, to the replies, or to ``undelivered``."""
        value = self._types.decode(envelope.value)
        typename, id_ = envelope.typename, envelope.id
        if typename in self._functions:
            self._queue.append(envelope)
            outcome.messages.append(Sent(typename, id_, value))
        elif (typename, id_) in self._callers:
            outcome.replies.append(value)
        else:
            sent = Sent(typename, id_, value)
            outcome.messages.append(sent)
            self.undelivered.append(sent)

    def _fired(self, envelope: Envelope) -> None:
        self._delayed.pop(envelope, None)
        self._fired_now.append(envelope)

    def _describe(self, envelope: Envelope) -> str:
        value = self._types.decode(envelope.value)
        sender = envelope.caller
        source = f" from {sender.typename}/{sender.id}" if sender is not None else ""
        return f"{value!r} of type {envelope.value.typename}{source}"


def _call_embedded(
    function: StatefulFunction, envelope: Envelope, values: dict[str, Any]
) -> Effects:
    """One invocation with the SDK's context and storage (``values`` is written in place)."""
    typename, id_ = envelope.typename, envelope.id
    context = InvocationContext(_address(typename, id_), function.storage_class(typename, values))
    context.set_caller(envelope.caller)
    result = function.fun(context, Message(typename, id_, envelope.value))
    if function.is_async:
        _complete(result, typename)
    egress = [(e.typename, e.typed_value) for e in context.egress]
    return Effects(storage_mutations(context.storage), context.messages, context.delayed, egress)


def _complete(result: Any, typename: str) -> None:
    """Run an async function's coroutine to its end: in an event loop of its own when none
    runs in this thread; inside a running one (an async test), stepped here, which works as
    long as it awaits nothing that needs the loop."""
    coroutine: Coroutine[Any, Any, Any] = result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coroutine)
        return
    try:
        while True:
            waited = coroutine.send(None)
            if waited is not None:
                coroutine.close()
                raise RuntimeError(
                    f"async function {typename} waited for {waited!r}, which needs the event "
                    "loop; in an async test the harness runs async functions only while they "
                    "await nothing that suspends (call the harness from a plain test instead)"
                )
    except StopIteration:
        return
