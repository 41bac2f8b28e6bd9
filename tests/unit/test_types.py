"""Built-in types byte-for-byte against the generated wrapper messages, and the type factories."""

from __future__ import annotations

import json
import math
import struct
from decimal import Decimal
from typing import Any

import pytest
from google.protobuf.message import DecodeError

from statefun._exceptions import ConfigurationError, InvalidTypeNameError
from statefun.sdk import (
    BoolType,
    DoubleType,
    FloatType,
    IntType,
    LongType,
    StringType,
    Type,
    TypedValue,
    TypeSerializer,
    make_json_type,
    make_protobuf_type,
    simple_type,
)
from statefun.sdk._proto import egress_pb2, request_reply_pb2, types_pb2
from statefun.sdk._types import to_typed_value

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def reference(wrapper: Any, value: Any) -> bytes:
    message = wrapper()
    message.value = value
    return bytes(message.SerializeToString())


def roundtrip(tpe: Type, value: Any) -> tuple[bytes, Any]:
    serializer = tpe.serializer()
    data = serializer.serialize(value)
    return data, serializer.deserialize(data)


def test_typenames() -> None:
    assert BoolType.typename == "io.statefun.types/bool"
    assert IntType.typename == "io.statefun.types/int"
    assert LongType.typename == "io.statefun.types/long"
    assert FloatType.typename == "io.statefun.types/float"
    assert DoubleType.typename == "io.statefun.types/double"
    assert StringType.typename == "io.statefun.types/string"
    for tpe in (BoolType, IntType, LongType, FloatType, DoubleType, StringType):
        assert isinstance(tpe, Type)
        assert isinstance(tpe.serializer(), TypeSerializer)


# ---------- int / long

INT_VALUES = [0, 1, -1, 2, 127, 128, -128, 255, 256, 65535, -65536, 123456789,
              INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1]  # fmt: skip


@pytest.mark.parametrize("value", INT_VALUES)
def test_int_matches_protobuf(value: int) -> None:
    data, back = roundtrip(IntType, value)
    assert data == reference(types_pb2.IntWrapper, value)
    assert back == value and type(back) is int
    assert types_pb2.IntWrapper.FromString(data).value == value


def test_int_exact_bytes() -> None:
    assert IntType.serializer().serialize(0) == b""
    assert IntType.serializer().serialize(1) == b"\x0d\x01\x00\x00\x00"
    assert IntType.serializer().serialize(-1) == b"\x0d\xff\xff\xff\xff"
    assert IntType.serializer().serialize(INT32_MIN) == b"\x0d\x00\x00\x00\x80"


LONG_VALUES = [*INT_VALUES, INT32_MAX + 1, INT32_MIN - 1, 2**40 + 5, -(2**52), INT64_MAX,
               INT64_MIN, INT64_MAX - 1, INT64_MIN + 1]  # fmt: skip


@pytest.mark.parametrize("value", LONG_VALUES)
def test_long_matches_protobuf(value: int) -> None:
    data, back = roundtrip(LongType, value)
    assert data == reference(types_pb2.LongWrapper, value)
    assert back == value and type(back) is int
    assert types_pb2.LongWrapper.FromString(data).value == value


@pytest.mark.parametrize(
    ("tpe", "value"),
    [
        (IntType, INT32_MAX + 1),
        (IntType, INT32_MIN - 1),
        (IntType, 2**40),
        (IntType, INT64_MIN),
        (LongType, INT64_MAX + 1),
        (LongType, INT64_MIN - 1),
        (LongType, 2**100),
    ],
)
def test_integer_out_of_range_is_value_error(tpe: Type, value: int) -> None:
    with pytest.raises(ValueError, match=str(value)):
        tpe.serializer().serialize(value)


@pytest.mark.parametrize("tpe", [IntType, LongType])
@pytest.mark.parametrize("value", [True, False, 1.0, 0.0, "1", b"\x01", [1], None])
def test_integer_wrong_python_type_is_type_error(tpe: Type, value: Any) -> None:
    with pytest.raises(TypeError):
        tpe.serializer().serialize(value)


