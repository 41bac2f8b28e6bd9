"""The per-address timeline: addresses recorded from their first lookup on (bounded per
address and in number), the job's optional ring of every invocation, and the entries
formatted as the admin port shows them (embedded outputs read from the invocation's context,
a remote function's result, errors, long values cut to a preview)."""

from __future__ import annotations

import asyncio
import time
from time import perf_counter

import pytest

from statefun.runtime._envelope import Envelope
from statefun.runtime._timeline import FAILURES, IDLE_S, PREVIEW, SCAN_SLICE, Timeline
from statefun.sdk import IntType, StringType, ValueSpec, egress_message_builder
from statefun.sdk._context import InvocationContext
from statefun.sdk._messages import message_builder
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._spec import SdkAddress
from statefun.sdk._storage import make_storage_class
from statefun.sdk._types import to_typed_value

CALLER = SdkAddress("shop", "checkout", "c1", "shop/checkout")
CART = make_storage_class("shop/cart", [ValueSpec("count", IntType), ValueSpec("gone", StringType)])


def envelope(id_: str, text: str = "apple") -> Envelope:
    return Envelope("shop/cart", id_, to_typed_value(StringType, text), CALLER)


def context(id_: str, values: dict[str, object] | None = None) -> InvocationContext:
    return InvocationContext(
        SdkAddress("shop", "cart", id_, "shop/cart"), CART("shop/cart", values or {})
    )


def record(timeline: Timeline, id_: str, text: str) -> None:
    key = ("shop/cart", id_)
    timeline.record(key, perf_counter(), envelope(id_, text), context(id_))


def previews(timeline: Timeline, id_: str) -> list[object]:
    return [e["messages_in"][0]["preview"] for e in timeline.entries(("shop/cart", id_))]


def test_recorded_from_the_first_lookup_on() -> None:
    timeline = Timeline(per_address=3, addresses=2)
    record(timeline, "a", "before")
    assert previews(timeline, "a") == [] and not timeline.recorded  # not looked up yet
    timeline.look_up(("shop/cart", "a"))
    assert ("shop/cart", "a") in timeline.recorded
    for n in range(5):
        record(timeline, "a", f"a{n}")
    record(timeline, "b", "b0")  # not looked up: not kept
    assert previews(timeline, "a") == ["a2", "a3", "a4"]  # its last 3, oldest first
    assert previews(timeline, "b") == []


def test_recorded_addresses_are_bounded_least_recently_looked_up_first() -> None:
    timeline = Timeline(per_address=3, addresses=2)
    for id_ in ("a", "b"):
        timeline.look_up(("shop/cart", id_))
        record(timeline, id_, id_)
    timeline.look_up(("shop/cart", "a"))  # a again: b is now the least recently looked up
    timeline.look_up(("shop/cart", "c"))
    assert set(timeline.recorded) == {("shop/cart", "a"), ("shop/cart", "c")}
    assert previews(timeline, "a") == ["a"] and previews(timeline, "b") == []


def test_an_address_not_looked_up_for_long_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    timeline = Timeline(per_address=3, addresses=5)
    since = timeline.look_up(("shop/cart", "a"))
    assert timeline.look_up(("shop/cart", "a")) == since  # recorded since its first lookup
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + IDLE_S + 1)
    timeline.look_up(("shop/cart", "b"))
    assert set(timeline.recorded) == {("shop/cart", "b")}


def test_the_jobs_ring_keeps_every_address_bounded_by_count() -> None:
    timeline = Timeline(per_address=3, addresses=5, entries=6)
    for n in range(5):
        record(timeline, "a", f"a{n}")
    assert previews(timeline, "a") == ["a2", "a3", "a4"]  # before any lookup
    timeline.look_up(("shop/cart", "a"))
    record(timeline, "b", "b0")
    record(timeline, "a", "a5")  # in both rings: shown once
    assert previews(timeline, "a") == ["a3", "a4", "a5"]
    for n in range(5):
        record(timeline, "c", f"c{n}")
    assert len(timeline.snapshot()) == 6
    assert previews(timeline, "b") == []  # fell out of the job's ring
    assert previews(timeline, "a") == ["a5"]  # its own ring started at its lookup


def test_lookup_in_slices_finds_the_same_as_in_one_go() -> None:
    timeline = Timeline(per_address=50, addresses=1, entries=3 * SCAN_SLICE)
    for n in range(3 * SCAN_SLICE):
        record(timeline, "hot" if n % 1000 == 0 else f"k{n}", str(n))
    whole = timeline.entries(("shop/cart", "hot"))
    sliced = asyncio.run(timeline.entries_async(("shop/cart", "hot")))
    assert [e["messages_in"][0]["preview"] for e in sliced] == [
        str(n) for n in range(0, 3 * SCAN_SLICE, 1000)
    ]
    assert [e["messages_in"] for e in sliced] == [e["messages_in"] for e in whole]


