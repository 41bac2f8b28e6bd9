"""The hand-written fast paths of the built-in types and messages against the generic ones.

Randomized: the fast encoder and decoder against the generated protobuf wrapper (the
reference), ``Message.as_int`` against ``Message.as_type(IntType)``, and the cache of valid
typenames against a fresh validation.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    ValueSpec,
    egress_message_builder,
    kafka_egress_message,
    make_json_type,
    simple_type,
)
from statefun.sdk._proto import egress_pb2, request_reply_pb2, types_pb2
from statefun.sdk._storage import make_storage_class
from statefun.sdk._types import TypedValue, validate_typename
from statefun.sdk._wire import encode_invocation_response

_INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@given(_INT32)
def test_int_encoding_is_protobufs(value: int) -> None:
    assert (
        IntType.serializer().serialize(value)
        == types_pb2.IntWrapper(value=value).SerializeToString()
    )


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_long_encoding_is_protobufs(value: int) -> None:
    assert (
        LongType.serializer().serialize(value)
        == types_pb2.LongWrapper(value=value).SerializeToString()
    )


@given(st.integers().filter(lambda v: not -(2**31) <= v < 2**31))
def test_int_out_of_range_still_refused(value: int) -> None:
    with pytest.raises(ValueError, match="32-bit"):
        IntType.serializer().serialize(value)


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None])
def test_int_fast_path_refuses_what_the_generic_one_refuses(value: Any) -> None:
    with pytest.raises(TypeError):
        IntType.serializer().serialize(value)


def _message(typename: str, data: bytes | None) -> Message:
    return Message("ns/fn", "id", TypedValue(typename, data))


@given(
    st.one_of(
        _INT32.map(lambda v: types_pb2.IntWrapper(value=v).SerializeToString()),
        st.binary(max_size=12),
    )
)
def test_as_int_equals_as_type(data: bytes) -> None:
    message = _message(IntType.typename, data)
    try:
        expected: Any = message.as_type(IntType)
    except Exception as exc:
        with pytest.raises(type(exc)):
            message.as_int()
    else:
        assert message.as_int() == expected


@pytest.mark.parametrize(
    ("typename", "data"),
    [
        (IntType.typename, None),
        (LongType.typename, types_pb2.LongWrapper(value=7).SerializeToString()),
        (StringType.typename, types_pb2.StringWrapper(value="x").SerializeToString()),
    ],
)
def test_as_int_of_other_values_as_before(typename: str, data: bytes | None) -> None:
    message = _message(typename, data)
    assert message.as_int() == message.as_type(IntType)


@given(st.text(max_size=12))
def test_typename_validation_is_the_same_the_second_time(typename: str) -> None:
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(validate_typename(typename))
        except InvalidTypeNameError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]


def test_a_cached_typename_still_names_what_it_validates() -> None:
    validate_typename("ns/egress")
    with pytest.raises(InvalidTypeNameError, match="egress typename 'ns/' has an empty name"):
        egress_message_builder("ns/", 1, IntType)
    assert (
        egress_message_builder("ns/egress", 5, IntType).typed_value.value == b"\x0d\x05\x00\x00\x00"
    )


_BUILT_IN = [IntType, LongType, StringType, BoolType, FloatType, DoubleType]
_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.binary(max_size=4),
)
#: a type of the user's whose serializer gives no bytes for None-like values
_ODD = simple_type("test/odd", lambda v: None if v == 0 else str(v).encode(), bytes)
_TYPES = st.sampled_from([*_BUILT_IN, _ODD, make_json_type("test/json"), "not a type", None])


def _outcome(make: Any) -> Any:
    try:
        return make()
    except Exception as exc:
        return (type(exc), str(exc))


def _reference_record(typename: Any, value: Any, value_type: Any) -> Any:
    """egress_message_builder as it read before its fast paths (the generic checks)."""
    if not typename:
        raise ValueError("target typename is missing")
    validate_typename(typename, "egress typename")
    if value is None:
        raise ValueError("value can not be missing")
    if not isinstance(value_type, Type):
        raise ValueError(f"value_type must be a statefun Type, got {value_type!r}")
    typed = TypedValue(value_type.typename, value_type.serializer().serialize(value))
    return (typename, typed.typename, typed.has_value, typed.value)


@settings(max_examples=300)
@given(st.sampled_from(["ns/out"] * 5 + ["", "ns/", "bad", 5, None]), _ANY_VALUE, _TYPES)
def test_egress_builder_equals_the_generic_one(typename: Any, value: Any, value_type: Any) -> None:
    def fast() -> Any:
        record = egress_message_builder(typename, value, value_type)
        typed = record.typed_value
        return (record.typename, typed.typename, typed.has_value, typed.value)

    expected = _outcome(lambda: _reference_record(typename, value, value_type))
    assert _outcome(fast) == expected
    assert _outcome(fast) == expected  # (the second time, from the caches)


@given(st.sampled_from([*_BUILT_IN, _ODD]), _ANY_VALUE)
def test_a_state_write_equals_the_generic_encoding(value_type: Type, value: Any) -> None:
    storage = make_storage_class("test/fn", [ValueSpec("v", value_type)])("test/fn", {})

    def write() -> Any:
        storage.v = value
        typed = storage._values["v"]
        return (typed.typename, typed.has_value, typed.value)

    def generic() -> Any:
        if value is None:
            raise ValueError("state 'v': cannot store None; use `del context.storage.v`")
        typed = TypedValue(value_type.typename, value_type.serializer().serialize(value))
        return (typed.typename, typed.has_value, typed.value)

    expected = _outcome(generic)
    assert _outcome(write) == expected
    if not isinstance(expected[0], type):  # written: it reads back as the generic decoding
        fresh = make_storage_class("test/fn", [ValueSpec("v", value_type)])(
            "test/fn", {"v": storage._values["v"]}
        )
        decoded = _outcome(lambda: fresh.v)
        raw = storage._values["v"]
        reference = _outcome(
            lambda: value_type.serializer().deserialize(raw.value) if raw.has_value else None
        )
        assert decoded == reference or decoded != decoded  # (NaN never equals itself)


_TEXT = st.text(max_size=300)


@given(topic=_TEXT.filter(bool), key=st.none() | _TEXT, value=st.binary(max_size=300))
@settings(max_examples=300)
def test_kafka_record_bytes_are_protobufs(topic: str, key: str | None, value: bytes) -> None:
    typed = kafka_egress_message("a/k", topic, value, key=key).typed_value
    reference = egress_pb2.KafkaProducerRecord(topic=topic, value_bytes=value)
    if key is not None:
        reference.key = key
    assert typed.value == reference.SerializeToString()


def test_kafka_record_refuses_what_protobuf_refuses() -> None:
    with pytest.raises(TypeError, match="topic and key must be str, got bytes and NoneType"):
        kafka_egress_message("a/k", b"t", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got str and int"):
        kafka_egress_message("a/k", "t", b"v", key=5)  # type: ignore[arg-type]


@given(
    namespace=st.text(min_size=1, max_size=150).filter(lambda s: "/" not in s),
    name=st.text(min_size=1, max_size=150).filter(lambda s: "/" not in s),
    value=st.binary(max_size=300),
)
@settings(max_examples=200)
def test_an_egress_record_in_a_response_is_protobufs(
    namespace: str, name: str, value: bytes
) -> None:
    typename = f"{namespace}/{name}"
    typed = TypedValue("x/y", value)
    encoded = encode_invocation_response([], [], [], [EgressMessage(typename, typed)])
    reference = request_reply_pb2.FromFunction()
    egress = reference.invocation_result.outgoing_egresses.add()
    egress.egress_namespace, egress.egress_type = namespace, name
    egress.argument.typename, egress.argument.has_value, egress.argument.value = "x/y", True, value
    assert encoded == reference.SerializeToString()
