"""Addresses and state specifications, validated when they are made."""

from __future__ import annotations

import keyword
from datetime import timedelta
from typing import NamedTuple

from statefun._exceptions import InvalidSpecError
from statefun.sdk._types import Type

__all__ = ["SdkAddress", "ValueSpec", "address_of"]

_ONE_MS = timedelta(milliseconds=1)


class SdkAddress(NamedTuple):
    """The address of a function instance: ``namespace/name`` plus an ``id``.

    Immutable, hashable and compared by value, like StateFun's frozen dataclass; a named
    tuple because an address is made for every request and a tuple is the cheapest to make.
    """

    namespace: str
    name: str
    id: str
    typename: str


#: (typename, id) -> its SdkAddress: the addresses made lately (bounded: cleared when full)
_ADDRESSES: dict[tuple[str, str], SdkAddress] = {}
_MAX_ADDRESSES = 65_536


def address_of(key: tuple[str, str]) -> SdkAddress:
    """The SdkAddress of ``key``, a function typename (``namespace/name``) and an id."""
    address = _ADDRESSES.get(key)
    if address is None:
        if len(_ADDRESSES) >= _MAX_ADDRESSES:
            _ADDRESSES.clear()
        typename, id_ = key
        namespace, _, name = typename.rpartition("/")
        address = _ADDRESSES[key] = SdkAddress(namespace, name, id_, typename)
    return address


class ValueSpec:
    """One named, typed state value of a function, with an optional expiration (TTL).

    ``name`` is a lower-case Python identifier (it becomes an attribute of
    ``context.storage``). ``expire_after_call`` expires the value when the function was not
    called for that long; ``expire_after_write``, when the value was not written for that long.
    """

    __slots__ = ("after_call", "after_write", "duration", "name", "type")

    def __init__(
        self,
        name: str,
        type: Type,
        expire_after_call: timedelta | None = None,
        expire_after_write: timedelta | None = None,
    ) -> None:
        if not name:
            raise InvalidSpecError("a ValueSpec needs a name")
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidSpecError(
                f"invalid state name {name!r}: use letters, digits and underscores, "
                "not starting with a digit"
            )
        if keyword.iskeyword(name):
            raise InvalidSpecError(
                f"invalid state name {name!r}: a Python keyword cannot be an attribute of "
                "context.storage"
            )
        if not name.islower():
            raise InvalidSpecError(
                f"invalid state name {name!r}: only lower case names are allowed"
            )
        if type is None:
            raise InvalidSpecError(f"state {name!r}: the type is missing")
        if not isinstance(type, Type):
            raise InvalidSpecError(f"state {name!r}: {type!r} is not a statefun Type")
        if expire_after_call and expire_after_write:
            raise InvalidSpecError(
                f"state {name!r}: set expire_after_call or expire_after_write, not both"
            )
        ttl = expire_after_call or expire_after_write
        if ttl is not None and not isinstance(ttl, timedelta):
            raise InvalidSpecError(f"state {name!r}: an expiration must be a datetime.timedelta")
        self.name = name
        self.type = type
        # whole milliseconds, exactly (total_seconds() * 1000 makes 1.001 s 1000 ms)
        self.duration = ttl // _ONE_MS if ttl else 0
        if ttl is not None and self.duration <= 0:
            raise InvalidSpecError(f"state {name!r}: an expiration must be at least 1 ms")
        self.after_call = bool(expire_after_call)
        self.after_write = bool(expire_after_write)

    def __repr__(self) -> str:
        ttl = ""
        if self.after_call:
            ttl = f", expire_after_call={self.duration}ms"
        elif self.after_write:
            ttl = f", expire_after_write={self.duration}ms"
        return f"ValueSpec({self.name!r}, {self.type.typename!r}{ttl})"