def test_embedded_invocation_is_shown_whole() -> None:
    timeline = Timeline(5, 5)
    timeline.look_up(("shop/cart", "a"))
    made = context("a", {"gone": to_typed_value(StringType, "old")})
    started = perf_counter()
    made.storage.count = 4
    del made.storage.gone
    made.send(message_builder("shop/audit", "a", str_value="x" * 100))
    made.cancel_delayed_message("t1")
    made.send_egress(egress_message_builder("shop/out", "12345", StringType))
    made.send_egress(egress_message_builder("shop/out", "678", StringType))
    timeline.record(("shop/cart", "a"), started, envelope("a"), made)
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
    assert entry["state"][0]["name"] == "count"
    assert entry["state"][0]["value"]["preview"] == 4 and not entry["state"][0]["deleted"]
    assert entry["state"][1] == {"name": "gone", "value": None, "deleted": True}
    out = entry["messages_out"][0]
    assert out["target"] == "shop/audit/a" and out["size"] == 102
    assert out["encoding"] == "text" and len(out["preview"]) == PREVIEW + 3  # cut, with "..."
    assert entry["delayed"] == [{"target": None, "delay_ms": 0, "cancellation_token": "t1"}]
    assert entry["egress"] == [{"egress": "shop/out", "records": 2, "bytes": 7 + 5}]
    assert entry["error"] is None and entry["duration_ms"] >= 0
    assert entry["at_ms"] > 1_600_000_000_000


def test_remote_result_and_errors() -> None:
    timeline = Timeline(5, 5)
    timeline.look_up(("shop/cart", "z"))
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
    mutation = result.state_mutations.add()
    mutation.state_name = "count"
    batch = [envelope("z"), envelope("z", "pear")]
    values = {"count": to_typed_value(IntType, 2)}
    timeline.remote(("shop/cart", "z"), batch, perf_counter(), values, result)
    timeline.failed(("shop/cart", "z"), batch, perf_counter(), ValueError("bad\nthing"))
    first, failed = timeline.entries(("shop/cart", "z"))
    assert first["messages_in_count"] == 2
    assert first["state"][0]["value"]["preview"] == 2
    assert first["messages_out"][0]["target"] == "shop/audit/z"
    assert first["messages_out"][0]["preview"] == 9
    assert first["delayed"][0]["target"] == "shop/cart/z"
    assert first["delayed"][0]["delay_ms"] == 1000
    assert first["egress"] == [{"egress": "shop/out", "records": 1, "bytes": 3}]
    assert failed["error"] == "ValueError: bad\nthing"
    assert failed["messages_out"] == [] and failed["state"] == []


def test_kept_only_while_the_admin_server_runs() -> None:
    from statefun._settings import Settings
    from statefun.module._specs import ModuleSpec
    from statefun.runtime._job import Job

    assert Job(ModuleSpec(), Settings()).timeline is None  # no admin server: nobody reads it
    kept = Job(ModuleSpec(), Settings(admin_port=8091, timeline_addresses=7)).timeline
    assert kept is not None and (kept.per_address, kept.addresses, kept.every) == (50, 7, False)
    every = Job(ModuleSpec(), Settings(admin_port=8091, timeline_entries=9)).timeline
    assert every is not None and every.every and every.capacity == 9
    assert Job(ModuleSpec(), Settings(admin_port=8091, timeline_invocations=0)).timeline is None


def test_failures_are_kept_for_every_address_before_its_lookup() -> None:
    timeline = Timeline(per_address=3, addresses=2)
    record(timeline, "a", "fine")  # not looked up: not kept
    started = perf_counter()
    timeline.failed(("shop/cart", "a"), envelope("a", "bad"), started, ValueError("no"))
    timeline.failed(("shop/cart", "b"), envelope("b", "other"), started, ValueError("no"))
    assert previews(timeline, "a") == ["bad"]  # its failure from before the first lookup
    timeline.look_up(("shop/cart", "a"))
    record(timeline, "a", "after")
    timeline.failed(("shop/cart", "a"), envelope("a", "again"), perf_counter(), KeyError("k"))
    shown = timeline.entries(("shop/cart", "a"))
    assert [e["messages_in"][0]["preview"] for e in shown] == ["bad", "after", "again"]
    assert [e["error"] for e in shown] == ["ValueError: no", None, "KeyError: 'k'"]


def test_failures_kept_are_bounded() -> None:
    timeline = Timeline(per_address=500, addresses=2)
    for n in range(FAILURES + 10):
        timeline.failed(("shop/cart", "a"), envelope("a", str(n)), perf_counter(), OSError())
    assert previews(timeline, "a") == [str(n) for n in range(10, FAILURES + 10)]
