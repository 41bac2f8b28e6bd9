"""msgpack encodings of what a checkpoint holds besides state: messages and timers."""

from __future__ import annotations

from typing import Any

import msgpack

from statefun.runtime._envelope import Envelope
from statefun.runtime._timers import DelayedEntry
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import TypedValue

__all__ = [
    "decode_envelopes",
    "decode_timers",
    "encode_envelopes",
    "encode_timers",
    "envelope_from_row",
    "envelope_row",
]


def _envelope_row(e: Envelope) -> list[Any]:
    c = e.caller
    v = e.value
    return [
        e.typename,
        e.id,
        None if c is None else [c.namespace, c.name, c.id],
        str(v.typename),
        bool(v.has_value),
        bytes(v.value),
    ]


def _envelope(row: list[Any]) -> Envelope:
    typename, id_, caller, v_typename, has_value, value = row
    address = None
    if caller is not None:
        namespace, name, cid = caller
        address = SdkAddress(namespace, name, cid, f"{namespace}/{name}")
    return Envelope(typename, id_, TypedValue(v_typename, value if has_value else None), address)


#: one message as plain (msgpack-able) data, and back (also the cluster's exchange records)
envelope_row = _envelope_row
envelope_from_row = _envelope


def encode_envelopes(envelopes: list[Envelope]) -> bytes:
    return bytes(msgpack.packb([_envelope_row(e) for e in envelopes], use_bin_type=True))


def decode_envelopes(data: bytes) -> list[Envelope]:
    return [_envelope(row) for row in msgpack.unpackb(data, raw=False)]


def encode_timers(entries: list[DelayedEntry]) -> bytes:
    rows = [
        [e.deadline_ms, e.sender[0], e.sender[1], e.token, _envelope_row(e.envelope)]
        for e in entries
    ]
    return bytes(msgpack.packb(rows, use_bin_type=True))


def decode_timers(data: bytes) -> list[tuple[int, tuple[str, str], str, Envelope]]:
    """(deadline ms, sender address key, token, envelope) of every pending delayed message."""
    return [
        (deadline, (s_type, s_id), token, _envelope(row))
        for deadline, s_type, s_id, token, row in msgpack.unpackb(data, raw=False)
    ]
