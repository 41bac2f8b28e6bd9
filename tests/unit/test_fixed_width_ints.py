"""IntType and LongType encoded and decoded inline (the storage properties, ``Message.as_int``,
``egress_message_builder``, the serializers): every path gives the generated wrapper
message's bytes and reads them back, and refuses what the wrapper cannot hold, at every value
the fast path takes and at its edges."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statefun.sdk import (
    IntType,
    LongType,
    Message,
    Type,
    TypedValue,
    ValueSpec,
    egress_message_builder,
)
from statefun.sdk._proto import types_pb2
from statefun.sdk._storage import make_storage_class

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
WRAPPERS: dict[Type, Any] = {IntType: types_pb2.IntWrapper, LongType: types_pb2.LongWrapper}
RANGES = {IntType: INT32, LongType: INT64}
Storage = {
    tpe: make_storage_class("t/fn", [ValueSpec(name="n", type=tpe)]) for tpe in (IntType, LongType)
}


def reference(tpe: Type, value: int) -> bytes:
    message = WRAPPERS[tpe]()
    message.value = value
    return bytes(message.SerializeToString())


def edges(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(low, high),
        st.sampled_from([low, low + 1, -1, 0, 1, 2, high - 1, high]),
    )


def check_value(tpe: Type, value: int) -> None:
    expected = reference(tpe, value)
    serializer = tpe.serializer()
    assert serializer.serialize(value) == expected
    back = serializer.deserialize(expected)
    assert back == value and type(back) is int
    # a storage write, then a fresh storage's read of those bytes
    storage = Storage[tpe]("t/fn", {})
    storage.n = value
    written = storage._values["n"]
    assert (written.typename, written.has_value, written.value) == (tpe.typename, True, expected)
    assert storage.n == value
    assert Storage[tpe]("t/fn", {"n": TypedValue(tpe.typename, expected)}).n == value
    # an egress record
    typed = egress_message_builder("t/out", value, tpe).typed_value
    assert (typed.typename, typed.has_value, typed.value) == (tpe.typename, True, expected)
    # a message's value
    message = Message("t/fn", "id", TypedValue(tpe.typename, expected))
    assert message.as_type(tpe) == value
    if tpe is IntType:
        read = message.as_int()
        assert read == value and type(read) is int


@given(value=edges(*INT32))
def test_int_values_on_every_path(value: int) -> None:
    check_value(IntType, value)


@given(value=edges(*INT64))
def test_long_values_on_every_path(value: int) -> None:
    check_value(LongType, value)


@pytest.mark.parametrize("tpe", [IntType, LongType])
@pytest.mark.parametrize("beyond", [-1, 1, 2**64])
def test_values_beyond_the_range_are_refused_on_every_path(tpe: Type, beyond: int) -> None:
    low, high = RANGES[tpe]
    value = high + beyond if beyond > 0 else low + beyond
    with pytest.raises(ValueError, match="does not fit"):
        tpe.serializer().serialize(value)
    storage = Storage[tpe]("t/fn", {})
    with pytest.raises(ValueError, match="does not fit"):
        storage.n = value
    assert not storage._dirty and storage.n is None  # nothing written
    with pytest.raises(ValueError, match="does not fit"):
        egress_message_builder("t/out", value, tpe)


@pytest.mark.parametrize("tpe", [IntType, LongType])
@pytest.mark.parametrize("value", [True, False, 1.0, "1"])
def test_values_of_other_python_types_are_refused_on_every_path(tpe: Type, value: Any) -> None:
    with pytest.raises(TypeError):
        tpe.serializer().serialize(value)
    with pytest.raises(TypeError):
        Storage[tpe]("t/fn", {}).n = value
    with pytest.raises(TypeError):
        egress_message_builder("t/out", value, tpe)


@pytest.mark.parametrize(
    ("tpe", "data"),
    [
        (IntType, b"\x0d\x01\x00\x00"),  # a tag and too few bytes
        (IntType, b"\x09\x01\x00\x00\x00"),  # five bytes, another tag
        (LongType, b"\x09\x01\x00\x00\x00\x00\x00\x00"),
        (LongType, b"\x0d\x01\x00\x00\x00\x00\x00\x00\x00"),
    ],
)
def test_bytes_the_fast_path_does_not_take_read_as_protobuf_reads_them(
    tpe: Type, data: bytes
) -> None:
    """Bytes of the fast path's length with another tag, or with the tag and another length,
    go to the general decoder, which reads them as the generated code does (or refuses them
    as it does)."""
    try:
        expected: Any = WRAPPERS[tpe].FromString(data).value
    except Exception as exc:  # (the generated code refuses them: so must every path)
        expected = type(exc)
    got: Any
    try:
        got = tpe.serializer().deserialize(data)
    except Exception as exc:
        got = type(exc)
    assert got == expected
    if tpe is IntType:
        try:
            got = Message("t/fn", "id", TypedValue(tpe.typename, data)).as_int()
        except Exception as exc:
            got = exc
        if isinstance(expected, type):
            assert isinstance(got, Exception)
        else:
            assert got == expected
