"""How state values are stored: msgpack, shared by the snapshot files and the RocksDB backend.

The values of one address (``state name -> typed value``) become a msgpack map::

    {name: [typename, value]}                 # a typed value; value is nil if has_value=False
    {name: [typename, value, deadline_ms]}    # an ExpiringValue (TTL), deadline kept exactly

Decoding gives back ``statefun.sdk.TypedValue`` objects, and the runtime's ``ExpiringValue``
(the very class the dispatcher checks with ``type(v) is ExpiringValue``) for values with a
deadline. Keys of the RocksDB backend (``encode_key``) start with the key group as two
big-endian bytes, so the addresses of one key group are one prefix scan, in key-group order.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import msgpack

from statefun.sdk._types import TypedValue
from statefun.state._expiring import ExpiringValue
from statefun.state.base import AddressKey

__all__ = [
    "MAX_KEY_GROUPS",
    "decode_key",
    "decode_values",
    "encode_key",
    "encode_values",
    "key_group_prefix",
    "pack_entries",
    "values_from_wire",
    "values_to_wire",
]

#: key groups are stored in two bytes (Flink's and our max_parallelism is at most 32768)
MAX_KEY_GROUPS = 1 << 16

_HEAD = struct.Struct(">HH")  # key group, length of the typename in bytes
_GROUP = struct.Struct(">H")


def values_to_wire(values: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``values`` as plain msgpack-able data (see the module docstring)."""
    wire: dict[str, list[Any]] = {}
    for name, typed in values.items():
        deadline = None if type(typed) is TypedValue else getattr(typed, "deadline_ms", None)
        value = typed.value if typed.has_value else None
        if deadline is None:
            wire[name] = [typed.typename, value]
        else:
            wire[name] = [typed.typename, value, int(deadline)]
    return wire


def pack_entries(entries: Iterator[tuple[AddressKey, Mapping[str, Any]]], count: int) -> bytes:
    """The next ``count`` entries as ``[[typename, id, values_to_wire(values)], ...]``.

    The same bytes as packing the nested lists, streamed instead of built: several times
    faster, and no garbage for the cyclic GC to walk while a large snapshot is written.
    ``entries`` must hold at least ``count`` more items.
    """
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    pack = packer.pack
    array = packer.pack_array_header
    array(count)
    for (typename, id_), values in itertools.islice(entries, count):
        array(3)
        pack(typename)
        pack(id_)
        packer.pack_map_header(len(values))
        for name, typed in values.items():
            deadline = None if type(typed) is TypedValue else getattr(typed, "deadline_ms", None)
            pack(name)
            array(2 if deadline is None else 3)
            pack(typed.typename)
            pack(typed.value if typed.has_value else None)
            if deadline is not None:
                pack(int(deadline))
    return bytes(packer.bytes())


def values_from_wire(wire: Mapping[str, Any]) -> dict[str, Any]:
    """The values dict that ``values_to_wire`` was given (fresh objects)."""
    values: dict[str, Any] = {}
    for name, item in wire.items():
        typed = TypedValue(item[0], item[1])
        if len(item) > 2:
            values[name] = ExpiringValue(typed, item[2])
        else:
            values[name] = typed
    return values


def encode_values(values: Mapping[str, Any]) -> bytes:
    return bytes(msgpack.packb(values_to_wire(values), use_bin_type=True))


def decode_values(data: bytes) -> dict[str, Any]:
    return values_from_wire(msgpack.unpackb(data, raw=False))


def key_group_prefix(key_group: int) -> bytes:
    return _GROUP.pack(key_group)


def encode_key(key_group: int, key: AddressKey) -> bytes:
    """``key group (2 bytes) | typename length (2 bytes) | typename | id``, UTF-8."""
    typename = key[0].encode("utf-8")
    return _HEAD.pack(key_group, len(typename)) + typename + key[1].encode("utf-8")


def decode_key(data: bytes) -> tuple[int, AddressKey]:
    key_group, length = _HEAD.unpack_from(data)
    end = _HEAD.size + length
    return key_group, (data[_HEAD.size : end].decode("utf-8"), data[end:].decode("utf-8"))
