"""examples/greeter/functions.py: ordinals, and a reply to a caller (what `--call` waits for)."""

from __future__ import annotations

from examples.greeter.functions import functions, greeting, ordinal
from statefun import IntType, RequestReplyHandler, StringType
from statefun.sdk._proto import request_reply_pb2 as pb


def test_ordinals() -> None:
    expected = {
        1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 10: "10th", 11: "11th", 12: "12th", 13: "13th",
        14: "14th", 21: "21st", 22: "22nd", 23: "23rd", 101: "101st", 111: "111th",
        112: "112th", 113: "113th", 121: "121st",
    }  # fmt: skip
    assert {n: ordinal(n) for n in expected} == expected
    assert greeting("Ada", 1) == "Hello Ada! Nice to meet you."
    assert greeting("Ada", 22) == "Hello Ada for the 22nd time!"


def test_the_greeting_goes_back_to_the_caller() -> None:
    request = pb.ToFunction()
    batch = request.invocation
    batch.target.namespace, batch.target.type, batch.target.id = "example", "greeter", "Ada"
    batch.state.add(
        state_name="seen",
        state_value=pb.TypedValue(
            typename=IntType.typename, has_value=True, value=IntType.serializer().serialize(10)
        ),
    )
    invocation = batch.invocations.add()
    invocation.argument.typename = StringType.typename
    invocation.caller.namespace, invocation.caller.type = "pystatefun.http", "reply"
    invocation.caller.id = "r1"
    reply = pb.FromFunction.FromString(
        RequestReplyHandler(functions).handle_sync(request.SerializeToString())
    ).invocation_result
    (message,) = reply.outgoing_messages
    assert (message.target.namespace, message.target.type, message.target.id) == (
        "pystatefun.http",
        "reply",
        "r1",
    )
    assert StringType.serializer().deserialize(message.argument.value) == (
        "Hello Ada for the 11th time!"
    )
    assert len(reply.outgoing_egresses) == 1
