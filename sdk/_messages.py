"""Messages to functions and to egresses, and the builders that make them."""

from __future__ import annotations

import struct
from typing import Any

from statefun._exceptions import InvalidValueError
from statefun.sdk._proto import egress_pb2
from statefun.sdk._types import (
    _SLOW,
    _VALID_TYPENAMES,
    BoolType,
    DoubleType,
    FloatType,
    IntType,
    LongType,
    StringType,
    Type,
    TypedValue,
    _decode_int,
    _WrapperSerializer,
    _WrapperType,
    validate_typename,
)
from statefun.sdk._varint import ONE_BYTE as _ONE_BYTE
from statefun.sdk._varint import bytes_field

_INT_TYPENAME = IntType.typename
_INT: _WrapperSerializer = IntType.serializer()  # type: ignore[assignment]
_INT_SIZE, _INT_TAG, _INT_UNPACK = _INT.fixed_size, _INT.fixed_tag, _INT.fixed_unpack

__all__ = [
    "EgressMessage",
    "Message",
    "egress_message_builder",
    "kafka_egress_message",
    "kinesis_egress_message",
    "message_builder",
]

KAFKA_PRODUCER_RECORD_TYPENAME = "type.googleapis.com/io.statefun.sdk.egress.KafkaProducerRecord"
KINESIS_EGRESS_RECORD_TYPENAME = "type.googleapis.com/io.statefun.sdk.egress.KinesisEgressRecord"


