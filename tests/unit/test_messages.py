"""Messages to functions and egresses: builders, Message accessors, Kafka and Kinesis records."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from statefun._exceptions import InvalidTypeNameError
from statefun.sdk import (
    BoolType,
    DoubleType,
    EgressMessage,
    FloatType,
    IntType,
    LongType,
    Message,
    StringType,
    Type,
    TypedValue,
    egress_message_builder,
    kafka_egress_message,
    kinesis_egress_message,
    make_json_type,
    make_protobuf_type,
    message_builder,
    simple_type,
)
from statefun.sdk._proto import egress_pb2, request_reply_pb2, types_pb2

USER = make_json_type("com.example/User")
KAFKA = "type.googleapis.com/io.statefun.sdk.egress.KafkaProducerRecord"
KINESIS = "type.googleapis.com/io.statefun.sdk.egress.KinesisEgressRecord"


def reference(wrapper: Any, value: Any) -> bytes:
    message = wrapper()
    message.value = value
    return bytes(message.SerializeToString())


# ---------- message_builder


@pytest.mark.parametrize(
    ("keyword", "value", "tpe", "wrapper"),
    [
        ("int_value", 42, IntType, types_pb2.IntWrapper),
        ("int_value", -1, IntType, types_pb2.IntWrapper),
        ("long_value", 2**40, LongType, types_pb2.LongWrapper),
        ("float_value", 1.5, FloatType, types_pb2.FloatWrapper),
        ("double_value", -2.25, DoubleType, types_pb2.DoubleWrapper),
        ("str_value", "héllo", StringType, types_pb2.StringWrapper),
        ("bool_value", True, BoolType, types_pb2.BooleanWrapper),
        ("bool_value", False, BoolType, types_pb2.BooleanWrapper),
        ("int_value", 0, IntType, types_pb2.IntWrapper),
        ("str_value", "", StringType, types_pb2.StringWrapper),
    ],
)
def test_message_builder_primitives(keyword: str, value: Any, tpe: Type, wrapper: Any) -> None:
    message = message_builder("com.example/fn", "id-1", **{keyword: value})
    assert isinstance(message, Message)
    assert message.target_typename == "com.example/fn"
    assert message.target_id == "id-1"
    assert message.typed_value == TypedValue(tpe.typename, reference(wrapper, value))
    assert message.typed_value.has_value is True
    assert message.value_typename() == tpe.typename
    assert message.raw_value() == reference(wrapper, value)
    assert message.is_type(tpe)
    assert message.as_type(tpe) == value


def test_message_builder_value_and_value_type() -> None:
    message = message_builder("a/b", "7", value={"name": "Zoë"}, value_type=USER)
    assert message.typed_value == TypedValue("com.example/User", '{"name": "Zoë"}'.encode())
    assert message.as_type(USER) == {"name": "Zoë"}
    assert message.is_type(USER)
    assert not message.is_string()
    # keyword order does not matter
    again = message_builder("a/b", "7", value_type=USER, value={"name": "Zoë"})
    assert again.typed_value == message.typed_value
    # a built-in type works as value_type too
    assert message_builder("a/b", "7", value=5, value_type=IntType).typed_value == TypedValue(
        "io.statefun.types/int", b"\x0d\x05\x00\x00\x00"
    )


def test_message_builder_protobuf_value() -> None:
    tpe = make_protobuf_type(request_reply_pb2.Address)
    address = request_reply_pb2.Address(namespace="n", type="t", id="i")
    message = message_builder("a/b", "7", value=address, value_type=tpe)
    assert message.value_typename() == "type.googleapis.com/io.statefun.sdk.reqreply.Address"
    assert message.raw_value() == address.SerializeToString()
    assert message.as_type(tpe) == address


@pytest.mark.parametrize(
    "kwargs",
    [
        {"int_value": None},
        {"str_value": None},
        {"value": None, "value_type": USER},
    ],
)
def test_message_builder_missing_value(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="value can not be missing"):
        message_builder("a/b", "1", **kwargs)


def test_message_builder_wrong_keywords() -> None:
    with pytest.raises(ValueError, match="unknown value keyword string_value="):
        message_builder("a/b", "1", string_value="x")
    with pytest.raises(ValueError, match="could not deduce the value type"):
        message_builder("a/b", "1", value="x")
    with pytest.raises(TypeError, match="wrong value keywords"):
        message_builder("a/b", "1")
    with pytest.raises(TypeError, match=r"wrong value keywords \['int_value', 'str_value'\]"):
        message_builder("a/b", "1", int_value=1, str_value="x")
    with pytest.raises(TypeError, match="wrong value keywords"):
        message_builder("a/b", "1", value=1, value_type=IntType, int_value=1)
    with pytest.raises(ValueError, match="value_type must be a statefun Type"):
        message_builder("a/b", "1", value=1, value_type=int)
    with pytest.raises(ValueError, match="value_type must be a statefun Type"):
        message_builder("a/b", "1", value=1, value_type=None)


def test_message_builder_checks_the_value() -> None:
    with pytest.raises(ValueError):
        message_builder("a/b", "1", int_value=2**31)
    with pytest.raises(TypeError):
        message_builder("a/b", "1", int_value="1")
    with pytest.raises(TypeError):
        message_builder("a/b", "1", str_value=5)


@pytest.mark.parametrize(("typename", "id_"), [("", "1"), (None, "1"), ("a/b", ""), ("a/b", None)])
def test_message_needs_target(typename: Any, id_: Any) -> None:
    with pytest.raises(ValueError, match="can not be missing"):
        message_builder(typename, id_, int_value=1)


def test_message_needs_a_typed_value() -> None:
    with pytest.raises(ValueError, match="typed_value can not be missing"):
        Message("a/b", "1", None)


# ---------- Message accessors

ACCESSORS = {
    IntType: ("is_int", "as_int"),
    LongType: ("is_long", "as_long"),
    BoolType: ("is_bool", "as_bool"),
    StringType: ("is_string", "as_string"),
    FloatType: ("is_float", "as_float"),
    DoubleType: ("is_double", "as_double"),
}


@pytest.mark.parametrize(
    ("tpe", "value"),
    [
        (IntType, -7),
        (LongType, -(2**50)),
        (BoolType, True),
        (StringType, "日本"),
        (FloatType, 0.5),
        (DoubleType, 1e-300),
    ],
)
def test_is_and_as_methods(tpe: Type, value: Any) -> None:
    message = message_builder("a/b", "1", value=value, value_type=tpe)
    for other, (is_name, _) in ACCESSORS.items():
        assert getattr(message, is_name)() is (other is tpe), is_name
    is_name, as_name = ACCESSORS[tpe]
    got = getattr(message, as_name)()
    assert got == value and type(got) is type(value)


def test_accessors_on_a_protobuf_typed_value() -> None:
    # what the handler gives a function: the request's protobuf TypedValue
    tv = request_reply_pb2.TypedValue(
        typename="io.statefun.types/long", has_value=True, value=b"\x09" + struct.pack("<q", 9)
    )
    message = Message("a/b", "1", tv)
    assert message.is_long() and not message.is_int()
    assert message.as_long() == 9
    assert message.value_typename() == "io.statefun.types/long"
    assert message.raw_value() == b"\x09" + struct.pack("<q", 9)
    assert type(message.raw_value()) is bytes


def test_message_without_value() -> None:
    for tv in (
        TypedValue("io.statefun.types/int", None),
        request_reply_pb2.TypedValue(typename="io.statefun.types/int", has_value=False),
    ):
        message = Message("a/b", "1", tv)
        assert message.is_int()
        assert message.as_int() is None
        assert message.as_type(IntType) is None
        assert message.raw_value() is None
        assert message.value_typename() == "io.statefun.types/int"


def test_as_type_decodes_with_the_given_type() -> None:
    # as_type does not check the typename: it decodes with what it is told
    message = message_builder("a/b", "1", str_value="abc")
    assert message.raw_value() == b"\x0a\x03abc"
    assert message.as_type(simple_type("x/raw", bytes, bytes)) == b"\x0a\x03abc"


def test_message_repr() -> None:
    assert repr(message_builder("a/b", "1", int_value=1)).startswith("Message('a/b', '1', ")


# ---------- egress_message_builder


def test_egress_message_builder() -> None:
    message = egress_message_builder("com.example/out", {"a": [1, "é"]}, USER)
    assert isinstance(message, EgressMessage)
    assert message.typename == "com.example/out"
    assert message.typed_value == TypedValue("com.example/User", '{"a": [1, "é"]}'.encode())
    assert message.value_typename() == "com.example/User"
    assert message.raw_value() == '{"a": [1, "é"]}'.encode()
    assert egress_message_builder("a/b", 3, IntType).raw_value() == b"\x0d\x03\x00\x00\x00"
    assert egress_message_builder("a/b", False, BoolType).raw_value() == b""


def test_egress_message_builder_errors() -> None:
    with pytest.raises(ValueError, match="target typename is missing"):
        egress_message_builder("", 1, IntType)
    with pytest.raises(InvalidTypeNameError, match="egress typename 'noslash'"):
        egress_message_builder("noslash", 1, IntType)
    with pytest.raises(ValueError, match="value can not be missing"):
        egress_message_builder("a/b", None, IntType)
    with pytest.raises(ValueError, match="value_type must be a statefun Type"):
        egress_message_builder("a/b", 1, "io.statefun.types/int")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        egress_message_builder("a/b", "x", IntType)


def test_egress_message_needs_typename_and_value() -> None:
    with pytest.raises(ValueError, match="typename is missing"):
        EgressMessage("", TypedValue("a/b", b""))
    with pytest.raises(ValueError, match="value is missing"):
        EgressMessage("a/b", None)
    empty = EgressMessage("a/b", TypedValue("x/y", None))
    assert empty.raw_value() is None


# ---------- Kafka


def kafka_record(message: EgressMessage) -> egress_pb2.KafkaProducerRecord:
    assert message.typed_value.typename == KAFKA
    assert message.typed_value.has_value is True
    return egress_pb2.KafkaProducerRecord.FromString(message.typed_value.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("héllo", "héllo".encode()),
        ("", b""),
        (b"\x00\xffraw", b"\x00\xffraw"),
        (bytearray(b"ba"), b"ba"),
        (1, b"\x00\x00\x00\x01"),
        (-1, b"\xff\xff\xff\xff"),
        (0, b"\x00\x00\x00\x00"),
        (2**31 - 1, b"\x7f\xff\xff\xff"),
        (-(2**31), b"\x80\x00\x00\x00"),
        (258, b"\x00\x00\x01\x02"),
        (True, b"\x00\x00\x00\x01"),  # a bool is an int, as in StateFun's SDK
        (1.5, b"\x3f\xf8\x00\x00\x00\x00\x00\x00"),
        (-0.0, b"\x80\x00\x00\x00\x00\x00\x00\x00"),
        (0.1, struct.pack(">d", 0.1)),
    ],
)
def test_kafka_egress_message_values(value: Any, expected: bytes) -> None:
    message = kafka_egress_message(typename="com.example/kafka", topic="out", value=value)
    assert message.typename == "com.example/kafka"
    record = kafka_record(message)
    assert record.topic == "out"
    assert record.value_bytes == expected
    assert record.key == ""
    exact = egress_pb2.KafkaProducerRecord(topic="out", value_bytes=expected).SerializeToString()
    assert message.typed_value.value == exact


def test_kafka_egress_message_key_and_exact_bytes() -> None:
    message = kafka_egress_message("com.example/kafka", "greetings", "hi", key="user-1")
    record = kafka_record(message)
    assert (record.topic, record.key, record.value_bytes) == ("greetings", "user-1", b"hi")
    expected = egress_pb2.KafkaProducerRecord(key="user-1", value_bytes=b"hi", topic="greetings")
    assert message.typed_value.value == expected.SerializeToString()
    assert message.raw_value() == expected.SerializeToString()
    assert message.value_typename() == KAFKA


def test_kafka_egress_message_value_type() -> None:
    record = kafka_record(kafka_egress_message("a/k", "t", 5, value_type=IntType))
    assert record.value_bytes == b"\x0d\x05\x00\x00\x00"
    record = kafka_record(kafka_egress_message("a/k", "t", "s", value_type=StringType, key="k"))
    assert (record.value_bytes, record.key) == (b"\x0a\x01s", "k")
    record = kafka_record(kafka_egress_message("a/k", "t", {"x": "é"}, value_type=USER))
    assert record.value_bytes == '{"x": "é"}'.encode()


def test_kafka_egress_message_errors() -> None:
    with pytest.raises(ValueError, match="topic is missing"):
        kafka_egress_message("a/k", "", "v")
    with pytest.raises(ValueError, match="missing value"):
        kafka_egress_message("a/k", "t", None)
    with pytest.raises(TypeError, match="unable to convert a dict to bytes"):
        kafka_egress_message("a/k", "t", {"a": 1})
    with pytest.raises(TypeError):
        kafka_egress_message("a/k", "t", [1, 2])
    with pytest.raises(struct.error):
        kafka_egress_message("a/k", "t", 2**31)


# ---------- Kinesis


def kinesis_record(message: EgressMessage) -> egress_pb2.KinesisEgressRecord:
    assert message.typed_value.typename == KINESIS
    assert message.typed_value.has_value is True
    return egress_pb2.KinesisEgressRecord.FromString(message.typed_value.value)


def test_kinesis_egress_message() -> None:
    message = kinesis_egress_message(
        typename="com.example/kinesis", stream="s1", value="héllo", partition_key="pk"
    )
    assert message.typename == "com.example/kinesis"
    record = kinesis_record(message)
    assert (record.stream, record.partition_key, record.value_bytes, record.explicit_hash_key) == (
        "s1",
        "pk",
        "héllo".encode(),
        "",
    )
    expected = egress_pb2.KinesisEgressRecord(
        partition_key="pk", value_bytes="héllo".encode(), stream="s1"
    )
    assert message.typed_value.value == expected.SerializeToString()


def test_kinesis_egress_message_options() -> None:
    record = kinesis_record(
        kinesis_egress_message("a/k", "s", b"\x01\x02", "pk", explicit_hash_key="123")
    )
    assert (record.value_bytes, record.explicit_hash_key) == (b"\x01\x02", "123")
    record = kinesis_record(kinesis_egress_message("a/k", "s", 7, "pk", value_type=LongType))
    assert record.value_bytes == b"\x09" + struct.pack("<q", 7)
    record = kinesis_record(kinesis_egress_message("a/k", "s", bytearray(b"z"), ""))
    assert (record.value_bytes, record.partition_key) == (b"z", "")


def test_kinesis_egress_message_errors() -> None:
    with pytest.raises(ValueError, match="missing destination Kinesis stream"):
        kinesis_egress_message("a/k", "", "v", "pk")
    with pytest.raises(ValueError, match="missing value"):
        kinesis_egress_message("a/k", "s", None, "pk")
    with pytest.raises(ValueError, match="missing partition key"):
        kinesis_egress_message("a/k", "s", "v", None)  # type: ignore[arg-type]
    # numbers need a value_type: Kinesis has no standard number encoding
    with pytest.raises(TypeError, match="unable to convert a int to bytes"):
        kinesis_egress_message("a/k", "s", 5, "pk")
    with pytest.raises(TypeError):
        kinesis_egress_message("a/k", "s", 1.5, "pk")
