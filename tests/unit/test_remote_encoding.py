"""The runtime's ToFunction encoder (statefun.runtime._remote): what protobuf reads from it, and
the same bytes whether invocations were encoded ahead (while waiting in a mailbox) or not."""

from __future__ import annotations

from statefun.runtime._envelope import Envelope
from statefun.runtime._remote import (
    encode_to_function,
    ingress_encoding,
    ingress_invocation,
    invocation,
)
from statefun.sdk import TypedValue
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._spec import SdkAddress
from statefun.sdk._wire import varint

FN = "com.example/counter"


def envelopes() -> list[Envelope]:
    caller = SdkAddress("org.x", "sender", "s-1", "org.x/sender")
    return [
        Envelope(FN, "k", TypedValue("io.statefun.types/int", b"\x08\x01"), None),
        Envelope(FN, "k", TypedValue("com.example/blob", b"x" * 300), caller),
        Envelope(FN, "k", TypedValue("com.example/empty", None), None),
    ]


def test_what_protobuf_reads() -> None:
    states = [("seen", "io.statefun.types/int", TypedValue("io.statefun.types/int", b"\x08\x07"))]
    states.append(("never", "io.statefun.types/string", None))
    request = pb.ToFunction.FromString(encode_to_function(FN, "k", states, envelopes()))
    batch = request.invocation
    assert (batch.target.namespace, batch.target.type, batch.target.id) == (
        "com.example",
        "counter",
        "k",
    )
    assert [(s.state_name, s.state_value.has_value) for s in batch.state] == [
        ("seen", True),
        ("never", False),
    ]
    args = [
        (i.argument.typename, i.argument.has_value, i.argument.value) for i in batch.invocations
    ]
    assert args == [
        ("io.statefun.types/int", True, b"\x08\x01"),
        ("com.example/blob", True, b"x" * 300),
        ("com.example/empty", False, b""),
    ]
    assert batch.invocations[1].caller.id == "s-1"
    assert not batch.invocations[0].HasField("caller")


def test_encoded_ahead_or_not_the_same_bytes() -> None:
    late = envelopes()
    ahead = envelopes()
    for envelope in ahead[1:]:
        envelope.wire = invocation(envelope)
    assert encode_to_function(FN, "k", [], ahead) == encode_to_function(FN, "k", [], late)


def test_invocation_is_what_protobuf_writes_at_every_length() -> None:
    """The one-byte-length fast path and the general one, around where they meet (an
    Invocation of 127 bytes) and for every kind of value and sender."""
    caller = SdkAddress("org.x", "sender", "s-1", "org.x/sender")
    for typename in ("a/b", "com.example/" + "t" * 40):
        for size in [*range(0, 140), 300, 20_000]:
            for sender in (None, caller):
                for has_value in (True, False):
                    value = (bytes(range(256)) * (1 + size // 256))[:size] if has_value else b""
                    typed = TypedValue(typename, value if has_value else None)
                    expected = pb.ToFunction.Invocation(
                        argument=pb.TypedValue(typename=typename, has_value=has_value, value=value)
                    )
                    if sender is not None:
                        expected.caller.namespace, expected.caller.type = "org.x", "sender"
                        expected.caller.id = "s-1"
                    body = expected.SerializeToString()
                    got = invocation(Envelope(FN, "k", typed, sender))
                    assert pb.ToFunction.InvocationBatchRequest.FromString(got).invocations == [
                        expected
                    ]
                    assert got == b"\x1a" + varint(len(body)) + body, (typename, size, sender)


def test_a_runs_encoder_gives_the_bytes_of_ingress_invocation() -> None:
    """The encoder of a run of one type (``ingress_encoding``: one concatenation per value)
    against the general one: at every length around the one-byte limit, without a value,
    empty, and for values of another type, for short and long typenames (whose head leaves no
    fast path)."""
    for typename in ("a/b", "com.example/" + "t" * 40, "com.example/" + "t" * 130):
        encoding = ingress_encoding(typename)
        assert ingress_encoding(typename) is encoding  # made once per type
        encode = encoding.encode
        for size in [*range(0, 140), 300, 20_000]:
            value = (bytes(range(256)) * (1 + size // 256))[:size]
            for typed in (
                TypedValue(typename, value),
                TypedValue("other/type", value),
                TypedValue(typename, None),
                pb.TypedValue(typename=typename, has_value=True, value=value),
            ):
                assert encode(typed) == ingress_invocation(typed), (typename, size, typed)
                reread = pb.ToFunction.InvocationBatchRequest.FromString(encode(typed))
                assert reread.invocations[0].argument.value == typed.value
