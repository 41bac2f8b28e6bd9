"""statefun.testing.FunctionHarness: state, messages, delayed messages, egress, TTL, order,
errors, replies - with the functions of tests/unit/_testing_fns.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from statefun import IntType, StatefulFunctions, StringType, ValueSpec
from statefun.sdk import TypedValue
from statefun.testing import (
    Delayed,
    EgressRecord,
    FunctionFailedError,
    FunctionHarness,
    KafkaRecord,
    Outcome,
    Raw,
    Sent,
)
from tests.unit._testing_fns import functions

START = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def h() -> FunctionHarness:
    return FunctionHarness(functions)


def test_state_and_egress_of_one_invocation(h: FunctionHarness) -> None:
    out = h.send("test/counter", "a", "hello")
    assert out == Outcome(
        egress_records=[EgressRecord("test/events", {"counted": 1})],
        states={("test/counter", "a"): {"count": 1, "last": "hello"}},
        invocations=1,
    )
    assert out.state == {"count": 1, "last": "hello"}
    assert out.egress("test/events") == [{"counted": 1}]
    h.send("test/counter", "a", 7)
    assert h.state("test/counter", "a") == {"count": 2, "last": "7"}
    assert h.state("test/counter", "b") == {}


def test_a_deleted_state_is_none_in_the_outcome_and_gone_from_the_state(
    h: FunctionHarness,
) -> None:
    h.set_state("test/counter", "a", count=41)
    assert h.send("test/counter", "a", "x").state["count"] == 42
    out = h.send("test/counter", "a", "reset")
    assert out.state == {"count": None}
    assert h.state("test/counter", "a") == {"last": "x"}


def test_set_state_names_a_spec_that_does_not_exist(h: FunctionHarness) -> None:
    with pytest.raises(ValueError, match=r"'nope' is not a ValueSpec of 'test/counter'.*count"):
        h.set_state("test/counter", "a", nope=1)


def test_a_reply_to_the_harness_as_caller(h: FunctionHarness) -> None:
    out = h.send("test/counter", "a", "x", caller="test/client/c1")
    assert out.reply == 1 and out.replies == [1]
    assert out.messages == [] and h.undelivered == []
    assert h.call("test/counter", "a", "y").reply == 2


def test_delayed_messages_fire_on_advance_and_cancel(h: FunctionHarness) -> None:
    out = h.send("test/reminder", "ada", {"days": 3}, typename="test/Reminder")
    deadline = START + timedelta(days=1)
    expected = Delayed(
        "test/reminder", "ada", {"days": 3, "fire": True}, timedelta(days=1), "daily-ada", deadline
    )
    assert out.delayed == [expected]
    assert h.pending_delayed() == [expected]
    assert h.advance(timedelta(hours=23)).invocations == 0
    out = h.advance(timedelta(hours=1))
    assert h.now == deadline
    assert out.egress("test/mail") == [KafkaRecord("mail", "ada", b"day 1")]
    assert [d.deadline for d in out.delayed] == [deadline + timedelta(days=1)]
    out = h.send("test/reminder", "ada", "stop")
    assert out.cancellations == ["daily-ada"]
    assert h.pending_delayed() == []
    assert h.advance(timedelta(days=5)).invocations == 0
    assert h.state("test/reminder", "ada") == {"sent": 1}


def test_advance_fires_in_deadline_order_each_at_its_time(h: FunctionHarness) -> None:
    h.send("test/reminder", "b", {"days": 2}, typename="test/Reminder")
    h.advance(timedelta(hours=12))
    h.send("test/reminder", "a", {"days": 2}, typename="test/Reminder")
    out = h.advance(timedelta(days=3))
    assert out.egress_records == [
        EgressRecord("test/mail", KafkaRecord("mail", "b", b"day 1")),
        EgressRecord("test/mail", KafkaRecord("mail", "a", b"day 1")),
        EgressRecord("test/mail", KafkaRecord("mail", "b", b"day 2")),
        EgressRecord("test/mail", KafkaRecord("mail", "a", b"day 2")),
    ]
    # each delayed message it sent was due a day after the one that sent it fired
    assert [d.deadline - START for d in out.delayed] == [timedelta(days=2), timedelta(days=2.5)]
    assert h.now == START + timedelta(days=3, hours=12)


def test_thirty_days_of_daily_reminders(h: FunctionHarness) -> None:
    h.send("test/reminder", "ada", {"days": 30}, typename="test/Reminder")
    out = h.advance(timedelta(days=31))
    assert out.egress("test/mail") == [
        KafkaRecord("mail", "ada", f"day {n}".encode()) for n in range(1, 31)
    ]
    assert h.state("test/reminder", "ada") == {"sent": 30}
    assert h.pending_delayed() == []


def test_ttl_expire_after_call_and_after_write(h: FunctionHarness) -> None:
    h.send("test/session", "s", "hit")
    h.send("test/session", "s", {"name": "Ada"}, typename="test/Profile")
    assert h.state("test/session", "s") == {"seen": 1, "profile": {"name": "Ada"}}
    h.advance(timedelta(minutes=29))
    h.send("test/session", "s", "touch")  # a call: `seen` lives 30 more minutes; `profile` not
    h.advance(timedelta(minutes=29))
    assert h.state("test/session", "s") == {"seen": 1, "profile": {"name": "Ada"}}
    h.send("test/session", "s", "touch")  # at 58 minutes: `seen` until 88
    h.advance(timedelta(minutes=2))  # 60 minutes after the profile was written
    assert h.state("test/session", "s") == {"seen": 1}
    h.advance(timedelta(minutes=27, seconds=59))
    assert h.state("test/session", "s") == {"seen": 1}
    h.advance(timedelta(seconds=1))  # 30 minutes after the last call
    assert h.state("test/session", "s") == {}
    assert h.send("test/session", "s", "hit").state == {"seen": 1}  # starts again from nothing


def test_run_until_idle_across_two_functions_and_an_unregistered_target(
    h: FunctionHarness,
) -> None:
    out = h.send("test/ping", "k", 3)
    assert out.messages == [Sent("test/pong", "k", 2)]
    assert h.waiting == [Sent("test/pong", "k", 2)]
    out = h.run_until_idle()
    assert out.messages == [
        Sent("test/ping", "k", 2),
        Sent("test/pong", "k", 1),
        Sent("test/ping", "k", 1),
        Sent("test/pong", "k", 0),
        Sent("test/ping", "k", 0),
        Sent("test/outside", "done", "k"),
    ]
    assert out.invocations == 6
    assert out.states == {("test/pong", "k"): {"hits": 3}, ("test/ping", "k"): {"hits": 4}}
    assert h.undelivered == [Sent("test/outside", "done", "k")]
    assert h.waiting == [] and h.run_until_idle() == Outcome()


def test_run_until_idle_is_fifo_across_addresses(h: FunctionHarness) -> None:
    h.send("test/ping", "a", 1)
    h.send("test/ping", "b", 1)
    out = h.run_until_idle()
    assert [(m.typename, m.id) for m in out.messages] == [
        ("test/ping", "a"),
        ("test/ping", "b"),
        ("test/outside", "done"),
        ("test/outside", "done"),
    ]
    assert [m.value for m in h.undelivered] == ["a", "b"]


def test_an_error_names_the_address_and_message_and_changes_nothing(h: FunctionHarness) -> None:
    with pytest.raises(FunctionFailedError) as caught:
        h.send("test/fails", "z", "boom", caller="test/client/c")
    message = str(caught.value)
    assert message.startswith("function test/fails/z raised KeyError:")
    assert "'boom' of type io.statefun.types/string from test/client/c" in message
    assert isinstance(caught.value.__cause__, KeyError)
    assert h.state("test/fails", "z") == {} and h.waiting == []


def test_an_error_inside_run_until_idle_leaves_the_rest_waiting(h: FunctionHarness) -> None:
    h.send("test/ping", "a", -1)
    h.send("test/ping", "b", 1)
    assert h.waiting == [Sent("test/fails", "p", "from ping"), Sent("test/pong", "b", 0)]
    with pytest.raises(FunctionFailedError, match=r"test/fails/p .*'from ping'.* from test/ping/a"):
        h.run_until_idle()
    assert h.waiting == [Sent("test/pong", "b", 0)]
    assert h.run_until_idle().invocations == 2


def test_values_of_unknown_types_are_raw(h: FunctionHarness) -> None:
    functions2 = StatefulFunctions()

    @functions2.bind("t/echo")
    def echo(context, message):  # type: ignore[no-untyped-def]
        context.send(message_builder_raw(message))

    from statefun import Message

    def message_builder_raw(message: Message) -> Message:
        return Message("t/other", "1", message.typed_value)

    harness = FunctionHarness(functions2)
    out = harness.send("t/echo", "1", b"\x01\x02", typename="t/Blob")
    assert out.messages == [Sent("t/other", "1", Raw("t/Blob", b"\x01\x02"))]
    assert out.messages[0].value == ("t/Blob", b"\x01\x02")
    out = harness.send(
        "t/echo", "1", TypedValue(IntType.typename, IntType.serializer().serialize(5))
    )
    assert out.messages[0].value == 5


def test_types_come_from_specs_modules_and_sends(h: FunctionHarness) -> None:
    # test/Profile is a module-level Type of the functions' module: egress records decode
    assert h.send("test/counter", "a", "x").egress_records[0].value == {"counted": 1}
    with pytest.raises(ValueError, match="differs"):
        h.send("test/counter", "a", 1, typename="x/y", type=IntType)
    assert h.send("test/counter", "a", 3, type=IntType).state == {"count": 2, "last": "3"}


def test_misuse_is_a_clear_error(h: FunctionHarness) -> None:
    with pytest.raises(LookupError, match="test/nope"):
        h.send("test/nope", "a", 1)
    with pytest.raises(ValueError, match="back in time"):
        h.advance(timedelta(seconds=-1))
    with pytest.raises(TypeError, match="StatefulFunctions"):
        FunctionHarness(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="caller"):
        h.send("test/counter", "a", 1, caller="nocaller")


def test_endless_ping_pong_stops_at_max_invocations() -> None:
    harness = FunctionHarness(functions, max_invocations=10)
    harness.send("test/ping", "k", 1000)
    with pytest.raises(RuntimeError, match="after 10 invocations"):
        harness.run_until_idle()


async def test_async_functions_inside_a_running_event_loop() -> None:
    assert asyncio.get_running_loop() is not None
    harness = FunctionHarness(functions)
    harness.send("test/pong", "k", 0)
    harness.run_until_idle()
    assert harness.state("test/pong", "k") == {"hits": 1}
    assert harness.undelivered == [Sent("test/outside", "done", "k")]


def test_the_clock_starts_where_told() -> None:
    start = datetime(2030, 6, 1, 12, tzinfo=UTC)
    harness = FunctionHarness(functions, start=start)
    assert harness.now == start
    harness.advance(timedelta(milliseconds=1500))
    assert harness.now == start + timedelta(seconds=1.5)
    with pytest.raises(ValueError, match="aware"):
        FunctionHarness(functions, start=datetime(2030, 1, 1))


def test_a_spec_registered_under_another_type_reads_raw() -> None:
    fns = StatefulFunctions()
    fns.register("t/f", lambda c, m: None, [ValueSpec("v", StringType)])
    harness = FunctionHarness(fns)
    harness.set_state("t/f", "1", v="x")
    assert harness.state("t/f", "1") == {"v": "x"}
