"""Address-scoped storage: the object behind ``context.storage``.

For every registered function a storage class is generated once, with one property per
ValueSpec, so ``context.storage.count`` is a plain attribute access. A batch starts from the
typed values the runtime sent; reads decode lazily (immutable built-in values are decoded once
per batch), writes encode at once (a bad value fails where it is assigned), and only the names
that were written or deleted are reported back as mutations.

Copy on write: a storage never changes the dict of values it was given (the runtime passes the
state's own dict). Its first write copies it; the copy, ``_values`` from then on, holds the
writes, and ``_dirty`` (a tuple, ``UNWRITTEN`` until then) the names written; a delete leaves
None in the values and makes ``_dirty`` a ``Deleting``, so that a caller applying the values
looks for deleted names only then. The SDK's request handler, whose dict is the batch's own,
makes its storage ``own``: written in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statefun._exceptions import InvalidSpecError, StateTypeMismatchError, ValueDecodeError
from statefun.sdk._spec import ValueSpec
from statefun.sdk._types import (
    _SLOW,
    IMMUTABLE_TYPES,
    BoolType,
    IntType,
    LongType,
    StringType,
    Type,
    TypedValue,
    _WrapperSerializer,
)

__all__ = [
    "UNWRITTEN",
    "AddressStorage",
    "Deleting",
    "make_storage_class",
    "storage_mutations",
    "unknown_state_hint",
]

_MISSING: Any = object()
#: the fixed-width fields of a serializer that is no fixed-width integer's: nothing matches
_NOT_FIXED = _WrapperSerializer(None, lambda value: None, lambda data: _SLOW)
_new_object = object.__new__


class _Unwritten(tuple):  # type: ignore[type-arg]
    """The type of ``UNWRITTEN``: an empty tuple that is not ``()``."""

    __slots__ = ()


#: the ``_dirty`` of a storage that has written nothing: its ``_values`` are still the dict it
#: was given, which it never changes (its first write copies them). A storage made ``own``
#: starts with ``()`` instead: its values are its own, written in place
UNWRITTEN: tuple[str, ...] = _Unwritten()


class Deleting(tuple):  # type: ignore[type-arg]
    """The type of a storage's ``_dirty`` once it deleted a state (its values hold None for
    it): a caller that applies the values looks for deleted names only then."""

    __slots__ = ()


# A written value may be cached (read back without decoding) only when decoding its bytes
# gives that very value: not for floats (float32 rounding, an int written reads as a float),
# nor int/str subclasses, nor the ints and bytes that BoolType and StringType accept.
_READS_BACK_AS_WRITTEN: dict[Type, type] = {
    IntType: int,
    LongType: int,
    BoolType: bool,
    StringType: str,
}


class AddressStorage:
    """Base of the generated storage classes. Its state is private to the SDK and runtime.

    No ``__getattr__``: with one, every attribute of an instance is looked up through it, on
    the path of every state read and write (and CPython 3.11 does not specialize the
    lookups). A name no ValueSpec declares raises Python's own AttributeError, which names
    the generated class (``Storage[<function typename>]``) and the name;
    ``unknown_state_hint`` adds the registered names where a failure is reported.
    """

    __slots__ = ("_cache", "_dirty", "_typename", "_values")

    #: The ValueSpecs of the function, by name (set on each generated subclass).
    _specs: Mapping[str, ValueSpec] = {}

    def __init__(self, typename: str, values: dict[str, Any], own: bool = False) -> None:
        # values: state name -> typed value (anything with typename/has_value/value) or None;
        # never changed here: the first write copies them (see ``UNWRITTEN``), unless ``own``
        # (the caller's own dict, given away: written in place)
        # (the runtime's slice loop, statefun/runtime/_batch.py, sets these four itself)
        self._typename = typename
        self._values = values
        self._cache: dict[str, Any] = {}
        #: the names written or deleted, in order; ``UNWRITTEN`` until the first
        self._dirty: tuple[str, ...] = () if own else UNWRITTEN

    def __repr__(self) -> str:
        return f"<storage of {self._typename} {sorted(self._specs)}>"


def _make_property(spec: ValueSpec) -> property:
    name = spec.name
    typename = spec.type.typename
    serializer = spec.type.serializer()
    serialize = serializer.serialize
    deserialize = serializer.deserialize
    # A built-in wrapper type's own encoder and decoder, without the serializer's call in
    # between: None (encode) and _SLOW (decode) leave a value to the serializer.
    wrapped = type(serializer) is _WrapperSerializer
    encode = serializer._encode if wrapped else serialize  # type: ignore[attr-defined]
    decode = serializer._decode if wrapped else deserialize  # type: ignore[attr-defined]
    # A fixed-width integer's common case, inline (see _WrapperSerializer): nothing else
    # matches (size -1, high 0)
    fixed: Any = serializer if wrapped else _NOT_FIXED
    tag, size, high = fixed.fixed_tag, fixed.fixed_size, fixed.fixed_high
    pack, unpack = fixed.fixed_pack, fixed.fixed_unpack
    cacheable = spec.type in IMMUTABLE_TYPES
    reads_back_as = _READS_BACK_AS_WRITTEN.get(spec.type)
    written = (name,)  # the ``_dirty`` of a storage whose first write is this state's
    deleted = Deleting(written)  # (and whose first write deletes it)

    def fget(self: AddressStorage) -> Any:
        cache = self._cache
        if cache:  # (empty on an invocation's first read)
            value = cache.get(name, _MISSING)
            if value is not _MISSING:
                return value
        typed = self._values.get(name)
        if typed is None or not typed.has_value:
            value = None
        elif typed.typename != typename:
            raise StateTypeMismatchError(
                f"state {name!r} of {self._typename!r} holds a value of type "
                f"{typed.typename!r}, but its ValueSpec declares {typename!r}"
            )
        else:
            data = typed.value
            if len(data) == size and data[0] == tag:
                # a fixed-width integer: decoded at once, as cheaply as a cache's lookup, so
                # not cached (an invocation that reads and writes one makes no cache entry)
                return unpack(data, 1)[0]
            try:
                value = decode(data)
                if value is _SLOW:
                    value = deserialize(data)
            except Exception as exc:
                raise ValueDecodeError(
                    f"state {name!r} of {self._typename!r} holds {len(data)} bytes that "
                    f"are not a valid {typename}: {type(exc).__name__}: "
                    f"{' '.join(str(exc).split())}"
                ) from exc
        if cacheable or value is None:
            cache[name] = value
        return value

    def fset(self: AddressStorage, value: Any) -> None:
        typed = _new_object(TypedValue)  # TypedValue(typename, data) without its __init__
        typed.typename = typename
        typed.has_value = True
        if type(value) is int and 0 < value <= high:  # (then reads_back_as is int)
            typed.value = pack(tag, value)
            cache = self._cache
            if cache:  # (read back from its bytes: see fget)
                cache.pop(name, None)
        else:
            if value is None:
                raise ValueError(
                    f"state {name!r}: cannot store None; use `del context.storage.{name}`"
                )
            data = encode(value)
            if data is None and wrapped:
                data = serialize(value)
            if data is None:  # (a serializer of the user's that gives no bytes)
                typed = TypedValue(typename, None)
            else:
                typed.value = data
            if type(value) is reads_back_as:
                self._cache[name] = value
            else:
                self._cache.pop(name, None)
        dirty = self._dirty
        if dirty is UNWRITTEN:  # the first write: the values given stay as they are
            values = self._values = self._values.copy()
            values[name] = typed
            self._dirty = written  # (name,), made once
        else:
            self._values[name] = typed
            if name not in dirty:
                self._dirty = (
                    (*dirty, name) if type(dirty) is not Deleting else Deleting((*dirty, name))
                )

    def fdel(self: AddressStorage) -> None:
        self._cache[name] = None
        dirty = self._dirty
        if dirty is UNWRITTEN:
            values = self._values = self._values.copy()
            values[name] = None
            self._dirty = deleted
        else:
            self._values[name] = None
            if type(dirty) is not Deleting or name not in dirty:
                self._dirty = Deleting(dirty if name in dirty else (*dirty, name))

    return property(fget, fset, fdel, doc=f"state {name!r} ({typename})")


def make_storage_class(typename: str, specs: list[ValueSpec]) -> type[AddressStorage]:
    """Generate the storage class of one function from its ValueSpecs."""
    namespace: dict[str, Any] = {"__slots__": (), "_specs": {s.name: s for s in specs}}
    for spec in specs:
        if hasattr(AddressStorage, spec.name):
            raise InvalidSpecError(
                f"function {typename!r}: state name {spec.name!r} is reserved by the storage object"
            )
        if spec.name in namespace:
            raise InvalidSpecError(f"function {typename!r}: state {spec.name!r} is declared twice")
        namespace[spec.name] = _make_property(spec)
    return type(f"Storage[{typename}]", (AddressStorage,), namespace)


def storage_mutations(storage: AddressStorage) -> list[tuple[str, TypedValue | None]]:
    """(name, new typed value, or None if deleted) of every state written in the batch.

    In the order of the function's ValueSpecs, as StateFun's SDK sends them.
    """
    dirty = storage._dirty
    values = storage._values
    if len(dirty) > 1:  # in the order of the ValueSpecs, as StateFun's SDK sends them
        return [(name, values[name]) for name in storage._specs if name in dirty]
    return [(name, values[name]) for name in dirty]


def unknown_state_hint(exc: BaseException) -> str:
    """For the AttributeError of reading a name no ValueSpec declares from a storage: which
    names the function registered (for the failure's message); otherwise ``""``."""
    if type(exc) is not AttributeError:
        return ""
    storage = getattr(exc, "obj", None)
    if not isinstance(storage, AddressStorage) or exc.name in storage._specs:
        return ""
    registered = sorted(storage._specs) or "none"
    return f" ({exc.name!r} is not a registered ValueSpec; registered: {registered})"
