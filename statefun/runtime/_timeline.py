"""The per-address timeline: the last invocations of the addresses someone looks up.

An address is recorded from its first ``GET /addresses/<namespace>/<type>/<id>/timeline``
on (``Timeline.look_up``): from then on each of its invocations goes into a ring of its own
(its last ``timeline_invocations``), for at most ``timeline_addresses`` addresses at once
(the least recently looked up go first, and any not looked up for ``IDLE_S``). The console
asks again as it refreshes, so an address shown there fills as it is invoked. The job's last
``FAILURES`` failed invocations are kept whatever the address, so a first lookup of an address
that failed shows its failures from before. With
``timeline_entries`` set, every invocation of the job also goes into one ring of that many
entries, and a first lookup already finds what that ring still holds of the address.

An entry is one tuple of references:

    (key, started, ended, inputs, detail)

``key`` is the address (typename, id); ``started`` and ``ended`` two ``time.perf_counter()``
readings; ``inputs`` the envelope (or a remote batch's list of them); ``detail`` what the
invocation made: its ``InvocationContext`` (an embedded function: the values after it, the
state names written, its messages, delayed messages and egress records), a ``Remote`` (the
values after a remote batch and its ``InvocationResult``), or the error as one line. None of
these changes after the invocation: nothing is copied, decoded or formatted when recording.
A lookup formats (previews of the first ``PREVIEW`` bytes of each value, ``ITEMS`` items of
each kind) and scans the job's ring, if any, from the newest entry back, ``SCAN_SLICE``
entries at a time, giving the event loop back in between.

Why only looked-up addresses by default: keeping any object of an invocation beyond its end
costs the cheapest embedded function (7-8 us an invocation) far more than the tuple and the
append - allocating into and freeing from memory that has gone cold: 25-35% of its
messages per CPU-second with a ring of the job's last 10,000 (BENCHMARKS.md). A
dispatcher pays one test of an empty dict per invocation while no address is recorded, so
the timeline stays inside the metrics' 3% budget; the job's ring is there for those who want
every address's recent past at that price (a remote function's invocation, tens of
microseconds, hardly notices it).

Memory: an entry holds its invocation's objects (about 2 KB for an invocation with small
messages, ``bench/admin_views.py`` measures it) and the payloads themselves - no preview is
cut when recording (a slice is a copy and a size check per value). At most
``timeline_addresses`` x ``timeline_invocations`` + ``timeline_entries`` + ``FAILURES``
entries; where messages or state values are large, lower them (``timeline_invocations`` 0:
no timeline).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import deque
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import Any

from statefun.runtime._state_view import describe_value, split_address
from statefun.sdk._context import DelayedMessage
from statefun.sdk._messages import Message
from statefun.sdk._types import TypedValue
from statefun.state.base import AddressKey

__all__ = ["FAILURES", "PREVIEW", "Remote", "Timeline", "TimelineView"]

#: bytes of a value kept for its preview
PREVIEW = 48
#: items of each kind kept per entry (messages in and out, state changes, ...); the rest counted
ITEMS = 8
#: entries scanned per step of a lookup (about 0.2 ms), the event loop given back in between
SCAN_SLICE = 4096
#: an address not looked up for this long (s) is no longer recorded
IDLE_S = 600.0
#: failed invocations of any address kept (the last ones), whether it is looked up or not
FAILURES = 256

#: (typename, size in bytes, its first PREVIEW bytes) of a typed value; typename None: none
_Value = tuple[str | None, int, bytes]

#: One invocation as recorded (see the module docstring): the address, perf_counter at the
#: start and at the end, the envelope or envelopes in, what it made.
Entry = tuple[AddressKey, float, float, Any, Any]


class Remote:
    """What a remote batch made: the address's values after it and its InvocationResult."""

    __slots__ = ("result", "values")

    def __init__(self, values: Mapping[str, Any], result: Any) -> None:
        self.values = values
        self.result = result


