"""The hand-written fast paths of the built-in types and messages against the generic ones.

Randomized: the fast encoder and decoder against the generated protobuf wrapper (the
reference), ``Message.as_int`` against ``Message.as_type(IntType)``, and the cache of valid
typenames against a fresh validation.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statefun._exceptions import InvalidTypeNameError
from statefun.sdk import IntType, LongType, Message, StringType, egress_message_builder
from statefun.sdk._proto import types_pb2
from statefun.sdk._types import TypedValue, validate_typename

_INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@given(_INT32)
def test_int_encoding_is_protobufs(value: int) -> None:
    assert (
        IntType.serializer().serialize(value)
        == types_pb2.IntWrapper(value=value).SerializeToString()
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