# ---------- bool


@pytest.mark.parametrize("value", [True, False])
def test_bool_matches_protobuf(value: bool) -> None:
    data, back = roundtrip(BoolType, value)
    assert data == reference(types_pb2.BooleanWrapper, value)
    assert back is value


def test_bool_exact_bytes() -> None:
    assert BoolType.serializer().serialize(True) == b"\x08\x01"
    assert BoolType.serializer().serialize(False) == b""


@pytest.mark.parametrize(("value", "expected"), [(1, True), (0, False), (7, True), (-1, True)])
def test_bool_accepts_ints_as_statefun_does(value: int, expected: bool) -> None:
    # StateFun's SDK sets the protobuf field, which takes any int.
    data, back = roundtrip(BoolType, value)
    assert data == reference(types_pb2.BooleanWrapper, value)
    assert back is expected


@pytest.mark.parametrize("value", [1.0, "true", b"\x01", None, [True]])
def test_bool_wrong_python_type_is_type_error(value: Any) -> None:
    with pytest.raises(TypeError):
        BoolType.serializer().serialize(value)


# ---------- float / double

FLOAT_VALUES = [0.0, -0.0, 1.0, -1.0, 0.1, -2.5, 1e-45, 3.4028234663852886e38,
                -3.4028234663852886e38, 1.17549435e-38, 1e30, float("inf"), float("-inf"),
                123456.789]  # fmt: skip


def same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.mark.parametrize("value", [*FLOAT_VALUES, float("nan"), 1e300, -1e300, 5e-324])
def test_double_matches_protobuf(value: float) -> None:
    data, back = roundtrip(DoubleType, value)
    assert data == reference(types_pb2.DoubleWrapper, value)
    assert same_float(back, value)
    assert type(back) is float


@pytest.mark.parametrize("value", [*FLOAT_VALUES, float("nan"), 1e40, -1e40])
def test_float_matches_protobuf(value: float) -> None:
    data, back = roundtrip(FloatType, value)
    assert data == reference(types_pb2.FloatWrapper, value)
    if math.isfinite(value) and abs(value) < 3.5e38:
        (expected,) = struct.unpack("<f", struct.pack("<f", value))
    else:  # too large for a float32: infinity
        expected = value if math.isnan(value) else math.copysign(math.inf, value)
    assert same_float(back, expected)
    assert same_float(types_pb2.FloatWrapper.FromString(data).value, expected)


def test_negative_zero_keeps_its_sign() -> None:
    assert DoubleType.serializer().serialize(-0.0) == b"\x09" + struct.pack("<d", -0.0)
    assert FloatType.serializer().serialize(-0.0) == b"\x0d" + struct.pack("<f", -0.0)
    assert DoubleType.serializer().serialize(0.0) == b""
    assert (
        math.copysign(1.0, DoubleType.serializer().deserialize(b"\x09" + struct.pack("<d", -0.0)))
        == -1.0
    )


def test_float_rounds_to_float32() -> None:
    data, back = roundtrip(FloatType, 0.1)
    assert data == b"\x0d" + struct.pack("<f", 0.1)
    assert back == struct.unpack("<f", struct.pack("<f", 0.1))[0] != 0.1


@pytest.mark.parametrize("tpe", [FloatType, DoubleType])
@pytest.mark.parametrize(
    ("value", "expected"), [(3, 3.0), (True, 1.0), (Decimal("1.5"), 1.5), (-7, -7.0)]
)
def test_floats_accept_numbers_as_statefun_does(tpe: Type, value: Any, expected: float) -> None:
    wrapper = types_pb2.FloatWrapper if tpe is FloatType else types_pb2.DoubleWrapper
    data, back = roundtrip(tpe, value)
    assert data == reference(wrapper, value)
    assert back == expected and type(back) is float


