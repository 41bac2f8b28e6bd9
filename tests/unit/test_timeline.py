"""The per-address timeline: bounded rings per address, the least recently invoked address
dropped first, and the entries formatted as the admin port shows them (embedded outputs, a
remote function's result, errors, long values cut to a preview)."""

from __future__ import annotations

from time import perf_counter

from statefun.runtime._envelope import Envelope
from statefun.runtime._timeline import PREVIEW, Timeline
from statefun.sdk import IntType, StringType
from statefun.sdk._context import DelayedMessage
from statefun.sdk._messages import Message
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import TypedValue, to_typed_value

CALLER = SdkAddress("shop", "checkout", "c1", "shop/checkout")


def envelope(id_: str, text: str = "apple") -> Envelope:
    return Envelope("shop/cart", id_, to_typed_value(StringType, text), CALLER)


def test_rings_and_addresses_are_bounded() -> None:
    timeline = Timeline(per_address=3, addresses=2)
    for n in range(5):
        timeline.record(("shop/cart", "a"), envelope("a", f"item{n}"), perf_counter())
    shown = [e["messages_in"][0]["preview"] for e in timeline.entries(("shop/cart", "a"))]
    assert shown == ["item2", "item3", "item4"]  # the last 3, oldest first
    timeline.record(("shop/cart", "b"), envelope("b"), perf_counter())
    timeline.record(("shop/cart", "a"), envelope("a", "again"), perf_counter())  # a: recent
    timeline.record(("shop/cart", "c"), envelope("c"), perf_counter())  # drops b
    assert len(timeline) == 2
    assert timeline.entries(("shop/cart", "b")) == []
    assert len(timeline.entries(("shop/cart", "a"))) == 3
    assert len(timeline.entries(("shop/cart", "c"))) == 1  # a reused ring starts empty


def test_embedded_invocation_is_shown_whole() -> None:
    timeline = Timeline(5, 5)
    values = {"count": to_typed_value(IntType, 4), "gone": None}
    timeline.record(
        ("shop/cart", "a"),
        envelope("a"),
        perf_counter(),
        values,
        ["count", "gone"],
        [Message("shop/audit", "a", to_typed_value(StringType, "x" * 100))],
        [DelayedMessage(500, None, "t1")],
        [("shop/out", [TypedValue("shop/record", b"12345")])],
    )
    (entry,) = timeline.entries(("shop/cart", "a"))
    assert entry["messages_in"] == [
        {
            "caller": "shop/checkout/c1",
            "typename": "io.statefun.types/string",
            "size": 7,
            "preview": "apple",
            "encoding": "builtin",
        }
    ]
    assert entry["state"][0]["value"]["preview"] == 4 and not entry["state"][0]["deleted"]
    assert entry["state"][1] == {"name": "gone", "value": None, "deleted": True}
    out = entry["messages_out"][0]
    assert out["target"] == "shop/audit/a" and out["size"] == 102
    assert out["encoding"] == "text" and len(out["preview"]) == PREVIEW + 3  # cut, with "..."
    assert entry["delayed"] == [{"target": None, "delay_ms": 500, "cancellation_token": "t1"}]
    assert entry["egress"] == [{"egress": "shop/out", "records": 1, "bytes": 5}]
    assert entry["error"] is None and entry["duration_ms"] >= 0
    assert entry["at_ms"] > 1_600_000_000_000


def test_remote_result_and_errors() -> None:
    timeline = Timeline(5, 5)
    result = pb.FromFunction.InvocationResponse()
    message = result.outgoing_messages.add()
    message.target.namespace, message.target.type, message.target.id = "shop", "audit", "z"
    message.argument.typename = "io.statefun.types/int"
    message.argument.has_value = True
    message.argument.value = to_typed_value(IntType, 9).value or b""
    delayed = result.delayed_invocations.add()
    delayed.target.namespace, delayed.target.type, delayed.target.id = "shop", "cart", "z"
    delayed.delay_in_ms = 1000
    delayed.argument.typename = "io.statefun.types/string"
    egress = result.outgoing_egresses.add()
    egress.egress_namespace, egress.egress_type = "shop", "out"
    egress.argument.value = b"abc"
    batch = [envelope("z"), envelope("z", "pear")]
    timeline.record(("shop/cart", "z"), batch, perf_counter(), {}, [], result=result)
    timeline.record(("shop/cart", "z"), batch, perf_counter(), error=ValueError("bad\nthing"))
    first, failed = timeline.entries(("shop/cart", "z"))
    assert first["messages_in_count"] == 2
    assert first["messages_out"][0]["target"] == "shop/audit/z"
    assert first["messages_out"][0]["preview"] == 9
    assert first["delayed"][0]["target"] == "shop/cart/z"
    assert first["delayed"][0]["delay_ms"] == 1000
    assert first["egress"] == [{"egress": "shop/out", "records": 1, "bytes": 3}]
    assert failed["error"] == "ValueError: bad\nthing"
    assert failed["messages_out"] == []


def test_kept_only_while_the_admin_server_runs() -> None:
    from statefun._settings import Settings
    from statefun.module._specs import ModuleSpec
    from statefun.runtime._job import Job

    assert Job(ModuleSpec(), Settings()).timeline is None  # no admin server: nobody reads it
    kept = Job(ModuleSpec(), Settings(admin_port=8091, timeline_addresses=7)).timeline
    assert kept is not None and (kept.per_address, kept.addresses) == (50, 7)
    assert Job(ModuleSpec(), Settings(admin_port=8091, timeline_invocations=0)).timeline is None
