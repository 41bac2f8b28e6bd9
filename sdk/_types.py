"""Value types: how a value becomes a typed value (a typename plus bytes) and back.

The built-in types use StateFun's encodings for ``io.statefun.types/*``: a protobuf message
with a single field number 1 (see ``_proto/types.proto``). Their common values are encoded and
decoded here by hand, which is several times faster than building a protobuf message, and
anything unusual falls back to the generated protobuf code, so the bytes are always the same
as StateFun's.
"""

from __future__ import annotations

import abc
import json
import struct
from collections.abc import Callable
from typing import Any

from statefun._exceptions import InvalidTypeNameError
from statefun.sdk._proto import types_pb2

__all__ = [
    "BoolType",
    "DoubleType",
    "FloatType",
    "IntType",
    "LongType",
    "StringType",
    "Type",
    "TypeSerializer",
    "TypedValue",
    "make_json_type",
    "make_protobuf_type",
    "simple_type",
]


class TypedValue:
    """A value as it travels: ``typename``, ``has_value`` and the encoded ``value`` bytes.

    Duck-compatible with the protobuf ``io.statefun.sdk.reqreply.TypedValue`` message, which
    is what StateFun's SDK exposes as ``Message.typed_value``.
    """

    __slots__ = ("has_value", "typename", "value")

    def __init__(self, typename: str, value: bytes | None) -> None:
        self.typename = typename
        self.has_value = value is not None
        self.value = b"" if value is None else value

    def __repr__(self) -> str:
        shown = self.value if self.has_value else None
        return f"TypedValue({self.typename!r}, {shown!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TypedValue):
            return NotImplemented
        return (self.typename, self.has_value, self.value) == (
            other.typename,
            other.has_value,
            other.value,
        )

    def __hash__(self) -> int:
        return hash((self.typename, self.has_value, self.value))


class TypeSerializer(abc.ABC):
    """Turns values of one type into bytes and back."""

    __slots__ = ()

    @abc.abstractmethod
    def serialize(self, value: Any) -> bytes:
        """Return the bytes that represent ``value``."""

    @abc.abstractmethod
    def deserialize(self, data: bytes) -> Any:
        """Return the value that ``data`` represents."""


def validate_typename(typename: object, what: str = "typename") -> tuple[str, str]:
    """Split ``namespace/name`` into its two parts, or raise InvalidTypeNameError."""
    parts = _VALID_TYPENAMES.get(typename) if type(typename) is str else None
    if parts is not None:
        return parts
    if not isinstance(typename, str) or not typename:
        raise InvalidTypeNameError(
            f"{what} must be a non-empty string 'namespace/name', got {typename!r}"
        )
    namespace, sep, name = typename.rpartition("/")
    if not sep:
        raise InvalidTypeNameError(f"{what} {typename!r} must be of the form 'namespace/name'")
    if not namespace:
        raise InvalidTypeNameError(f"{what} {typename!r} has an empty namespace")
    if not name:
        raise InvalidTypeNameError(f"{what} {typename!r} has an empty name")
    if len(_VALID_TYPENAMES) < _VALID_TYPENAMES_MAX:  # bounded: typenames are few
        _VALID_TYPENAMES[typename] = (namespace, name)
    return namespace, name


#: Typenames already found valid, with their parts (a program uses a few; bounded anyway).
_VALID_TYPENAMES: dict[str, tuple[str, str]] = {}
_VALID_TYPENAMES_MAX = 4096