class Timeline:
    """The addresses recorded since they were looked up, and optionally one ring of all of
    the job's last invocations (see the module docstring)."""

    def __init__(self, per_address: int, addresses: int, entries: int = 0) -> None:
        #: invocations an address's timeline shows (at most)
        self.per_address = per_address
        #: addresses recorded at once (the least recently looked up go first)
        self.addresses = addresses
        #: invocations of all addresses the job's ring holds (0: no such ring)
        self.capacity = entries
        #: Addresses recorded (looked up) -> their last invocations. Read by the dispatchers
        #: (``key in recorded`` before ``record``); written only here.
        self.recorded: dict[AddressKey, deque[Entry]] = {}
        #: addresses recorded -> (monotonic time of their last lookup, wall time since when)
        self._looked_up: dict[AddressKey, tuple[float, float]] = {}
        self._ring: deque[Entry] | None = deque(maxlen=entries) if entries else None
        #: the job's last ``FAILURES`` failed invocations, of every address (failures are
        #: rare: keeping them costs the hot path nothing, and they are what one looks for)
        self._failures: deque[Entry] = deque(maxlen=FAILURES)
        #: whether every invocation is recorded (into the job's ring), not only those of the
        #: addresses looked up
        self.every = self._ring is not None
        #: wall clock minus perf_counter: an entry's time from the clock it reads anyway
        self._wall_offset = time.time() - perf_counter()

    def record(self, key: AddressKey, started: float, inputs: Any, detail: Any) -> None:
        """An invocation of ``key`` (called for the addresses in ``recorded``, or for all with
        ``every``): ``started`` its ``perf_counter()`` at the start, ``inputs`` its envelope
        (or a batch's list of them), ``detail`` an ``InvocationContext``, a ``Remote`` or an
        error line. References only."""
        entry = (key, started, perf_counter(), inputs, detail)
        if self._ring is not None:
            self._ring.append(entry)
        ring = self.recorded.get(key)
        if ring is not None:
            ring.append(entry)

    def failed(self, key: AddressKey, inputs: Any, started: float, error: BaseException) -> None:
        """An invocation of ``key`` with ``inputs`` that failed with ``error`` (kept as one
        line: the exception would hold its traceback's frames); kept for every address."""
        line = f"{type(error).__name__}: {error}"[:500]
        if self.every or key in self.recorded:
            self.record(key, started, inputs, line)
        if self._ring is None:  # (the job's ring holds it already)
            self._failures.append((key, started, perf_counter(), inputs, line))

    def remote(
        self, key: AddressKey, batch: list[Any], started: float, values: Any, result: Any
    ) -> None:
        """A remote batch of ``key``: the values after it and its InvocationResult."""
        if self.every or key in self.recorded:
            self.record(key, started, batch, Remote(values, result))

    def look_up(self, key: AddressKey) -> float:
        """Record ``key`` from now on (if not yet: the least recently looked up address goes
        when ``addresses`` are recorded, and any not looked up for ``IDLE_S``); the wall time
        (s) since when it is recorded."""
        now = time.monotonic()
        for idle in [k for k, (last, _) in self._looked_up.items() if now - last > IDLE_S]:
            self._forget(idle)
        seen = self._looked_up.pop(key, None)
        since = time.time() if seen is None else seen[1]
        self._looked_up[key] = (now, since)  # (the most recent last)
        if key not in self.recorded:
            while len(self.recorded) >= self.addresses:
                self._forget(next(iter(self._looked_up)))
            self.recorded[key] = deque(maxlen=self.per_address)
        return since

    def _forget(self, key: AddressKey) -> None:
        self._looked_up.pop(key, None)
        self.recorded.pop(key, None)

    def snapshot(self) -> list[Entry]:
        """The job's ring, oldest first (references; cheap), empty without one."""
        return [] if self._ring is None else list(self._ring)

    def entries(self, key: AddressKey) -> list[dict[str, Any]]:
        """The address's last ``per_address`` entries, oldest first, as JSON-able data (in
        one go; ``entries_async`` scans the job's ring in slices)."""
        found: list[Entry] = []
        snapshot = self.snapshot()
        _scan(snapshot, len(snapshot), 0, key, found, self.per_address)
        return self._merged(key, found)

    async def entries_async(self, key: AddressKey) -> list[dict[str, Any]]:
        """``entries``, giving the event loop back every ``SCAN_SLICE`` entries scanned."""
        found: list[Entry] = []
        snapshot = self.snapshot()
        stop = len(snapshot)
        while stop > 0 and len(found) < self.per_address:
            start = max(0, stop - SCAN_SLICE)
            _scan(snapshot, stop, start, key, found, self.per_address)
            stop = start
            if stop > 0:
                await asyncio.sleep(0)
        return self._merged(key, found)

    def _merged(self, key: AddressKey, found: list[Entry]) -> list[dict[str, Any]]:
        """The address's own ring, what the job's ring holds of it and its failures kept,
        each invocation once, the last ``per_address`` by time, formatted oldest first."""
        mine = self.recorded.get(key, ())
        seen = {entry[1] for entry in (*found, *mine)}  # (a start time names an invocation)
        failures = [e for e in self._failures if e[0] == key and e[1] not in seen]
        entries = {id(entry): entry for entry in (*found, *mine, *failures)}
        last = sorted(entries.values(), key=lambda entry: entry[2])[-self.per_address :]
        return [self._format(entry) for entry in last]

    def _format(self, entry: Entry) -> dict[str, Any]:
        _, started, ended, inputs, detail = entry
        return _format(ended + self._wall_offset, ended - started, inputs, detail)


def _scan(
    snapshot: list[Entry], stop: int, start: int, key: AddressKey, found: list[Entry], most: int
) -> None:
    """Entries of ``key`` in ``snapshot[start:stop]`` onto ``found``, newest first, until it
    holds ``most``."""
    for index in range(stop - 1, start - 1, -1):
        entry = snapshot[index]
        if entry[0] == key:
            found.append(entry)
            if len(found) >= most:
                return


def _value(typed: Any) -> _Value:
    if typed is None:
        return (None, 0, b"")
    if not typed.has_value:
        return (str(typed.typename), 0, b"")
    data = typed.value
    return (str(typed.typename), len(data), bytes(data[:PREVIEW]))


