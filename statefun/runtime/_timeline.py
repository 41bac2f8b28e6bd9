"""The per-address timeline: the last invocations of recently invoked addresses.

``Timeline.record`` is called by a dispatcher where it applies an invocation's results (and
where an invocation fails); it keeps a compact entry - sizes and the first ``PREVIEW`` bytes
of each value, at most ``ITEMS`` of each kind of output - in a ring of
``timeline_invocations`` entries per address, for at most ``timeline_addresses`` addresses
(the least recently invoked go first). Nothing is decoded or formatted then: ``entries``
does that when ``GET /addresses/<namespace>/<type>/<id>/timeline`` asks. With
``timeline_invocations`` 0 the job has no Timeline and the dispatcher records nothing.
"""

from __future__ import annotations

import base64
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from statefun.runtime._state_view import describe_value, split_address
from statefun.sdk._types import TypedValue
from statefun.state.base import AddressKey

__all__ = ["PREVIEW", "Timeline", "TimelineView"]

#: bytes of a value kept for its preview
PREVIEW = 48
#: items of each kind kept per entry (messages in and out, state changes, ...); the rest counted
ITEMS = 8

#: (typename, size in bytes, its first PREVIEW bytes) of a typed value; typename None: none
_Value = tuple[str | None, int, bytes]


def _value(typed: Any) -> _Value:
    if typed is None:
        return (None, 0, b"")
    if not typed.has_value:
        return (str(typed.typename), 0, b"")
    data = typed.value
    return (str(typed.typename), len(data), bytes(data[:PREVIEW]))


class _Entry(NamedTuple):
    at_ms: int
    duration_ms: float
    inputs: tuple[tuple[str | None, _Value], ...]  # (caller, value)
    inputs_count: int
    state: tuple[tuple[str, _Value], ...]  # (name, new value; typename None: deleted)
    messages: tuple[tuple[str, _Value], ...]  # (target address, value)
    messages_count: int
    delayed: tuple[tuple[str | None, int, str, _Value], ...]  # (target, delay, token, value)
    egress: tuple[tuple[str, int, int], ...]  # (egress id, records, bytes)
    error: str | None


class Timeline:
    """Bounded rings of entries per address (see the module docstring)."""

    def __init__(self, per_address: int, addresses: int) -> None:
        self.per_address = per_address
        self.addresses = addresses
        self._rings: OrderedDict[AddressKey, deque[_Entry]] = OrderedDict()
        self.recorded = 0

    def record(
        self,
        key: AddressKey,
        inputs: list[Any],
        started: float,
        *,
        state: Mapping[str, Any] | None = None,
        written: Iterable[str] = (),
        messages: Iterable[Any] = (),
        delayed: Iterable[Any] = (),
        egress: Iterable[tuple[str, list[Any]]] = (),
        error: BaseException | None = None,
    ) -> None:
        """One invocation of ``key``: ``inputs`` (envelopes), the state names ``written``
        with their new values in ``state`` (absent: deleted), the ``messages`` sent
        (``Message``s), ``delayed`` (``DelayedMessage``s), ``egress``
        records per egress id, or the ``error`` it failed with; ``started`` is its
        ``time.perf_counter()`` at the start."""
        now = time.perf_counter()
        sent = list(messages)
        entry = _Entry(
            int(time.time() * 1000),
            (now - started) * 1000,
            tuple(
                (
                    None if e.caller is None else f"{e.caller.typename}/{e.caller.id}",
                    _value(e.value),
                )
                for e in inputs[:ITEMS]
            ),
            len(inputs),
            tuple(
                (name, _value(None if state is None else state.get(name)))
                for name in list(written)[:ITEMS]
            ),
            tuple(
                (f"{m.target_typename}/{m.target_id}", _value(m.typed_value)) for m in sent[:ITEMS]
            ),
            len(sent),
            tuple(
                (
                    None
                    if d.message is None
                    else f"{d.message.target_typename}/{d.message.target_id}",
                    int(d.delay_ms),
                    str(d.cancellation_token or ""),
                    _value(None if d.message is None else d.message.typed_value),
                )
                for d in list(delayed)[:ITEMS]
            ),
            tuple(
                (egress_id, len(records), sum(len(r.value or b"") for r in records))
                for egress_id, records in list(egress)[:ITEMS]
            ),
            None if error is None else f"{type(error).__name__}: {error}"[:500],
        )
        rings = self._rings
        ring = rings.get(key)
        if ring is None:
            ring = rings[key] = deque(maxlen=self.per_address)
            if len(rings) > self.addresses:
                rings.popitem(last=False)
        else:
            rings.move_to_end(key)
        ring.append(entry)
        self.recorded += 1

    def __len__(self) -> int:
        return len(self._rings)

    def entries(self, key: AddressKey) -> list[dict[str, Any]]:
        """The address's entries, oldest first, as JSON-able data."""
        return [_format(entry) for entry in self._rings.get(key, ())]


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


def _format(entry: _Entry) -> dict[str, Any]:
    return {
        "at_ms": entry.at_ms,
        "duration_ms": round(entry.duration_ms, 3),
        "messages_in": [{"caller": c, **(_preview(v) or {})} for c, v in entry.inputs],
        "messages_in_count": entry.inputs_count,
        "state": [
            {"name": n, "value": _preview(v), "deleted": v[0] is None} for n, v in entry.state
        ],
        "messages_out": [{"target": t, **(_preview(v) or {})} for t, v in entry.messages],
        "messages_out_count": entry.messages_count,
        "delayed": [
            {"target": t, "delay_ms": d, "cancellation_token": token or None, **(_preview(v) or {})}
            for t, d, token, v in entry.delayed
        ],
        "egress": [{"egress": e, "records": n, "bytes": b} for e, n, b in entry.egress],
        "error": entry.error,
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