class Type(abc.ABC):
    """A named value type. Subclasses supply ``serializer()``."""

    __slots__ = ("typename",)

    def __init__(self, typename: str) -> None:
        if not typename:
            raise InvalidTypeNameError("typename can not be missing")
        validate_typename(typename)
        self.typename = typename

    @abc.abstractmethod
    def serializer(self) -> TypeSerializer:
        """Return the serializer of this type."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.typename!r})"


class _FunctionSerializer(TypeSerializer):
    __slots__ = ("_deserialize", "_serialize")

    def __init__(
        self, serialize_fn: Callable[[Any], bytes], deserialize_fn: Callable[[bytes], Any]
    ) -> None:
        self._serialize = serialize_fn
        self._deserialize = deserialize_fn

    def serialize(self, value: Any) -> bytes:
        return self._serialize(value)

    def deserialize(self, data: bytes) -> Any:
        return self._deserialize(data)


class SimpleType(Type):
    """A type defined by two functions; see ``simple_type``."""

    __slots__ = ("_serializer",)

    def __init__(
        self,
        typename: str,
        serialize_fn: Callable[[Any], bytes] | None,
        deserialize_fn: Callable[[bytes], Any] | None,
    ) -> None:
        super().__init__(typename)
        if serialize_fn is None or not callable(serialize_fn):
            raise ValueError(f"type {typename!r}: serialize_fn is missing or not callable")
        if deserialize_fn is None or not callable(deserialize_fn):
            raise ValueError(f"type {typename!r}: deserialize_fn is missing or not callable")
        self._serializer = _FunctionSerializer(serialize_fn, deserialize_fn)

    def serializer(self) -> TypeSerializer:
        return self._serializer


def simple_type(
    typename: str | None = None,
    serialize_fn: Callable[[Any], bytes] | None = None,
    deserialize_fn: Callable[[bytes], Any] | None = None,
) -> Type:
    """Make a Type named ``typename`` from a serialize and a deserialize function."""
    if typename is None:
        raise InvalidTypeNameError("typename can not be missing")
    return SimpleType(typename, serialize_fn, deserialize_fn)


def _serialize_json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def make_json_type(typename: str) -> Type:
    """A type whose values are encoded as UTF-8 JSON text (as StateFun's ``make_json_type``)."""
    return simple_type(typename, _serialize_json, json.loads)


def make_protobuf_type(cls: Any, namespace: str | None = None) -> Type:
    """A type for a protobuf message class, named ``<namespace>/<full message name>``.

    The namespace defaults to ``type.googleapis.com``, as in StateFun.
    """
    if cls is None:
        raise ValueError("the protobuf message class is missing")
    full_name = getattr(getattr(cls, "DESCRIPTOR", None), "full_name", None)
    if not full_name:
        raise TypeError(f"{cls!r} is not a protobuf message class (no DESCRIPTOR.full_name)")

    def deserialize(data: bytes) -> Any:
        message = cls()
        message.ParseFromString(data)
        return message

    def serialize(message: Any) -> bytes:
        return bytes(message.SerializeToString())

    return simple_type(f"{namespace or 'type.googleapis.com'}/{full_name}", serialize, deserialize)


# ------------------------------------------------------------------------------------------
# Built-in types: io.statefun.types/*
# ------------------------------------------------------------------------------------------

#: an IntWrapper's bytes in one go: field 1, fixed 32 bits (tag 0x0d), then the value
_pack_tagged_i32 = struct.Struct("<Bi").pack
_unpack_i32 = struct.Struct("<i").unpack_from
_pack_tagged_i64 = struct.Struct("<Bq").pack  # a LongWrapper's: field 1, fixed 64 bits
_unpack_i64 = struct.Struct("<q").unpack_from


#: a fixed-width integer wrapper's common case: tag, size, highest value, pack, unpack_from
_FixedWidth = tuple[int, int, int, Callable[[int, int], bytes], Callable[..., Any]]


class _WrapperSerializer(TypeSerializer):
    """Hand-written fast path with the generated wrapper message as the reference.

    A wrapper of a fixed-width integer (IntWrapper, LongWrapper) also describes its common
    case, which the hot paths (storage properties, ``Message.as_int``, the builders) encode
    and decode inline, without a call: a positive int up to ``fixed_high`` is the byte
    ``fixed_tag`` then the value, little-endian, ``fixed_size`` bytes in all. For the other
    wrappers ``fixed_size`` is -1 and ``fixed_high`` 0: nothing matches.
    """

    __slots__ = (
        "_decode",
        "_encode",
        "_wrapper",
        "fixed_high",
        "fixed_pack",
        "fixed_size",
        "fixed_tag",
        "fixed_unpack",
    )

    def __init__(
        self,
        wrapper: Any,
        encode: Callable[[Any], bytes | None],
        decode: Callable[[bytes], Any],
        fixed: _FixedWidth | None = None,
    ) -> None:
        self._wrapper = wrapper
        self._encode = encode
        self._decode = decode
        #: (tag, size, high, pack, unpack) of a fixed-width integer's common case
        tag, size, high, pack, unpack = fixed or (-1, -1, 0, _pack_tagged_i32, _unpack_i32)
        self.fixed_tag = tag
        self.fixed_size = size
        self.fixed_high = high
        self.fixed_pack = pack
        self.fixed_unpack = unpack

    def serialize(self, value: Any) -> bytes:
        if type(value) is int and 0 < value <= self.fixed_high:
            return self.fixed_pack(self.fixed_tag, value)
        data = self._encode(value)
        if data is None:  # a value the fast path leaves to protobuf
            message = self._wrapper()
            message.value = value
            data = message.SerializeToString()
        return data

    def deserialize(self, data: bytes) -> Any:
        if len(data) == self.fixed_size and data[0] == self.fixed_tag:
            return self.fixed_unpack(data, 1)[0]
        value = self._decode(data)
        if value is _SLOW:
            value = self._wrapper.FromString(data).value
        return value


_SLOW: Any = object()


def _check_int(value: Any, bits: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int for a {bits}-bit integer, got {type(value).__name__}")
    return value


def _encode_int(value: Any) -> bytes | None:
    if type(value) is int and 0 < value <= 0x7FFFFFFF:  # the common case, checks inlined
        return _pack_tagged_i32(0x0D, value)
    _check_int(value, 32)
    if value == 0:
        return b""
    if not -0x80000000 <= value <= 0x7FFFFFFF:
        raise ValueError(f"{value} does not fit a 32-bit signed integer (io.statefun.types/int)")
    return _pack_tagged_i32(0x0D, value)


def _decode_int(data: bytes) -> Any:
    if len(data) == 5 and data[0] == 0x0D:
        return _unpack_i32(data, 1)[0]
    return 0 if not data else _SLOW


def _encode_long(value: Any) -> bytes | None:
    _check_int(value, 64)
    if value == 0:
        return b""
    if not -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        raise ValueError(f"{value} does not fit a 64-bit signed integer (io.statefun.types/long)")
    return _pack_tagged_i64(0x09, value)


def _decode_long(data: bytes) -> Any:
    if len(data) == 9 and data[0] == 0x09:
        return _unpack_i64(data, 1)[0]
    return 0 if not data else _SLOW


def _encode_bool(value: Any) -> bytes | None:
    if value is True:
        return b"\x08\x01"
    if value is False:
        return b""
    if isinstance(value, int):  # as StateFun's SDK (protobuf): any int, non-zero is True
        return None
    raise TypeError(f"expected a bool for io.statefun.types/bool, got {type(value).__name__}")


def _decode_bool(data: bytes) -> Any:
    if data == b"\x08\x01":
        return True
    return False if not data else _SLOW


def _encode_string(value: Any) -> bytes | None:
    if not isinstance(value, str):
        if isinstance(value, bytes):  # as StateFun's SDK (protobuf): UTF-8 bytes are accepted
            return None
        raise TypeError(f"expected a str for io.statefun.types/string, got {type(value).__name__}")
    if not value:
        return b""
    raw = value.encode("utf-8")
    n = len(raw)
    if n < 0x80:
        return b"\x0a" + bytes((n,)) + raw
    return None


def _decode_string(data: bytes) -> Any:
    if not data:
        return ""
    if data[0] == 0x0A and len(data) > 1 and data[1] == len(data) - 2 and data[1] < 0x80:
        try:
            return data[2:].decode("utf-8")
        except UnicodeDecodeError:
            pass  # protobuf raises its DecodeError
    return _SLOW


def _encode_float(value: Any) -> bytes | None:
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"expected a float, got {type(value).__name__}")
    # floats are rare on hot paths; protobuf handles -0.0, NaN, rounding, and accepts what
    # StateFun's SDK accepts (bool, int, anything with __float__), raising TypeError otherwise
    return None


def _decode_via_protobuf(data: bytes) -> Any:
    return _SLOW


class _WrapperType(Type):
    __slots__ = ("_serializer",)

    def __init__(self, typename: str, serializer: _WrapperSerializer) -> None:
        super().__init__(typename)
        self._serializer = serializer

    def serializer(self) -> TypeSerializer:
        return self._serializer


BoolType: Type = _WrapperType(
    "io.statefun.types/bool",
    _WrapperSerializer(types_pb2.BooleanWrapper, _encode_bool, _decode_bool),
)
IntType: Type = _WrapperType(
    "io.statefun.types/int",
    _WrapperSerializer(
        types_pb2.IntWrapper,
        _encode_int,
        _decode_int,
        (0x0D, 5, 0x7FFFFFFF, _pack_tagged_i32, _unpack_i32),
    ),
)
LongType: Type = _WrapperType(
    "io.statefun.types/long",
    _WrapperSerializer(
        types_pb2.LongWrapper,
        _encode_long,
        _decode_long,
        (0x09, 9, 0x7FFFFFFFFFFFFFFF, _pack_tagged_i64, _unpack_i64),
    ),
)
FloatType: Type = _WrapperType(
    "io.statefun.types/float",
    _WrapperSerializer(types_pb2.FloatWrapper, _encode_float, _decode_via_protobuf),
)
DoubleType: Type = _WrapperType(
    "io.statefun.types/double",
    _WrapperSerializer(types_pb2.DoubleWrapper, _encode_float, _decode_via_protobuf),
)
StringType: Type = _WrapperType(
    "io.statefun.types/string",
    _WrapperSerializer(types_pb2.StringWrapper, _encode_string, _decode_string),
)

#: The built-in types by typename.
BUILTIN_TYPES: dict[str, Type] = {
    t.typename: t for t in (BoolType, IntType, LongType, FloatType, DoubleType, StringType)
}

#: Built-in types whose Python values are immutable, so a decoded value may be cached.
IMMUTABLE_TYPES: frozenset[Type] = frozenset(
    {BoolType, IntType, LongType, FloatType, DoubleType, StringType}
)


def to_typed_value(tpe: Type, value: Any) -> TypedValue:
    """Encode ``value`` as a TypedValue of type ``tpe`` (None becomes 'no value')."""
    if value is None:
        return TypedValue(tpe.typename, None)
    return TypedValue(tpe.typename, tpe.serializer().serialize(value))