@pytest.mark.parametrize("tpe", [FloatType, DoubleType])
@pytest.mark.parametrize("value", ["1.0", b"1", None, [1.0], {}])
def test_floats_wrong_python_type_is_type_error(tpe: Type, value: Any) -> None:
    with pytest.raises(TypeError):
        tpe.serializer().serialize(value)


# ---------- string

STRINGS = ["", "a", "hello world", "é", "日本語", "🎉 emoji", "\x00nul", "x" * 127, "x" * 128,
           "é" * 63, "é" * 64, "y" * 300, "🎉" * 40, "z" * 20000]  # fmt: skip


@pytest.mark.parametrize("value", STRINGS)
def test_string_matches_protobuf(value: str) -> None:
    data, back = roundtrip(StringType, value)
    assert data == reference(types_pb2.StringWrapper, value)
    assert back == value and type(back) is str


def test_string_exact_bytes() -> None:
    assert StringType.serializer().serialize("") == b""
    assert StringType.serializer().serialize("ab") == b"\x0a\x02ab"
    assert StringType.serializer().serialize("x" * 128) == b"\x0a\x80\x01" + b"x" * 128


def test_string_accepts_utf8_bytes_as_statefun_does() -> None:
    data, back = roundtrip(StringType, "é".encode())
    assert data == b"\x0a\x02\xc3\xa9"
    assert back == "é"


@pytest.mark.parametrize("value", [1, 1.5, True, None, bytearray(b"x"), ["a"]])
def test_string_wrong_python_type_is_type_error(value: Any) -> None:
    with pytest.raises(TypeError):
        StringType.serializer().serialize(value)


def test_string_unencodable_is_value_error() -> None:
    with pytest.raises(ValueError):
        StringType.serializer().serialize("\ud800")


def test_string_bad_utf8_fails_as_protobuf_does() -> None:
    for data in (b"\x0a\x01\xff", b"\x0a\x81\x01" + b"\xff" * 129):
        with pytest.raises(DecodeError):
            types_pb2.StringWrapper.FromString(data)
        with pytest.raises(DecodeError):
            StringType.serializer().deserialize(data)


# ---------- decoding


def tag(field: int, wire_type: int) -> bytes:
    return bytes(((field << 3) | wire_type,))


UNKNOWN = tag(2, 0) + b"\x05" + tag(7, 2) + b"\x03abc"  # unknown varint field 2, bytes field 7


