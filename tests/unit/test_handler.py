"""RequestReplyHandler: ToFunction bytes in, FromFunction bytes out (request-reply protocol v3)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from statefun._exceptions import MalformedRequestError, ProtocolError, UnknownFunctionError
from statefun.sdk import (
    Context,
    IntType,
    LongType,
    Message,
    RequestReplyHandler,
    SdkAddress,
    StatefulFunctions,
    StringType,
    Type,
    ValueSpec,
    egress_message_builder,
    kafka_egress_message,
    make_json_type,
    message_builder,
)
from statefun.sdk._proto import egress_pb2
from statefun.sdk._proto import request_reply_pb2 as pb

Expire = pb.FromFunction.ExpirationSpec
Mutation = pb.FromFunction.PersistedValueMutation
JSON = make_json_type("com.example/Json")


def typed(tpe: Type, value: Any) -> pb.TypedValue:
    if value is None:
        return pb.TypedValue(typename=tpe.typename, has_value=False)
    return pb.TypedValue(
        typename=tpe.typename, has_value=True, value=tpe.serializer().serialize(value)
    )


def request(
    typename: str,
    id_: str,
    args: list[pb.TypedValue],
    state: dict[str, pb.TypedValue] | None = None,
    callers: list[pb.Address | None] | None = None,
) -> bytes:
    namespace, _, name = typename.rpartition("/")
    batch = pb.ToFunction.InvocationBatchRequest(
        target=pb.Address(namespace=namespace, type=name, id=id_)
    )
    for state_name, value in (state or {}).items():
        batch.state.add(state_name=state_name, state_value=value)
    for i, arg in enumerate(args):
        invocation = batch.invocations.add(argument=arg)
        caller = callers[i] if callers else None
        if caller is not None:
            invocation.caller.CopyFrom(caller)
    return bytes(pb.ToFunction(invocation=batch).SerializeToString())


def result(response: bytes) -> pb.FromFunction.InvocationResponse:
    from_function = pb.FromFunction.FromString(response)
    if response == b"":  # no effect at all: an empty FromFunction, as StateFun's SDK sends
        assert from_function.WhichOneof("response") is None
    else:
        assert from_function.WhichOneof("response") == "invocation_result"
    return from_function.invocation_result


def missing(response: bytes) -> list[tuple[str, str, int, int]]:
    from_function = pb.FromFunction.FromString(response)
    assert from_function.WhichOneof("response") == "incomplete_invocation_context"
    return [
        (
            v.state_name,
            v.type_typename,
            v.expiration_spec.mode,
            v.expiration_spec.expire_after_millis,
        )
        for v in from_function.incomplete_invocation_context.missing_values
    ]


def mutations(res: pb.FromFunction.InvocationResponse) -> list[tuple[int, str, pb.TypedValue]]:
    return [(m.mutation_type, m.state_name, m.state_value) for m in res.state_mutations]


# ---------------------------------------------------------------------------------- a counter

SPECS = [ValueSpec("seen", IntType), ValueSpec("names", JSON)]


def counter(context: Context, message: Message) -> None:
    seen = (context.storage.seen or 0) + 1
    context.storage.seen = seen
    names = context.storage.names or []
    names.append(message.as_string())
    context.storage.names = names
    caller = context.caller
    context.send(
        message_builder(
            "com.example/log", f"{context.address.id}-{seen}", str_value=message.as_string()
        )
    )
    if caller is not None:
        context.send(message_builder(caller.typename, caller.id, int_value=seen))


async def async_counter(context: Context, message: Message) -> None:
    await asyncio.sleep(0)
    counter(context, message)


def handler_for(
    fun: Any, specs: list[ValueSpec] | None = SPECS, typename: str = "com.example/counter"
) -> RequestReplyHandler:
    functions = StatefulFunctions()
    functions.register(typename, fun, specs)
    return RequestReplyHandler(functions)


STRINGS = ["a", "b", "c", "d", "e"]
FULL_STATE = {"seen": typed(IntType, 10), "names": typed(JSON, None)}


def check_counter_batch(response: bytes) -> None:
    res = result(response)
    assert mutations(res) == [
        (Mutation.MODIFY, "seen", typed(IntType, 15)),
        (Mutation.MODIFY, "names", typed(JSON, STRINGS)),
    ]
    assert [
        (m.target.namespace, m.target.type, m.target.id, m.argument) for m in res.outgoing_messages
    ] == [
        ("com.example", "log", f"u1-{11 + i}", typed(StringType, s)) for i, s in enumerate(STRINGS)
    ]
    assert list(res.delayed_invocations) == []
    assert list(res.outgoing_egresses) == []


def test_batch_runs_in_order_with_state_carried_across() -> None:
    handler = handler_for(counter)
    req = request("com.example/counter", "u1", [typed(StringType, s) for s in STRINGS], FULL_STATE)
    check_counter_batch(handler.handle_sync(req))


def test_handle_sync_of_an_async_function() -> None:
    handler = handler_for(async_counter)
    req = request("com.example/counter", "u1", [typed(StringType, s) for s in STRINGS], FULL_STATE)
    check_counter_batch(handler.handle_sync(req))


async def test_handle_async_of_sync_and_async_functions() -> None:
    for fun in (counter, async_counter):
        handler = handler_for(fun)
        req = request(
            "com.example/counter", "u1", [typed(StringType, s) for s in STRINGS], FULL_STATE
        )
        check_counter_batch(await handler.handle_async(req))
        # a bytearray / memoryview body works too
        check_counter_batch(await handler.handle_async(bytearray(req)))
        check_counter_batch(await handler.handle_async(memoryview(req)))


class AsyncCounter:
    async def __call__(self, context: Context, message: Message) -> None:
        await async_counter(context, message)


async def test_an_object_with_an_async_call_is_awaited() -> None:
    handler = handler_for(AsyncCounter())
    req = request("com.example/counter", "u1", [typed(StringType, s) for s in STRINGS], FULL_STATE)
    check_counter_batch(await handler.handle_async(req))


def test_an_object_with_an_async_call_is_awaited_by_handle_sync() -> None:
    handler = handler_for(AsyncCounter())
    req = request("com.example/counter", "u1", [typed(StringType, s) for s in STRINGS], FULL_STATE)
    check_counter_batch(handler.handle_sync(req))


def test_callers_per_invocation() -> None:
    handler = handler_for(counter)
    callers = [
        pb.Address(namespace="org.x", type="sender", id="s1"),
        None,
        pb.Address(namespace="org.y", type="other", id="s2"),
    ]
    req = request(
        "com.example/counter", "u1", [typed(StringType, s) for s in "xyz"], FULL_STATE, callers
    )
    res = result(handler.handle_sync(req))
    got = [
        (m.target.namespace, m.target.type, m.target.id, m.argument) for m in res.outgoing_messages
    ]
    assert got == [
        ("com.example", "log", "u1-11", typed(StringType, "x")),
        ("org.x", "sender", "s1", typed(IntType, 11)),
        ("com.example", "log", "u1-12", typed(StringType, "y")),
        ("com.example", "log", "u1-13", typed(StringType, "z")),
        ("org.y", "other", "s2", typed(IntType, 13)),
    ]


def test_caller_and_address_seen_by_the_function() -> None:
    seen: list[tuple[SdkAddress, SdkAddress | None, str, str]] = []

    def fn(context: Context, message: Message) -> None:
        seen.append((context.address, context.caller, message.target_typename, message.target_id))

    handler = handler_for(fn, None, "com.example/fn")
    callers = [None, pb.Address(namespace="a", type="b", id="c")]
    handler.handle_sync(
        request("com.example/fn", "me", [typed(IntType, 1), typed(IntType, 2)], None, callers)
    )
    me = SdkAddress("com.example", "fn", "me", "com.example/fn")
    assert seen == [
        (me, None, "com.example/fn", "me"),
        (me, SdkAddress("a", "b", "c", "a/b"), "com.example/fn", "me"),
    ]


def test_message_argument_reaches_the_function() -> None:
    got: list[Any] = []

    def fn(context: Context, message: Message) -> None:
        got.append(
            (message.value_typename(), message.is_long(), message.as_long(), message.raw_value())
        )

    handler = handler_for(fn, None, "a/b")
    handler.handle_sync(request("a/b", "1", [typed(LongType, -5), typed(LongType, None)]))
    assert got == [
        ("io.statefun.types/long", True, -5, LongType.serializer().serialize(-5)),
        ("io.statefun.types/long", True, None, None),
    ]


def test_no_invocations_and_no_writes_give_an_empty_result() -> None:
    handler = handler_for(counter)
    response = handler.handle_sync(request("com.example/counter", "u1", [], FULL_STATE))
    assert response == b""
    assert result(response) == pb.FromFunction.InvocationResponse()


def test_reads_only_report_no_mutations() -> None:
    def reader(context: Context, message: Message) -> None:
        assert context.storage.seen == 10
        assert context.storage.names == ["x"]

    handler = handler_for(reader)
    state = {"seen": typed(IntType, 10), "names": typed(JSON, ["x"])}
    res = result(
        handler.handle_sync(request("com.example/counter", "u", [typed(IntType, 0)] * 3, state))
    )
    assert list(res.state_mutations) == []


def test_delete_and_modify() -> None:
    def fn(context: Context, message: Message) -> None:
        if message.as_int() == 1:
            context.storage.names = ["tmp"]
            del context.storage.seen
        else:
            del context.storage.names

    handler = handler_for(fn)
    state = {"seen": typed(IntType, 3), "names": typed(JSON, ["x"])}
    res = result(
        handler.handle_sync(
            request("com.example/counter", "u", [typed(IntType, 1), typed(IntType, 2)], state)
        )
    )
    # in the order of the ValueSpecs, not of the writes (as StateFun's SDK)
    assert mutations(res) == [
        (Mutation.DELETE, "seen", pb.TypedValue()),
        (Mutation.DELETE, "names", pb.TypedValue()),
    ]
    assert all(not m.HasField("state_value") for m in res.state_mutations)


def test_state_the_function_does_not_declare_is_ignored() -> None:
    def fn(context: Context, message: Message) -> None:
        context.storage.seen = 1

    handler = handler_for(fn)
    state = {**FULL_STATE, "legacy": typed(StringType, "old")}
    res = result(
        handler.handle_sync(request("com.example/counter", "u", [typed(IntType, 0)], state))
    )
    assert mutations(res) == [(Mutation.MODIFY, "seen", typed(IntType, 1))]


def test_outgoing_in_order() -> None:
    def fn(context: Context, message: Message) -> None:
        n = message.as_int()
        context.send(message_builder("a/one", f"m{n}", int_value=n))
        context.send_after(timedelta(seconds=n), message_builder("a/two", f"d{n}", int_value=n))
        context.send_after(
            timedelta(milliseconds=1500), message_builder("a/two", "t", int_value=n), f"tok{n}"
        )
        context.cancel_delayed_message(f"old{n}")
        context.send_egress(kafka_egress_message("io.example/kafka", "topic", f"e{n}", key=f"k{n}"))
        context.send_egress(egress_message_builder("io.example/generic", n, IntType))

    handler = handler_for(fn, None, "a/fn")
    res = result(handler.handle_sync(request("a/fn", "1", [typed(IntType, 1), typed(IntType, 2)])))
    assert list(res.state_mutations) == []
    assert [(m.target.type, m.target.id, m.argument) for m in res.outgoing_messages] == [
        ("one", "m1", typed(IntType, 1)),
        ("one", "m2", typed(IntType, 2)),
    ]
    delayed = [
        (
            d.delay_in_ms,
            d.target.namespace,
            d.target.type,
            d.target.id,
            d.argument,
            d.is_cancellation_request,
            d.cancellation_token,
        )
        for d in res.delayed_invocations
    ]
    empty = pb.TypedValue()
    assert delayed == [
        (1000, "a", "two", "d1", typed(IntType, 1), False, ""),
        (1500, "a", "two", "t", typed(IntType, 1), False, "tok1"),
        (0, "", "", "", empty, True, "old1"),
        (2000, "a", "two", "d2", typed(IntType, 2), False, ""),
        (1500, "a", "two", "t", typed(IntType, 2), False, "tok2"),
        (0, "", "", "", empty, True, "old2"),
    ]
    assert not res.delayed_invocations[2].HasField("target")
    egress = [
        (e.egress_namespace, e.egress_type, e.argument.typename) for e in res.outgoing_egresses
    ]
    assert (
        egress
        == [
            (
                "io.example",
                "kafka",
                "type.googleapis.com/io.statefun.sdk.egress.KafkaProducerRecord",
            ),
            ("io.example", "generic", "io.statefun.types/int"),
        ]
        * 2
    )
    records = [
        egress_pb2.KafkaProducerRecord.FromString(e.argument.value)
        for e in res.outgoing_egresses
        if e.egress_type == "kafka"
    ]
    assert [(r.topic, r.key, r.value_bytes) for r in records] == [
        ("topic", "k1", b"e1"),
        ("topic", "k2", b"e2"),
    ]
    assert res.outgoing_egresses[1].argument == typed(IntType, 1)
    assert res.outgoing_egresses[3].argument == typed(IntType, 2)


def test_large_values_and_unicode_survive() -> None:
    big = "ü" * 5000

    def fn(context: Context, message: Message) -> None:
        context.storage.names = [message.as_string()]
        context.send(message_builder("a/b", "日本", str_value=message.as_string()))

    handler = handler_for(fn)
    res = result(
        handler.handle_sync(
            request("com.example/counter", "ïd", [typed(StringType, big)], FULL_STATE)
        )
    )
    assert mutations(res) == [(Mutation.MODIFY, "names", typed(JSON, [big]))]
    assert res.outgoing_messages[0].target.id == "日本"
    assert res.outgoing_messages[0].argument == typed(StringType, big)


# ---------------------------------------------------------------------------------- missing state


def test_incomplete_invocation_context() -> None:
    specs = [
        ValueSpec("zeta", IntType),
        ValueSpec("alpha", StringType, expire_after_write=timedelta(seconds=30)),
        ValueSpec("present", IntType),
        ValueSpec("mid", JSON, expire_after_call=timedelta(minutes=1, milliseconds=1)),
    ]
    calls: list[Any] = []
    handler = handler_for(lambda c, m: calls.append(m), specs, "a/b")
    response = handler.handle_sync(
        request("a/b", "1", [typed(IntType, 1)], {"present": typed(IntType, None)})
    )
    assert missing(response) == [
        ("zeta", "io.statefun.types/int", Expire.NONE, 0),
        ("alpha", "io.statefun.types/string", Expire.AFTER_WRITE, 30_000),
        ("mid", "com.example/Json", Expire.AFTER_INVOKE, 60_001),
    ]
    assert calls == []  # the function is not called
    spec = pb.FromFunction.FromString(response).incomplete_invocation_context.missing_values[0]
    assert spec.HasField("expiration_spec")


async def test_incomplete_invocation_context_async() -> None:
    handler = handler_for(async_counter)
    response = await handler.handle_async(
        request("com.example/counter", "1", [typed(StringType, "x")], {"names": typed(JSON, None)})
    )
    assert missing(response) == [("seen", "io.statefun.types/int", Expire.NONE, 0)]
    response = handler.handle_sync(request("com.example/counter", "1", [typed(StringType, "x")]))
    assert missing(response) == [
        ("seen", "io.statefun.types/int", Expire.NONE, 0),
        ("names", "com.example/Json", Expire.NONE, 0),
    ]


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xff\xff",
        b"\xa2\x06\x05ab",  # truncated invocation field
        b"\x0a",
        "a str body",
    ],
)
async def test_garbled_bytes(body: Any) -> None:
    handler = handler_for(counter)
    with pytest.raises(MalformedRequestError, match="not a ToFunction message") as info:
        handler.handle_sync(body)
    assert isinstance(info.value, ProtocolError) and isinstance(info.value, ValueError)
    with pytest.raises(MalformedRequestError):
        await handler.handle_async(body)


async def test_to_function_without_invocation() -> None:
    handler = handler_for(counter)
    for body in (b"", pb.ToFunction().SerializeToString()):
        with pytest.raises(MalformedRequestError, match="no invocation batch"):
            handler.handle_sync(body)
        with pytest.raises(MalformedRequestError, match="no invocation batch"):
            await handler.handle_async(body)


@pytest.mark.parametrize(
    "target",
    [
        None,
        pb.Address(),
        pb.Address(id="1"),
        pb.Address(namespace="com.example", id="1"),
        pb.Address(type="counter", id="1"),
    ],
)
def test_no_target(target: pb.Address | None) -> None:
    handler = handler_for(counter)
    batch = pb.ToFunction.InvocationBatchRequest()
    if target is not None:
        batch.target.CopyFrom(target)
    batch.invocations.add(argument=typed(StringType, "x"))
    body = pb.ToFunction(invocation=batch).SerializeToString()
    with pytest.raises(MalformedRequestError, match="no target function type"):
        handler.handle_sync(body)


async def test_unknown_function_type() -> None:
    handler = handler_for(counter)
    body = request("com.example/nobody", "1", [typed(StringType, "x")])
    with pytest.raises(UnknownFunctionError) as info:
        handler.handle_sync(body)
    assert isinstance(info.value, LookupError)
    assert info.value.typename == "com.example/nobody"
    assert "registered: com.example/counter" in str(info.value)
    with pytest.raises(UnknownFunctionError):
        await handler.handle_async(body)


class Boom(Exception):
    pass


def failing_sync(context: Context, message: Message) -> None:
    context.storage.seen = 1
    raise Boom(f"failed on {message.as_string()}")


async def failing_async(context: Context, message: Message) -> None:
    await asyncio.sleep(0)
    raise Boom(f"async failure on {message.as_string()}")


FAILING_BODY = request("com.example/counter", "1", [typed(StringType, "x")], FULL_STATE)


def test_exceptions_in_the_function_propagate_sync() -> None:
    with pytest.raises(Boom, match=r"^failed on x$"):
        handler_for(failing_sync).handle_sync(FAILING_BODY)
    with pytest.raises(Boom, match=r"^async failure on x$"):
        handler_for(failing_async).handle_sync(FAILING_BODY)


async def test_exceptions_in_the_function_propagate_async() -> None:
    with pytest.raises(Boom, match=r"^failed on x$"):
        await handler_for(failing_sync).handle_async(FAILING_BODY)
    with pytest.raises(Boom, match=r"^async failure on x$"):
        await handler_for(failing_async).handle_async(FAILING_BODY)


def test_a_later_invocation_failing_fails_the_batch() -> None:
    def fn(context: Context, message: Message) -> None:
        if message.as_int() == 3:
            raise Boom("third")
        context.storage.seen = message.as_int()

    body = request("com.example/counter", "1", [typed(IntType, i) for i in (1, 2, 3)], FULL_STATE)
    with pytest.raises(Boom, match="third"):
        handler_for(fn).handle_sync(body)


def test_state_type_mismatch_propagates() -> None:
    handler = handler_for(counter)
    state = {"seen": typed(StringType, "ten"), "names": typed(JSON, None)}
    with pytest.raises(TypeError, match="'seen'"):
        handler.handle_sync(request("com.example/counter", "1", [typed(StringType, "x")], state))


def test_handler_needs_functions() -> None:
    with pytest.raises(ValueError):
        RequestReplyHandler(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RequestReplyHandler({"a/b": counter})  # type: ignore[arg-type]
    functions = StatefulFunctions()
    assert RequestReplyHandler(functions).functions is functions


def test_each_request_starts_fresh() -> None:
    handler = handler_for(counter)
    for _ in range(3):
        res = result(
            handler.handle_sync(
                request("com.example/counter", "u1", [typed(StringType, "a")], FULL_STATE)
            )
        )
        assert mutations(res) == [
            (Mutation.MODIFY, "seen", typed(IntType, 11)),
            (Mutation.MODIFY, "names", typed(JSON, ["a"])),
        ]
        assert len(res.outgoing_messages) == 1


def test_long_fields_and_large_delays() -> None:
    # lengths of 128 bytes and more need multi-byte varints; so do delays of 128 ms and more
    ns, name, id_ = "n" * 130, "t" * 200, "i" * 300
    token, state_name = "k" * 129, "s" * 140
    egress_ns = "e" * 128
    specs = [ValueSpec(state_name, StringType)]

    def fn(context: Context, message: Message) -> None:
        setattr(context.storage, state_name, "v" * 1000)
        target = f"{ns}/{name}"
        context.send(message_builder(target, id_, str_value="x" * 128))
        context.send_after(timedelta(days=30), message_builder(target, id_, int_value=1), token)
        context.send_after(timedelta(milliseconds=128), message_builder(target, id_, int_value=2))
        context.cancel_delayed_message(token)
        context.send_egress(egress_message_builder(f"{egress_ns}/out", "y" * 5000, StringType))

    handler = handler_for(fn, specs, f"{ns}/{name}")
    state = {state_name: typed(StringType, None)}
    res = result(handler.handle_sync(request(f"{ns}/{name}", id_, [typed(IntType, 1)], state)))
    assert mutations(res) == [(Mutation.MODIFY, state_name, typed(StringType, "v" * 1000))]
    out = res.outgoing_messages[0]
    assert (out.target.namespace, out.target.type, out.target.id) == (ns, name, id_)
    assert out.argument == typed(StringType, "x" * 128)
    d = res.delayed_invocations
    assert (d[0].delay_in_ms, d[0].cancellation_token, d[0].argument) == (
        30 * 86_400_000,
        token,
        typed(IntType, 1),
    )
    assert (d[1].delay_in_ms, d[1].cancellation_token) == (128, "")
    assert (d[2].is_cancellation_request, d[2].cancellation_token) == (True, token)
    e = res.outgoing_egresses[0]
    assert (e.egress_namespace, e.egress_type, e.argument) == (
        egress_ns,
        "out",
        typed(StringType, "y" * 5000),
    )
