"""Fuzzing the SDK's request-reply handler: any bytes, and any well-formed ToFunction.

Whatever arrives, ``RequestReplyHandler`` answers with a FromFunction or raises one of the
project's own errors (a StatefunError: malformed request, unknown function, state of another
type); never another exception. The functions below only do what is valid for every input,
so an exception of another type is the SDK's fault. Bounded by the ``ci`` profile
(tests/_fuzz.py); docs/fuzzing.md has the longer run.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from statefun._exceptions import MalformedRequestError, StatefunError, ValueDecodeError
from statefun.sdk import (
    BoolType,
    Context,
    FloatType,
    IntType,
    LongType,
    Message,
    RequestReplyHandler,
    StatefulFunctions,
    StringType,
    ValueSpec,
    egress_message_builder,
    make_json_type,
    message_builder,
)
from statefun.sdk._proto import request_reply_pb2 as pb

JSON = make_json_type("fuzz/Json")
TYPES = (IntType, LongType, StringType, BoolType, FloatType, JSON)
TYPENAMES = [t.typename for t in TYPES] + ["fuzz/Other", "io.statefun.types/double"]
SPECS = [
    ValueSpec("count", IntType),
    ValueSpec("text", StringType),
    ValueSpec("doc", JSON),
    ValueSpec("flag", BoolType),
]


def make_handler() -> RequestReplyHandler:
    functions = StatefulFunctions()

    def body(context: Context, message: Message) -> None:
        storage = context.storage
        storage.count = (storage.count or 0) + 1
        if message.is_string() and message.as_string() is not None:
            storage.text = message.as_string()
        if message.is_type(JSON) and message.as_type(JSON) is not None:
            storage.doc = message.as_type(JSON)
        if message.is_bool():
            del storage.flag
        _ = storage.doc, storage.flag, storage.text
        caller = context.caller
        if caller is not None and caller.id:  # message_builder refuses an empty id
            context.send(message_builder(caller.typename, caller.id, int_value=storage.count))
        context.send_egress(egress_message_builder("fuzz/out", str(storage.count), StringType))

    @functions.bind("fuzz/sync", specs=SPECS)
    def sync(context: Context, message: Message) -> None:
        body(context, message)

    @functions.bind("fuzz/async", specs=SPECS)
    async def run_async(context: Context, message: Message) -> None:
        body(context, message)

    @functions.bind("fuzz/stateless")
    def stateless(context: Context, message: Message) -> None:
        if message.is_int() and context.address.id:
            context.send(message_builder("fuzz/sync", context.address.id, int_value=1))

    return RequestReplyHandler(functions)


HANDLER = make_handler()


def serialized(type_: object, value: object) -> bytes:
    return type_.serializer().serialize(value)  # type: ignore[attr-defined, no-any-return]


def typed_values(typename: str | None = None) -> st.SearchStrategy[pb.TypedValue]:
    """Typed values: valid encodings, or any bytes under a likely or any typename
    (``typename``, when given, is the likely one: the type a state's spec declares)."""
    valid = st.one_of(
        st.integers(-(2**31), 2**31 - 1).map(lambda v: (IntType.typename, serialized(IntType, v))),
        st.text(max_size=20).map(lambda v: (StringType.typename, serialized(StringType, v))),
        st.booleans().map(lambda v: (BoolType.typename, serialized(BoolType, v))),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3).map(
            lambda v: (JSON.typename, serialized(JSON, v))
        ),
    )
    likely = st.sampled_from(TYPENAMES) if typename is None else st.just(typename)
    arbitrary = st.tuples(
        st.one_of(likely, likely, st.sampled_from(TYPENAMES), st.text(max_size=30)),
        st.binary(max_size=40),
    )
    return st.builds(
        lambda pair, has_value: pb.TypedValue(
            typename=pair[0], has_value=has_value, value=pair[1] if has_value else b""
        ),
        st.one_of(valid, arbitrary, arbitrary),
        st.booleans(),
    )


addresses = st.builds(
    pb.Address,
    namespace=st.one_of(st.just("fuzz"), st.just("fuzz"), st.text(max_size=10)),
    type=st.one_of(st.sampled_from(["sync", "async", "stateless", "none"]), st.text(max_size=10)),
    id=st.text(max_size=20),
)