@pytest.mark.parametrize(
    ("tpe", "data", "expected"),
    [
        # the value field twice: the last one wins
        (IntType, tag(1, 5) + struct.pack("<i", 1) + tag(1, 5) + struct.pack("<i", 42), 42),
        (LongType, tag(1, 1) + struct.pack("<q", 1) + tag(1, 1) + struct.pack("<q", -9), -9),
        (BoolType, b"\x08\x01\x08\x00", False),
        (BoolType, b"\x08\x00\x08\x01", True),
        (StringType, b"\x0a\x01a\x0a\x02bc", "bc"),
        (DoubleType, tag(1, 1) + struct.pack("<d", 1.0) + tag(1, 1) + struct.pack("<d", 2.5), 2.5),
        # unknown fields before or after the value
        (IntType, UNKNOWN + tag(1, 5) + struct.pack("<i", -5), -5),
        (IntType, tag(1, 5) + struct.pack("<i", 77) + UNKNOWN, 77),
        (LongType, UNKNOWN + tag(1, 1) + struct.pack("<q", 2**40), 2**40),
        (BoolType, UNKNOWN + b"\x08\x01", True),
        (StringType, b"\x0a\x03abc" + UNKNOWN, "abc"),
        (StringType, UNKNOWN + b"\x0a\x03abc", "abc"),
        (FloatType, UNKNOWN + tag(1, 5) + struct.pack("<f", 1.5), 1.5),
        # only unknown fields: the default value
        (IntType, UNKNOWN, 0),
        (LongType, UNKNOWN, 0),
        (BoolType, UNKNOWN, False),
        (StringType, UNKNOWN, ""),
        (DoubleType, UNKNOWN, 0.0),
        # explicitly encoded default values and non-minimal encodings
        (IntType, tag(1, 5) + b"\x00\x00\x00\x00", 0),
        (BoolType, b"\x08\x00", False),
        (BoolType, b"\x08\x02", True),
        (BoolType, b"\x08\x81\x00", True),  # a two-byte varint of 1
        (StringType, b"\x0a\x00", ""),
        (StringType, b"\x0a\x82\x00ab", "ab"),  # a two-byte varint length
        (StringType, b"\x0a\x80\x01" + b"q" * 128, "q" * 128),
        # a wire-type mismatch (a varint where a fixed32 is declared) is an unknown field
        (IntType, b"\x08\x05", 0),
        (LongType, b"\x08\x05" + tag(1, 1) + struct.pack("<q", 3), 3),
    ],
)
def test_non_canonical_encodings_decode_as_protobuf_does(
    tpe: Type, data: bytes, expected: Any
) -> None:
    wrapper = {
        IntType: types_pb2.IntWrapper,
        LongType: types_pb2.LongWrapper,
        BoolType: types_pb2.BooleanWrapper,
        StringType: types_pb2.StringWrapper,
        FloatType: types_pb2.FloatWrapper,
        DoubleType: types_pb2.DoubleWrapper,
    }[tpe]
    assert wrapper.FromString(data).value == expected
    value = tpe.serializer().deserialize(data)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("tpe", [IntType, LongType, BoolType, StringType, FloatType, DoubleType])
def test_empty_bytes_decode_to_the_default(tpe: Type) -> None:
    expected = {IntType: 0, LongType: 0, BoolType: False, StringType: ""}.get(tpe, 0.0)
    value = tpe.serializer().deserialize(b"")
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("tpe", [IntType, LongType, StringType, DoubleType])
def test_truncated_bytes_are_a_decode_error(tpe: Type) -> None:
    data = tpe.serializer().serialize({IntType: 5, LongType: 5, StringType: "abc"}.get(tpe, 2.5))
    with pytest.raises(DecodeError):
        tpe.serializer().deserialize(data[:-1])


# ---------- json / protobuf


def test_json_type_is_utf8_without_ascii_escapes() -> None:
    tpe = make_json_type("com.example/User")
    assert tpe.typename == "com.example/User"
    value = {"name": "Zoë", "city": "東京", "n": [1, 2.5, None, True]}
    data = tpe.serializer().serialize(value)
    assert data == json.dumps(value, ensure_ascii=False).encode("utf-8")
    assert "Zoë".encode() in data and b"\\u" not in data
    assert tpe.serializer().deserialize(data) == value
    assert tpe.serializer().deserialize(b'{"a": "\\u00e9"}') == {"a": "é"}
    assert tpe.serializer().deserialize(b'"x"') == "x"


def test_json_type_unserializable_value() -> None:
    with pytest.raises(TypeError):
        make_json_type("a/b").serializer().serialize({1, 2})


def test_json_type_needs_a_valid_typename() -> None:
    with pytest.raises(InvalidTypeNameError):
        make_json_type("no-namespace")


def test_protobuf_type() -> None:
    tpe = make_protobuf_type(egress_pb2.KafkaProducerRecord)
    assert tpe.typename == "type.googleapis.com/io.statefun.sdk.egress.KafkaProducerRecord"
    record = egress_pb2.KafkaProducerRecord(topic="t", key="k", value_bytes=b"\x00\x01")
    data = tpe.serializer().serialize(record)
    assert data == record.SerializeToString()
    assert isinstance(data, bytes)
    back = tpe.serializer().deserialize(data)
    assert isinstance(back, egress_pb2.KafkaProducerRecord)
    assert back == record