class Message:
    """A message to (or received by) a function: a target and a typed value."""

    __slots__ = ("target_id", "target_typename", "typed_value")

    def __init__(self, target_typename: str, target_id: str, typed_value: Any) -> None:
        if not target_typename:
            raise ValueError("target_typename can not be missing")
        if not target_id:
            raise ValueError("target_id can not be missing")
        if typed_value is None:
            raise ValueError("typed_value can not be missing")
        self.target_typename = target_typename
        self.target_id = target_id
        self.typed_value = typed_value

    def __repr__(self) -> str:
        return f"Message({self.target_typename!r}, {self.target_id!r}, {self.typed_value!r})"

    def is_type(self, tpe: Type) -> bool:
        return bool(self.typed_value.typename == tpe.typename)

    def as_type(self, tpe: Type) -> Any:
        tv = self.typed_value
        if not tv.has_value:
            return None
        try:
            return tpe.serializer().deserialize(tv.value)
        except Exception as exc:
            if tv.typename != tpe.typename:
                raise  # read as another type than its own: the function's error
            raise InvalidValueError(
                f"the value of a message to {self.target_typename}/{self.target_id} is not a "
                f"valid {tpe.typename}: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            ) from exc

    def value_typename(self) -> str:
        return str(self.typed_value.typename)

    def raw_value(self) -> bytes | None:
        tv = self.typed_value
        return bytes(tv.value) if tv.has_value else None

    def is_int(self) -> bool:
        return bool(self.typed_value.typename == "io.statefun.types/int")

    def as_int(self) -> int | None:
        tv = self.typed_value
        if tv.typename == _INT_TYPENAME:  # the common case: the value's own type, decoded here
            if not tv.has_value:
                return None
            data = tv.value
            if len(data) == _INT_SIZE and data[0] == _INT_TAG:  # (inline: _WrapperSerializer)
                return _INT_UNPACK(data, 1)[0]  # type: ignore[no-any-return]
            value = _decode_int(data)
            if value is not _SLOW:
                return value  # type: ignore[no-any-return]
        return self.as_type(IntType)  # type: ignore[no-any-return]

    def is_bool(self) -> bool:
        return bool(self.typed_value.typename == "io.statefun.types/bool")

    def as_bool(self) -> bool | None:
        return self.as_type(BoolType)  # type: ignore[no-any-return]

    def is_long(self) -> bool:
        return bool(self.typed_value.typename == "io.statefun.types/long")

    def as_long(self) -> int | None:
        return self.as_type(LongType)  # type: ignore[no-any-return]

    def is_string(self) -> bool:
        return bool(self.typed_value.typename == "io.statefun.types/string")

    def as_string(self) -> str | None:
        return self.as_type(StringType)  # type: ignore[no-any-return]

    def is_float(self) -> bool:
        return bool(self.typed_value.typename == "io.statefun.types/float")

    def as_float(self) -> float | None:
        return self.as_type(FloatType)  # type: ignore[no-any-return]

    def is_double(self) -> bool:
        return bool(self.typed_value.typename == "io.statefun.types/double")

    def as_double(self) -> float | None:
        return self.as_type(DoubleType)  # type: ignore[no-any-return]


class EgressMessage:
    """A record for an egress, identified by the egress typename."""

    __slots__ = ("typed_value", "typename")

    def __init__(self, typename: str, typed_value: Any) -> None:
        if not typename:
            raise ValueError("typename is missing")
        if typed_value is None:
            raise ValueError("value is missing")
        self.typename = typename
        self.typed_value = typed_value

    def __repr__(self) -> str:
        return f"EgressMessage({self.typename!r}, {self.typed_value!r})"

    def value_typename(self) -> str:
        return str(self.typed_value.typename)

    def raw_value(self) -> bytes | None:
        tv = self.typed_value
        return bytes(tv.value) if tv.has_value else None


_PRIMITIVES: dict[str, Type] = {
    "int_value": IntType,
    "float_value": FloatType,
    "long_value": LongType,
    "str_value": StringType,
    "double_value": DoubleType,
    "bool_value": BoolType,
}
_KEYWORDS = (
    "int_value=, long_value=, float_value=, double_value=, str_value=, bool_value=, "
    "or value= with value_type="
)


def message_builder(target_typename: str, target_id: str, **kwargs: Any) -> Message:
    """Build a message to the function ``target_typename`` with id ``target_id``.

    Give the value as exactly one of ``int_value``, ``long_value``, ``float_value``,
    ``double_value``, ``str_value``, ``bool_value``, or as ``value=`` with ``value_type=``.
    """
    if len(kwargs) == 1:
        ((keyword, value),) = kwargs.items()
        value_type = _PRIMITIVES.get(keyword)
        if value_type is None:
            if keyword == "value":
                raise ValueError(
                    "could not deduce the value type: pass value=<the value>, value_type=<a Type>"
                )
            raise ValueError(f"unknown value keyword {keyword}=; use one of {_KEYWORDS}")
    elif len(kwargs) == 2 and "value" in kwargs and "value_type" in kwargs:
        value, value_type = kwargs["value"], kwargs["value_type"]
        if not isinstance(value_type, Type):
            raise ValueError(f"value_type must be a statefun Type, got {value_type!r}")
    else:
        raise TypeError(f"wrong value keywords {sorted(kwargs)}; use exactly one of {_KEYWORDS}")
    if value is None:
        raise ValueError("value can not be missing")
    typed = TypedValue(value_type.typename, value_type.serializer().serialize(value))
    return Message(target_typename, target_id, typed)


def egress_message_builder(target_typename: str, value: Any, value_type: Type) -> EgressMessage:
    """Build a record for the egress ``target_typename`` from a value of ``value_type``."""
    if type(target_typename) is not str or target_typename not in _VALID_TYPENAMES:
        if not target_typename:
            raise ValueError("target typename is missing")
        validate_typename(target_typename, "egress typename")
    if value is None:
        raise ValueError("value can not be missing")
    data: bytes | None
    if type(value_type) is _WrapperType:  # a built-in type: its encoder without the wrapper
        serializer = value_type._serializer
        if type(value) is int and 0 < value <= serializer.fixed_high:  # (inline: see there)
            data = serializer.fixed_pack(serializer.fixed_tag, value)
        else:
            data = serializer._encode(value)
            if data is None:
                data = serializer.serialize(value)
    else:
        if type(value_type) not in _TYPE_CLASSES:  # (an ABC's isinstance costs more)
            if not isinstance(value_type, Type):
                raise ValueError(f"value_type must be a statefun Type, got {value_type!r}")
            if len(_TYPE_CLASSES) < 256:
                _TYPE_CLASSES.add(type(value_type))
        data = value_type.serializer().serialize(value)
    record = _new_object(EgressMessage)  # its fields are checked above
    record.typename = target_typename
    if data is None:  # (a serializer of the user's that gives no bytes: as TypedValue does)
        record.typed_value = TypedValue(value_type.typename, None)
    else:
        typed = record.typed_value = _new_object(TypedValue)
        typed.typename = value_type.typename
        typed.has_value = True
        typed.value = data
    return record


_new_object = object.__new__
#: classes whose instances were found to be a ``Type`` (a program uses a few; bounded)
_TYPE_CLASSES: set[type] = set()


def _value_bytes(value: Any, value_type: Type | None, allow_numbers: bool) -> bytes:
    if value_type is not None:
        return value_type.serializer().serialize(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if allow_numbers and isinstance(value, int):  # a bool too, as in StateFun's SDK
        return struct.pack(">i", value)  # Kafka's IntegerSerializer
    if allow_numbers and isinstance(value, float):
        return struct.pack(">d", value)  # Kafka's DoubleSerializer
    raise TypeError(f"unable to convert a {type(value).__name__} to bytes; pass value_type=")


def kafka_egress_message(
    typename: str,
    topic: str,
    value: str | bytes | bytearray | int | float | Any,
    value_type: Type | None = None,
    key: str | None = None,
) -> EgressMessage:
    """Build a record for a Kafka egress: ``topic``, optional ``key`` and the value.

    Without ``value_type``, a str is UTF-8 encoded, bytes are taken as they are, an int is 4
    big-endian bytes and a float 8 (Kafka's IntegerSerializer and DoubleSerializer).
    """
    if not topic:
        raise ValueError("a destination Kafka topic is missing")
    if value is None:
        raise ValueError("missing value")
    if not typename:
        raise ValueError("typename is missing")
    if type(topic) is not str or (key is not None and type(key) is not str):
        raise TypeError(
            f"topic and key must be str, got {type(topic).__name__} and {type(key).__name__}"
        )
    if value_type is None and type(value) is bytes:
        data = value
    else:
        data = _value_bytes(value, value_type, allow_numbers=True)
    # KafkaProducerRecord's bytes, written as protobuf writes them: key (1), value_bytes (2),
    # topic (3), empty ones left out
    topic_bytes = topic.encode("utf-8")
    key_bytes = key.encode("utf-8") if key else b""
    k, d, t = len(key_bytes), len(data), len(topic_bytes)
    if k and d and k < 128 and d < 128 and t < 128:  # the usual record: one join
        record = b"".join(
            (
                b"\x0a",
                _ONE_BYTE[k],
                key_bytes,
                b"\x12",
                _ONE_BYTE[d],
                data,
                b"\x1a",
                _ONE_BYTE[t],
                topic_bytes,
            )
        )
    else:
        record = b"".join(
            (
                bytes_field(b"\x0a", key_bytes),
                bytes_field(b"\x12", data),
                bytes_field(b"\x1a", topic_bytes),
            )
        )
    typed = _new_object(TypedValue)
    typed.typename = KAFKA_PRODUCER_RECORD_TYPENAME
    typed.has_value = True
    typed.value = record
    message = _new_object(EgressMessage)  # its fields are checked above
    message.typename = typename
    message.typed_value = typed
    return message


def kinesis_egress_message(
    typename: str,
    stream: str,
    value: str | bytes | bytearray | Any,
    partition_key: str,
    value_type: Type | None = None,
    explicit_hash_key: str | None = None,
) -> EgressMessage:
    """Build a record for a Kinesis egress: ``stream``, ``partition_key`` and the value."""
    if not stream:
        raise ValueError("missing destination Kinesis stream")
    if value is None:
        raise ValueError("missing value")
    if partition_key is None:
        raise ValueError("missing partition key")
    record = egress_pb2.KinesisEgressRecord(
        stream=stream,
        partition_key=partition_key,
        value_bytes=_value_bytes(value, value_type, allow_numbers=False),
    )
    if explicit_hash_key is not None:
        record.explicit_hash_key = explicit_hash_key
    return EgressMessage(
        typename, TypedValue(KINESIS_EGRESS_RECORD_TYPENAME, record.SerializeToString())
    )