@st.composite
def to_function(draw: st.DrawFn) -> bytes:
    batch = pb.ToFunction.InvocationBatchRequest(target=draw(addresses))
    if draw(st.booleans()):  # every state the functions declare: past the handshake
        for spec in SPECS:
            state = batch.state.add(state_name=spec.name)
            if draw(st.booleans()):
                state.state_value.CopyFrom(draw(typed_values(spec.type.typename)))
    names = st.one_of(st.sampled_from([s.name for s in SPECS]), st.text(max_size=8))
    for name in draw(st.lists(names, max_size=4)):
        state = batch.state.add(state_name=name)
        if draw(st.booleans()):
            state.state_value.CopyFrom(draw(typed_values()))
    for _ in range(draw(st.integers(0, 5))):
        invocation = batch.invocations.add(argument=draw(typed_values()))
        if draw(st.booleans()):
            invocation.caller.CopyFrom(draw(addresses))
    return bytes(pb.ToFunction(invocation=batch).SerializeToString())


def answer_or_clean_error(request: bytes) -> None:
    for handle in (HANDLER.handle_sync, lambda r: asyncio.run(HANDLER.handle_async(r))):
        try:
            reply = handle(request)
        except StatefunError as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        assert isinstance(reply, bytes)
        pb.FromFunction.FromString(reply)  # a valid FromFunction


@given(st.binary(max_size=300))
@example(b"")
@example(b"\x0a\x00")
def test_arbitrary_bytes(request: bytes) -> None:
    answer_or_clean_error(request)


@given(to_function())
def test_well_formed_requests(request: bytes) -> None:
    answer_or_clean_error(request)


@given(to_function(), st.data())
def test_mutated_requests(request: bytes, data: st.DataObject) -> None:
    """A valid request with bytes flipped, cut or inserted somewhere."""
    if not request:
        return
    buffer = bytearray(request)
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(buffer) - 1)) if buffer else 0
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip" and buffer:
            buffer[where] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del buffer[where:]
        else:
            buffer[where:where] = data.draw(st.binary(min_size=1, max_size=4))
    answer_or_clean_error(bytes(buffer))


# -- what the fuzzer found (each failed before the fix) -----------------------------------


def test_a_batch_without_target_id_is_a_malformed_request() -> None:
    """Found by test_well_formed_requests: the SDK raised ValueError('target_id can not be
    missing') from inside while building the first Message."""
    request = b"\xa2\x06.\n\x11\n\x04fuzz\x12\tstateless\x1a\x19\x12\x17\n\x15io.statefun.types/int"
    with pytest.raises(MalformedRequestError, match="to 'fuzz/stateless' has no id"):
        HANDLER.handle_sync(request)


def test_state_bytes_that_do_not_decode_name_the_state() -> None:
    """Found by test_well_formed_requests: a stored int of corrupt bytes raised protobuf's
    DecodeError out of ``context.storage.count``."""
    batch = pb.ToFunction.InvocationBatchRequest(
        target=pb.Address(namespace="fuzz", type="sync", id="0")
    )
    for spec in SPECS:
        state = batch.state.add(state_name=spec.name)
        if spec.name == "count":
            state.state_value.CopyFrom(
                pb.TypedValue(typename=IntType.typename, has_value=True, value=b"\r\xfe\xff\xff")
            )
    batch.invocations.add(argument=pb.TypedValue(typename=IntType.typename))
    request = pb.ToFunction(invocation=batch).SerializeToString()
    with pytest.raises(ValueDecodeError, match="state 'count' of 'fuzz/sync' holds 4 bytes"):
        HANDLER.handle_sync(request)


def test_a_message_whose_bytes_do_not_decode_names_the_message() -> None:
    argument = pb.TypedValue(typename=JSON.typename, has_value=True, value=b"\xff{")
    with pytest.raises(ValueDecodeError, match="message to fuzz/sync/x is not a valid fuzz/Json"):
        Message("fuzz/sync", "x", argument).as_type(JSON)


def test_a_typename_with_a_newline_stays_on_one_line() -> None:
    """Found by the long run of test_well_formed_requests: the typename of a batch without an
    id went raw into the message."""
    with pytest.raises(MalformedRequestError) as caught:
        HANDLER.handle_sync(b"\xa2\x06\x0b\n\t\n\x04fuzz\x12\x01\n")
    assert str(caught.value) == "the invocation batch to 'fuzz/\\n' has no id"