def test_protobuf_type_custom_namespace() -> None:
    tpe = make_protobuf_type(request_reply_pb2.Address, namespace="com.example")
    assert tpe.typename == "com.example/io.statefun.sdk.reqreply.Address"
    assert make_protobuf_type(types_pb2.IntWrapper, namespace="").typename == (
        "type.googleapis.com/io.statefun.sdk.types.IntWrapper"
    )


def test_protobuf_type_needs_a_message_class() -> None:
    with pytest.raises(ValueError):
        make_protobuf_type(None)
    with pytest.raises(TypeError):
        make_protobuf_type(int)


# ---------- simple_type


def test_simple_type() -> None:
    tpe = simple_type("com.example/Point", serialize_fn=lambda p: f"{p[0]},{p[1]}".encode(),
                      deserialize_fn=lambda b: tuple(int(x) for x in b.split(b",")))  # fmt: skip
    assert tpe.typename == "com.example/Point"
    assert tpe.serializer().serialize((3, -4)) == b"3,-4"
    assert tpe.serializer().deserialize(b"3,-4") == (3, -4)
    assert isinstance(tpe, Type)


@pytest.mark.parametrize("typename", [None, "", "noslash", "/x", "x/"])
def test_simple_type_bad_typename(typename: Any) -> None:
    with pytest.raises(InvalidTypeNameError) as info:
        simple_type(typename, bytes, bytes)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ConfigurationError)


def test_simple_type_nested_namespace_is_fine() -> None:
    assert simple_type("a/b/c", bytes, bytes).typename == "a/b/c"


@pytest.mark.parametrize(
    ("kwargs", "missing"),
    [
        ({"deserialize_fn": bytes}, "serialize_fn"),
        ({"serialize_fn": bytes}, "deserialize_fn"),
        ({"serialize_fn": "not callable", "deserialize_fn": bytes}, "serialize_fn"),
        ({"serialize_fn": bytes, "deserialize_fn": 42}, "deserialize_fn"),
    ],
)
def test_simple_type_needs_both_functions(kwargs: dict[str, Any], missing: str) -> None:
    with pytest.raises(ValueError, match=missing):
        simple_type("a/b", **kwargs)


def test_custom_type_subclass() -> None:
    class Upper(TypeSerializer):
        def serialize(self, value: Any) -> bytes:
            return str(value).upper().encode()

        def deserialize(self, data: bytes) -> Any:
            return data.decode().lower()

    class UpperType(Type):
        def __init__(self) -> None:
            super().__init__("com.example/upper")

        def serializer(self) -> TypeSerializer:
            return Upper()

    tpe = UpperType()
    assert tpe.serializer().serialize("abc") == b"ABC"
    with pytest.raises(TypeError):
        Type("a/b")  # type: ignore[abstract]


# ---------- TypedValue


def test_typed_value() -> None:
    tv = TypedValue("a/b", b"\x01")
    assert (tv.typename, tv.has_value, tv.value) == ("a/b", True, b"\x01")
    empty = TypedValue("a/b", None)
    assert (empty.typename, empty.has_value, empty.value) == ("a/b", False, b"")
    assert TypedValue("a/b", b"") != empty
    assert TypedValue("a/b", b"") == TypedValue("a/b", b"")
    assert tv == TypedValue("a/b", b"\x01")
    assert hash(tv) == hash(TypedValue("a/b", b"\x01"))
    assert tv != TypedValue("a/c", b"\x01")
    assert tv != TypedValue("a/b", b"\x02")
    assert tv != ("a/b", True, b"\x01")
    assert len({tv, TypedValue("a/b", b"\x01"), empty}) == 2
    assert "a/b" in repr(tv)


def test_to_typed_value() -> None:
    assert to_typed_value(IntType, 5) == TypedValue(
        "io.statefun.types/int", b"\x0d\x05\x00\x00\x00"
    )
    assert to_typed_value(IntType, None) == TypedValue("io.statefun.types/int", None)
    assert to_typed_value(StringType, "") == TypedValue("io.statefun.types/string", b"")
