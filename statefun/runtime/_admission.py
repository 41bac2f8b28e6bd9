"""Admission: how many messages the runtime holds, and the gate the sources wait at.

The sources may go on (``room`` is set) while the runtime holds fewer than
``max_in_flight_messages`` messages to embedded functions and ``max_in_flight_remote_messages``
to remote ones, no address's mailbox is past its batch limit (``maxNumBatchRequests``) and no
sink holds more than ``max_egress_backlog`` records. Once closed, the gate opens again when
nothing holds it and the counts are down to 80% of their limits. Messages sent by functions
(the feedback channel) are counted but never refused, so the loop cannot deadlock on itself.

``Router`` (``_router.py``) is an ``Admission``: keyBy counts each message as it routes it,
inline, on the hot path; dispatchers give the counts back (``release``, ``release_remote``)
and report their mailboxes (``note_mailbox``, ``mailbox_taken``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from statefun._settings import Settings
from statefun.runtime._functions import FunctionRegistry, RemoteFunction

__all__ = ["Admission", "Gate"]


class Gate(asyncio.Event):
    """The sources' gate: an ``asyncio.Event`` whose state is also a plain attribute, ``open``
    (tested for every record a source submits: ``is_set()`` is a call)."""

    def __init__(self) -> None:
        super().__init__()
        self.open = False

    def set(self) -> None:
        self.open = True
        super().set()

    def clear(self) -> None:
        self.open = False
        super().clear()


class Admission:
    """The in-flight counts and the sources' gate of one job."""

    def __init__(
        self, settings: Settings, functions: FunctionRegistry, changed: asyncio.Event
    ) -> None:
        self.settings = settings
        self.functions = functions
        #: set when nothing is in flight any more (the job's main loop wakes up)
        self._changed = changed
        #: messages inside the runtime; of them, to remote functions (limited apart)
        self.pending = 0
        self.pending_remote = 0
        #: per function typename: (a remote function?, its batch limit); see _kind
        self._kinds: dict[str, tuple[bool, int]] = {}
        #: set while the sources may go on
        self.room = Gate()
        self.room.set()
        #: addresses whose mailbox is past its batch limit: sources wait until batches take them
        #: back within it (note_mailbox, mailbox_taken)
        self.overfull_mailboxes: set[tuple[str, str]] = set()
        self._sinks_full = False
        #: called when nothing is in flight any more (the job may commit held replies at once)
        self.on_idle: Callable[[], None] | None = None

    def release(self, count: int) -> None:
        """``count`` messages (not to remote functions) finished processing."""
        self.pending -= count
        if not self.room.is_set():
            self._open_room_if_due()
        if self.pending == 0:
            self._changed.set()
            if self.on_idle is not None:
                self.on_idle()

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
            not self.overfull_mailboxes
            and not self._sinks_full
            and self.pending - self.pending_remote <= settings.max_in_flight_messages * 0.8
            and self.pending_remote <= settings.max_in_flight_remote_messages * 0.8
        ):
            self.room.set()

    def note_mailbox(self, key: tuple[str, str], size: int) -> None:
        """The mailbox of ``key`` (typename, id) grew to ``size``: past its batch limit,
        sources wait until a batch takes it back within the limit (:meth:`mailbox_taken`)."""
        if size > self.batch_limit(key[0]) and key not in self.overfull_mailboxes:
            self.overfull_mailboxes.add(key)
            self.room.clear()

    def mailbox_taken(self, key: tuple[str, str], size: int) -> None:
        """A batch was taken from the mailbox of ``key``, leaving ``size`` messages (0 also
        when the mailbox is gone)."""
        if key in self.overfull_mailboxes and size <= self.batch_limit(key[0]):
            self.overfull_mailboxes.discard(key)
            if not self.overfull_mailboxes:
                self._open_room_if_due()

    def sinks_full(self, full: bool) -> bool:
        """A sink holds too many records (``full``), or no longer: close or open the gate.
        Whether that changed anything."""
        if full == self._sinks_full:
            return False
        self._sinks_full = full
        if full:
            self.room.clear()
        else:
            self._open_room_if_due()
        return True

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
