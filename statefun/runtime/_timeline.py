"""The per-address timeline: the last invocations of recently invoked addresses.

``Timeline.record`` is called by a dispatcher where it applies an invocation's results (and
where an invocation fails). It keeps an entry in a ring of ``timeline_invocations`` entries
per address, for at most ``timeline_addresses`` addresses (the least recently invoked go
first, and their ring is reused). The job keeps a Timeline only while its admin server runs
(``admin_port``), which is where it is read, and not with ``timeline_invocations`` 0: then
the dispatchers record nothing.

An entry holds references to what the invocation made anyway (its envelopes, the values
dict it stored, its lists of outputs or a remote function's result; none of them changes
afterwards): nothing is copied, decoded or formatted on the hot path. ``entries`` formats
when ``GET /addresses/<namespace>/<type>/<id>/timeline`` asks: the first ``PREVIEW`` bytes
of each value, ``ITEMS`` items of each kind. The memory held is that of those invocations'
objects, bounded in count; ``bench/admin_views.py`` measures it for small messages (lower
``timeline_addresses`` where messages are large).
"""

from __future__ import annotations

import base64
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import Any

from statefun.runtime._state_view import describe_value, split_address
from statefun.sdk._context import DelayedMessage
from statefun.sdk._messages import Message
from statefun.sdk._types import TypedValue
from statefun.state.base import AddressKey

__all__ = ["PREVIEW", "Timeline", "TimelineView"]

#: bytes of a value kept for its preview
PREVIEW = 48
#: items of each kind kept per entry (messages in and out, state changes, ...); the rest counted
ITEMS = 8

#: (typename, size in bytes, its first PREVIEW bytes) of a typed value; typename None: none
_Value = tuple[str | None, int, bytes]

#: One invocation as recorded, references only (formatted when asked for): wall time (s),
#: duration (s), the envelopes in, the values after, the state names written, the messages,
#: the delayed messages, the egress records per egress id, a remote function's result (its
#: outputs instead of the three before), the error (one line).
_Entry = tuple[
    float,
    float,
    Any,
    Mapping[str, Any] | None,
    Sequence[str],
    Sequence[Any],
    Sequence[Any],
    Sequence[tuple[str, list[Any]]],
    Any,
    str | None,
]


def _value(typed: Any) -> _Value:
    if typed is None:
        return (None, 0, b"")
    if not typed.has_value:
        return (str(typed.typename), 0, b"")
    data = typed.value
    return (str(typed.typename), len(data), bytes(data[:PREVIEW]))


class Timeline:
    """Bounded rings of entries per address (see the module docstring)."""

    def __init__(self, per_address: int, addresses: int) -> None:
        self.per_address = per_address
        self.addresses = addresses
        self._rings: OrderedDict[AddressKey, deque[_Entry]] = OrderedDict()
        #: wall clock minus perf_counter: an entry's time from the one clock read it takes
        self._wall_offset = time.time() - perf_counter()

    def record(
        self,
        key: AddressKey,
        inputs: Any,
        started: float,
        state: Mapping[str, Any] | None = None,
        written: Sequence[str] = (),
        messages: Sequence[Any] = (),
        delayed: Sequence[Any] = (),
        egress: Sequence[tuple[str, list[Any]]] = (),
        result: Any = None,
        error: BaseException | None = None,
    ) -> None:
        """One invocation of ``key``: ``inputs`` (an envelope, or a list of them), the state
        names ``written`` with the values after it in ``state`` (absent: deleted), the
        ``messages`` sent (``Message``s), ``delayed`` (``DelayedMessage``s) and ``egress``
        records per egress id - or a remote function's ``result`` (``InvocationResult``)
        holding all three - or the ``error`` it failed with; ``started``: its
        ``time.perf_counter()`` at the start. Keeps references (none of them changes
        afterwards) and formats nothing."""
        rings = self._rings
        ring = rings.get(key)
        if ring is None:
            if len(rings) >= self.addresses:  # the least recent address's ring, reused
                ring = rings.popitem(last=False)[1]
                ring.clear()
            else:
                ring = deque(maxlen=self.per_address)
            rings[key] = ring
        else:
            rings.move_to_end(key)
        now = perf_counter()
        ring.append(
            (
                now + self._wall_offset,
                now - started,
                inputs,
                state,
                written,
                messages,
                delayed,
                egress,
                result,
                None if error is None else f"{type(error).__name__}: {error}"[:500],
            )
        )

    def __len__(self) -> int:
        return len(self._rings)

    def entries(self, key: AddressKey) -> list[dict[str, Any]]:
        """The address's entries, oldest first, as JSON-able data."""
        return [_format(entry) for entry in list(self._rings.get(key, ()))]


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
    egress = [
        (f"{e.egress_namespace}/{e.egress_type}", [e.argument]) for e in result.outgoing_egresses
    ]
    return messages, delayed, egress


def _format(entry: _Entry) -> dict[str, Any]:
    at, duration, inputs, state, written, messages, delayed, egress, result, error = entry
    if not isinstance(inputs, list):
        inputs = [inputs]
    if result is not None:
        messages, delayed, egress = _remote_outputs(result)
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

    def handle(self, segments: list[str]) -> tuple[int, Any]:
        """(200, JSON data), or (404 or 409, the reason as one line of text)."""
        address = split_address(segments)
        if address is None or address[1] is None:
            return 404, "use /addresses/<namespace>/<type>/<id>/timeline"
        if self.timeline is None:
            return 409, "the timeline is off (setting timeline_invocations is 0)"
        typename, id_ = address
        assert id_ is not None
        return 200, {
            "address": f"{typename}/{id_}",
            "keep": self.timeline.per_address,
            "invocations": self.timeline.entries((typename, id_)),
        }