def _preview(value: _Value) -> dict[str, Any] | None:
    typename, size, head = value
    if typename is None:
        return None
    shown: dict[str, Any] = {"typename": typename, "size": size}
    if size == 0:
        return shown
    if size <= PREVIEW:  # whole: decoded as the state view decodes it
        described = describe_value(TypedValue(typename, head))
        shown["preview"] = described["value"]
        shown["encoding"] = described["encoding"]
        return shown
    try:
        shown["preview"] = head.decode("utf-8", errors="strict") + "..."
        shown["encoding"] = "text"
    except UnicodeDecodeError:
        shown["preview"] = base64.b64encode(head).decode("ascii") + "..."
        shown["encoding"] = "base64"
    return shown


def _shown(typed: Any) -> dict[str, Any]:
    return _preview(_value(typed)) or {}


def _grouped(records: Sequence[tuple[str, Any]]) -> list[tuple[str, list[Any]]]:
    """(egress id, typed value) pairs as (egress id, its values), in order of first record."""
    groups: dict[str, list[Any]] = {}
    for egress_id, typed in records:
        groups.setdefault(egress_id, []).append(typed)
    return list(groups.items())


def _remote_outputs(result: Any) -> tuple[list[Any], list[Any], list[tuple[str, list[Any]]]]:
    """The messages, delayed messages and egress records of a remote ``InvocationResult``."""
    messages = [
        Message(f"{o.target.namespace}/{o.target.type}", o.target.id, o.argument)
        for o in result.outgoing_messages
    ]
    delayed = [
        DelayedMessage(
            d.delay_in_ms,
            None
            if d.is_cancellation_request
            else Message(f"{d.target.namespace}/{d.target.type}", d.target.id, d.argument),
            d.cancellation_token,
        )
        for d in result.delayed_invocations
    ]
    egress = _grouped(
        [(f"{e.egress_namespace}/{e.egress_type}", e.argument) for e in result.outgoing_egresses]
    )
    return messages, delayed, egress


def _outputs(detail: Any) -> tuple[Mapping[str, Any] | None, Sequence[str], Any, Any, Any, Any]:
    """(values after, state names written, messages, delayed messages, egress records per
    egress id, error) of an entry's ``detail``."""
    if isinstance(detail, str):
        return None, (), (), (), (), detail
    if isinstance(detail, Remote):
        written = [m.state_name for m in detail.result.state_mutations]
        return (detail.values, written, *_remote_outputs(detail.result), None)
    storage = detail._storage  # an InvocationContext, after the invocation
    egress = _grouped([(r.typename, r.typed_value) for r in detail.egress])
    return storage._values, storage._dirty, detail.messages, detail.delayed, egress, None


def _format(at: float, duration: float, inputs: Any, detail: Any) -> dict[str, Any]:
    state, written, messages, delayed, egress, error = _outputs(detail)
    if not isinstance(inputs, list):
        inputs = [inputs]
    return {
        "at_ms": int(at * 1000),
        "duration_ms": round(duration * 1000, 3),
        "messages_in": [
            {
                "caller": None if e.caller is None else f"{e.caller.typename}/{e.caller.id}",
                **_shown(e.value),
            }
            for e in inputs[:ITEMS]
        ],
        "messages_in_count": len(inputs),
        "state": [
            {
                "name": name,
                "value": _preview(_value(None if state is None else state.get(name))),
                "deleted": state is None or state.get(name) is None,
            }
            for name in list(written)[:ITEMS]
        ],
        "messages_out": [
            {"target": f"{m.target_typename}/{m.target_id}", **_shown(m.typed_value)}
            for m in messages[:ITEMS]
        ],
        "messages_out_count": len(messages),
        "delayed": [
            {
                "target": None
                if d.message is None
                else f"{d.message.target_typename}/{d.message.target_id}",
                "delay_ms": int(d.delay_ms),
                "cancellation_token": d.cancellation_token or None,
                **({} if d.message is None else _shown(d.message.typed_value)),
            }
            for d in delayed[:ITEMS]
        ],
        "egress": [
            {
                "egress": egress_id,
                "records": len(records),
                "bytes": sum(len(r.value or b"") for r in records),
            }
            for egress_id, records in list(egress)[:ITEMS]
        ],
        "error": error,
    }


class TimelineView:
    """``GET /addresses/<namespace>/<type>/<id>/timeline``."""

    def __init__(self, timeline: Timeline | None) -> None:
        self.timeline = timeline

    async def handle(self, segments: list[str]) -> tuple[int, Any]:
        """(200, JSON data), or (404 or 409, the reason as one line of text)."""
        address = split_address(segments)
        if address is None or address[1] is None:
            return 404, "use /addresses/<namespace>/<type>/<id>/timeline"
        if self.timeline is None:
            return 409, "the timeline is off (setting timeline_invocations is 0)"
        typename, id_ = address
        assert id_ is not None
        key = (typename, id_)
        since = self.timeline.look_up(key)
        return 200, {
            "address": f"{typename}/{id_}",
            "keep": self.timeline.per_address,
            "recorded_since_ms": int(since * 1000),
            "every_invocation": self.timeline.every,
            "invocations": await self.timeline.entries_async(key),
        }
