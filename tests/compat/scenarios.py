"""Functions for the wire-compatibility tests, written against StateFun's public SDK API only.

This module imports nothing from the SDK but ``from statefun import *``, so it runs unchanged
with the official ``apache-flink-statefun`` package (in its own virtualenv) and with ours. The
test drives every function through ``peer_tool.py`` with typed request descriptions; what each
function does with a message is chosen by the message, so the requests stay short.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from statefun import *

functions = StatefulFunctions()

SINK = "compat/sink"
EGRESS = "compat.io/out"

JSON_TYPE = make_json_type("compat.types/json")
TIMESTAMP_TYPE = make_protobuf_type(Timestamp)

#: state name, type, keyword of message_builder (None: value=/value_type=)
TYPED = [
    ("i", IntType, "int_value"),
    ("l", LongType, "long_value"),
    ("f", FloatType, "float_value"),
    ("d", DoubleType, "double_value"),
    ("b", BoolType, "bool_value"),
    ("s", StringType, "str_value"),
    ("j", JSON_TYPE, None),
    ("p", TIMESTAMP_TYPE, None),
]

_AS = {
    "i": lambda m: m.as_int(),
    "l": lambda m: m.as_long(),
    "f": lambda m: m.as_float(),
    "d": lambda m: m.as_double(),
    "b": lambda m: m.as_bool(),
    "s": lambda m: m.as_string(),
}
_IS = {
    "i": lambda m: m.is_int(),
    "l": lambda m: m.is_long(),
    "f": lambda m: m.is_float(),
    "d": lambda m: m.is_double(),
    "b": lambda m: m.is_bool(),
    "s": lambda m: m.is_string(),
}


def _build(target_id: str, name: str, tpe: Any, keyword: str | None, value: Any) -> Any:
    if keyword is None:
        return message_builder(SINK, target_id, value=value, value_type=tpe)
    return message_builder(SINK, target_id, **{keyword: value})


@functions.bind(
    typename="compat/counter",
    specs=[ValueSpec(name="count", type=IntType)],
)
def counter(context: Context, message: Message) -> None:
    """count += the int message; the new count goes to compat/sink/<own id>."""
    count = (context.storage.count or 0) + message.as_int()
    context.storage.count = count
    context.send(message_builder(SINK, context.address.id, int_value=count))


@functions.bind(
    typename="compat/types",
    specs=[ValueSpec(name=name, type=tpe) for name, tpe, _ in TYPED],
)
def typed(context: Context, message: Message) -> None:
    """Stores a value of any of the eight types in its state; echoes the old and new value."""
    for name, tpe, keyword in TYPED:
        if not message.is_type(tpe):
            continue
        if name in _IS:
            assert _IS[name](message)
            value = _AS[name](message)
        else:
            value = message.as_type(tpe)
        old = getattr(context.storage, name)
        setattr(context.storage, name, value)
        context.send(_build(name, name, tpe, keyword, value))
        if old is not None:
            context.send(_build("old-" + name, name, tpe, keyword, old))
        context.send_egress(egress_message_builder(EGRESS, value, tpe))
        return
    raise ValueError(f"unexpected message type {message.value_typename()}")


@functions.bind(
    typename="compat/state",
    specs=[
        ValueSpec(name="a", type=StringType),
        ValueSpec(name="b", type=IntType),
        ValueSpec(name="c", type=JSON_TYPE),
    ],
)
def state(context: Context, message: Message) -> None:
    """Runs a JSON list of commands: ["set", name, value], ["del", name], ["get"]."""
    storage = context.storage
    for command in message.as_type(JSON_TYPE):
        if command[0] == "set":
            setattr(storage, command[1], command[2])
        elif command[0] == "del":
            delattr(storage, command[1])
        elif command[0] == "get":
            seen = [storage.a, storage.b, storage.c]
            context.send(message_builder(SINK, "get", value=seen, value_type=JSON_TYPE))
        else:
            raise ValueError(command)


@functions.bind(typename="compat/delayed")
def delayed(context: Context, message: Message) -> None:
    """JSON commands: ["after", ms, token-or-null, text], ["after-default", ms, text],
    ["cancel", token]."""
    for command in message.as_type(JSON_TYPE):
        if command[0] == "after":
            _, ms, token, text = command
            outgoing = message_builder(SINK, "delayed", str_value=text)
            context.send_after(timedelta(milliseconds=ms), outgoing, token)
        elif command[0] == "after-default":
            _, ms, text = command
            outgoing = message_builder(SINK, "delayed", str_value=text)
            context.send_after(timedelta(milliseconds=ms), outgoing)
        elif command[0] == "cancel":
            context.cancel_delayed_message(command[1])
        else:
            raise ValueError(command)


@functions.bind(typename="compat/egress")
def egress(context: Context, message: Message) -> None:
    """Sends a fixed set of egress records, selected by the string message."""
    which = message.as_string()
    if which == "kafka":
        context.send_egress(kafka_egress_message(typename=EGRESS, topic="t1", value="hello"))
        context.send_egress(
            kafka_egress_message(typename=EGRESS, topic="t2", value=b"\x00\xffraw", key="k1")
        )
        context.send_egress(
            kafka_egress_message(typename=EGRESS, topic="t3", value=bytearray(b"ba"))
        )
        context.send_egress(kafka_egress_message(typename=EGRESS, topic="t4", value=-2, key=""))
        context.send_egress(kafka_egress_message(typename=EGRESS, topic="t5", value=1.25))
        context.send_egress(
            kafka_egress_message(
                typename=EGRESS, topic="t6", value=7, value_type=IntType, key="ünï"
            )
        )
        context.send_egress(
            kafka_egress_message(
                typename=EGRESS, topic="t7", value={"x": [1, "y"]}, value_type=JSON_TYPE
            )
        )
        context.send_egress(kafka_egress_message(typename=EGRESS, topic="t8", value="é" * 100))
    elif which == "kinesis":
        context.send_egress(
            kinesis_egress_message(typename=EGRESS, stream="s1", value="v", partition_key="p")
        )
        context.send_egress(
            kinesis_egress_message(
                typename=EGRESS,
                stream="s2",
                value=b"\x01\x02",
                partition_key="",
                explicit_hash_key="123",
            )
        )
        context.send_egress(
            kinesis_egress_message(
                typename=EGRESS, stream="s3", value=3, partition_key="p", value_type=LongType
            )
        )
    elif which == "generic":
        context.send_egress(egress_message_builder(EGRESS, "text", StringType))
        context.send_egress(egress_message_builder("compat.io/other", 0, IntType))
        context.send_egress(
            egress_message_builder("a.b.c/d", Timestamp(seconds=1, nanos=2), TIMESTAMP_TYPE)
        )
    else:
        raise ValueError(which)


@functions.bind(typename="compat/forward")
def forward(context: Context, message: Message) -> None:
    """Passes the received typed value on as it is, and its raw bytes in a Kafka record."""
    context.send_egress(EgressMessage(EGRESS, message.typed_value))
    context.send(Message(SINK, "fwd", message.typed_value))
    raw = message.raw_value()
    if raw is not None:
        key = message.value_typename()
        context.send_egress(kafka_egress_message(typename=EGRESS, topic="fwd", value=raw, key=key))


@functions.bind(
    typename="compat/ttl",
    specs=[
        ValueSpec(name="plain", type=IntType),
        ValueSpec(name="after_call", type=StringType, expire_after_call=timedelta(seconds=30)),
        ValueSpec(
            name="after_write", type=LongType, expire_after_write=timedelta(milliseconds=1500)
        ),
        ValueSpec(
            name="odd", type=JSON_TYPE, expire_after_call=timedelta(minutes=1, microseconds=999)
        ),
    ],
)
def ttl(context: Context, message: Message) -> None:
    """Counts in "plain"; the other values are only read."""
    storage = context.storage
    storage.plain = (storage.plain or 0) + 1
    seen = [storage.after_call, storage.after_write, storage.odd]
    context.send(message_builder(SINK, "ttl", value=seen, value_type=JSON_TYPE))


@functions.bind(typename="compat/caller")
def caller(context: Context, message: Message) -> None:
    """Replies to its caller, or tells an egress that there was none."""
    me = context.address
    who = context.caller
    if who is None:
        text = f"{me.namespace}|{me.name}|{me.id}|{me.typename}: no caller"
        context.send_egress(kafka_egress_message(typename=EGRESS, topic="callers", value=text))
        return
    text = f"{who.namespace}|{who.name}|{who.id}|{who.typename} -> {me.typename}|{me.id}"
    context.send(message_builder(who.typename, who.id, str_value=text))


@functions.bind(
    typename="compat.async/counter",
    specs=[
        ValueSpec(name="count", type=LongType),
        ValueSpec(name="seen", type=JSON_TYPE, expire_after_write=timedelta(hours=1)),
    ],
)
async def async_counter(context: Context, message: Message) -> None:
    """Like compat/counter, but async, on LongType, and with a delayed message."""
    await asyncio.sleep(0)
    count = (context.storage.count or 0) + message.as_long()
    context.storage.count = count
    seen = context.storage.seen or []
    seen.append(count)
    context.storage.seen = seen
    await asyncio.sleep(0)
    context.send(message_builder(SINK, context.address.id, long_value=count))
    context.send_after(
        timedelta(seconds=1), message_builder(SINK, "later", long_value=count), f"tok-{count}"
    )


@functions.bind(typename="compat/silent", specs=[ValueSpec(name="v", type=StringType)])
def silent(context: Context, message: Message) -> None:
    """Reads its state and does nothing."""
    _ = context.storage.v


handler = RequestReplyHandler(functions)
