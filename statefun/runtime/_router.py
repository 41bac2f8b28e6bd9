"""The router: keyBy, from a message to the dispatcher subtask that owns its address.

``key_group = fmix32(crc32(typename, id)) mod max_parallelism`` (``_keygroups.py``, stable
across processes and runs); the subtask owning that key group under Flink's contiguous range
assignment gets the message (``subtask = key_group * P // max_parallelism``). Every message
goes through here: from the sources (``submit``, ``emit``, ``emit_many``), from functions (the
feedback channel), from the timer service and from a restored checkpoint. A message to the
reply typename (``_addresses.REPLY_TYPENAME``) is a reply to an HTTP request-reply call and
goes to ``reply`` instead of a function.

A ``Router`` is the job's ``Admission`` too (``_admission.py``): routing counts each message in
flight inline, which is the runtime's hot path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from statefun._addresses import REPLY_TYPENAME
from statefun._keygroups import key_group_for, subtask_for_key_group
from statefun._settings import Settings
from statefun.runtime._admission import Admission
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import FunctionRegistry
from statefun.sdk._spec import SdkAddress

__all__ = ["Route", "Router", "Subtask"]

_new_object = object.__new__

#: how keyBy reaches an address: (key group, the address's own tuple, the inbox of the subtask
#: owning it or None, whether its function is remote, the subtask's ``offer_run`` or None)
Route = tuple[int, tuple[str, str], Any, bool, Any]


class Subtask(Protocol):
    """A dispatcher subtask, as the router sees it."""

    def offer(self, envelope: Envelope, key_group: int, key: tuple[str, str]) -> None: ...


class Router(Admission):
    """keyBy over the subtasks given to ``connect``; replies go to ``reply``."""

    def __init__(
        self,
        settings: Settings,
        functions: FunctionRegistry,
        changed: asyncio.Event,
        reply: Callable[[Envelope], None],
    ) -> None:
        super().__init__(settings, functions, changed)
        self._reply = reply
        #: address (typename, id) -> its route: (key group, the address's own tuple, the
        #: inbox of the subtask owning it (None: a subtask without one), whether its function
        #: is remote); a cache (bounded: cleared when full, and when the subtasks change)
        self._routes: dict[tuple[str, str], Route] = {}
        #: key group -> the subtask owning it
        self.subtask_of: list[Subtask] = []
        #: key group -> its subtask's inbox (a dispatcher's ``inbox``; None: a subtask without
        #: one): ``send`` appends to one that holds messages itself, as its ``offer`` would
        self._inbox_of: list[Any] = []
        #: key group -> its subtask's ``offer_run`` (a dispatcher's, which takes a run of
        #: messages to one remote address in one call: ``emit_many``; None: a subtask without
        #: one)
        self._offer_run_of: list[Any] = []

    def connect(self, subtasks: Sequence[Subtask]) -> None:
        """Route to ``subtasks`` (the job's dispatchers, one per subtask index)."""
        p, max_p = len(subtasks), self.settings.max_parallelism
        self.subtask_of[:] = [subtasks[subtask_for_key_group(kg, p, max_p)] for kg in range(max_p)]
        self._inbox_of[:] = [getattr(subtask, "inbox", None) for subtask in self.subtask_of]
        self._offer_run_of[:] = [getattr(s, "offer_run", None) for s in self.subtask_of]
        self._routes.clear()

    def reroute(self, key_groups: Iterable[int], subtask: Subtask) -> None:
        """Route ``key_groups`` to ``subtask`` instead (a clustered worker sends the messages
        of key groups other workers own to the exchange this way)."""
        for key_group in key_groups:
            self.subtask_of[key_group] = subtask
            self._inbox_of[key_group] = getattr(subtask, "inbox", None)
            self._offer_run_of[key_group] = getattr(subtask, "offer_run", None)
        self._routes.clear()

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
                if not self.room.is_set():
                    return index
                id_, value = messages[index]
                self.emit(typename, id_, value)
            return len(messages)
        remote, _ = self._kinds.get(typename) or self._kind(typename)
        settings = self.settings
        limit = (
            settings.max_in_flight_remote_messages if remote else settings.max_in_flight_messages
        )
        room = self.room
        routes = self._routes
        new_object = _new_object
        subtask_of = self.subtask_of
        # the counts in flight, kept here and written back (offer() does not read them)
        pending, pending_remote = self.pending, self.pending_remote
        end = len(messages)
        resume = start  # where the loop below goes on from
        run = -1  # the index of a run of messages to one remote address (-1: none)
        try:
            while True:
                for index in range(resume, end):
                    if not room.open:
                        return index
                    id_, value = messages[index]
                    route = routes.get((typename, id_))
                    if route is None:
                        route = self._route((typename, id_))
                    key_group, address, inbox, _, offer_run = route
                    if (
                        offer_run is not None
                        and index > run
                        and index + 1 < end
                        and messages[index + 1][0] == id_
                    ):
                        run = index
                        break  # (below)
                    pending += 1
                    if remote:
                        pending_remote += 1
                        if pending_remote >= limit:
                            room.clear()
                    elif pending - pending_remote >= limit:
                        room.clear()
                    # Envelope(typename, id_, value, None) without the call of its __init__
                    envelope = new_object(Envelope)
                    envelope.typename = typename
                    envelope.id = id_
                    envelope.value = value
                    envelope.caller = envelope.wire = None
                    if inbox:  # (as in ``send``)
                        inbox.append((envelope, key_group, address))
                    else:
                        subtask_of[key_group].offer(envelope, key_group, address)
                else:
                    return end
                # A run of messages to a remote function's address (one hot key): if its
                # batch is in flight, the address takes the run, up to the limit in flight,
                # in one call; else (taken: none) the loop sends its first message as any.
                taken = index  # (the loop broke at the run)
                if not inbox and pending_remote < limit:
                    stop = min(end, index + limit - pending_remote)
                    taken = offer_run(messages, index, stop, address)
                    pending += taken - index
                    pending_remote += taken - index
                    if pending_remote >= limit:
                        room.clear()
                resume = taken
        finally:
            self.pending, self.pending_remote = pending, pending_remote

    def send(self, envelope: Envelope) -> None:
        """Route a message to the dispatcher that owns its address (never waits)."""
        typename = envelope.typename
        if typename == REPLY_TYPENAME:
            self._reply(envelope)
            return
        route = self._routes.get((typename, envelope.id))
        if route is None:
            route = self._route((typename, envelope.id))
        # (the address as the route holds it: one tuple per address, which the slice loop
        # tells apart from others by identity)
        key_group, address, inbox, remote, _ = route
        self.pending = pending = self.pending + 1
        if remote:
            self.pending_remote += 1
            full = self.pending_remote >= self.settings.max_in_flight_remote_messages
        else:
            full = pending - self.pending_remote >= self.settings.max_in_flight_messages
        if full and self.room.open:
            self.room.clear()
        if inbox:  # (what the dispatcher's offer does while its inbox holds messages)
            inbox.append((envelope, key_group, address))
        else:
            self.subtask_of[key_group].offer(envelope, key_group, address)

    def _route(self, address: tuple[str, str]) -> Route:
        """The route of ``address`` (typename, id), computed and kept in the cache, which
        ``send`` and ``emit_many`` read first."""
        routes = self._routes
        if len(routes) >= 100_000:
            routes.clear()
        key_group = key_group_for(*address, self.settings.max_parallelism)
        typename = address[0]
        remote = (self._kinds.get(typename) or self._kind(typename))[0]
        route = routes[address] = (
            key_group,
            address,
            self._inbox_of[key_group],
            remote,
            self._offer_run_of[key_group] if remote else None,
        )
        return route
