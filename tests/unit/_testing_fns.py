"""Functions the tests of statefun.testing run: a counter, a reminder, a session with TTL,
a ping-pong pair, and functions that fail."""

from __future__ import annotations

from datetime import timedelta

from statefun import *

functions = StatefulFunctions()

PROFILE = make_json_type("test/Profile")
REMINDER = make_json_type("test/Reminder")
EVENTS = "test/events"


@functions.bind("test/counter", specs=[ValueSpec("count", IntType), ValueSpec("last", StringType)])
def counter(context: Context, message: Message) -> None:
    if message.is_string() and message.as_string() == "reset":
        del context.storage.count
        return
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    context.storage.last = message.as_string() if message.is_string() else str(message.as_int())
    context.send_egress(egress_message_builder(EVENTS, {"counted": count}, PROFILE))
    if context.caller is not None:
        context.send(message_builder(context.caller.typename, context.caller.id, int_value=count))


@functions.bind("test/reminder", specs=[ValueSpec("sent", IntType)])
def reminder(context: Context, message: Message) -> None:
    """``{"days": n}`` starts a daily reminder for n days; "stop" cancels it."""
    token = f"daily-{context.address.id}"
    if message.is_string() and message.as_string() == "stop":
        context.cancel_delayed_message(token)
        return
    request = message.as_type(REMINDER)
    left = request["days"]
    if request.get("fire"):
        sent = (context.storage.sent or 0) + 1
        context.storage.sent = sent
        context.send_egress(
            kafka_egress_message(
                typename="test/mail", topic="mail", key=context.address.id, value=f"day {sent}"
            )
        )
        left -= 1
    if left > 0:
        context.send_after(
            timedelta(days=1),
            message_builder(
                "test/reminder",
                context.address.id,
                value={"days": left, "fire": True},
                value_type=REMINDER,
            ),
            token,
        )


@functions.bind(
    "test/session",
    specs=[
        ValueSpec("seen", IntType, expire_after_call=timedelta(minutes=30)),
        ValueSpec("profile", PROFILE, expire_after_write=timedelta(hours=1)),
    ],
)
def session(context: Context, message: Message) -> None:
    if message.is_type(PROFILE):
        context.storage.profile = message.as_type(PROFILE)
        return
    if message.is_string() and message.as_string() == "touch":
        return  # a call without a write: keeps expire_after_call values alive
    context.storage.seen = (context.storage.seen or 0) + 1


@functions.bind("test/ping", specs=[ValueSpec("hits", IntType)])
def ping(context: Context, message: Message) -> None:
    n = message.as_int()
    context.storage.hits = (context.storage.hits or 0) + 1
    if n > 0:
        context.send(message_builder("test/pong", context.address.id, int_value=n - 1))
    elif n < 0:
        context.send(message_builder("test/fails", "p", str_value="from ping"))
    else:
        context.send(message_builder("test/outside", "done", str_value=context.address.id))


@functions.bind("test/pong", specs=[ValueSpec("hits", IntType)])
async def pong(context: Context, message: Message) -> None:
    context.storage.hits = (context.storage.hits or 0) + 1
    context.send(message_builder("test/ping", context.address.id, int_value=message.as_int()))


@functions.bind("test/fails", specs=[ValueSpec("count", IntType)])
def fails(context: Context, message: Message) -> None:
    context.storage.count = 1
    context.send(message_builder("test/counter", "x", str_value="never"))
    raise KeyError(f"no such thing: {message.as_string()}")
