"""Functions for the runtime tests, written only against the StateFun SDK surface."""

from datetime import timedelta

from statefun import *

functions = StatefulFunctions()

OUT = "test/out"


@functions.bind("test/counter", specs=[ValueSpec("count", IntType)])
def counter(context: Context, message: Message) -> None:
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    context.send(message_builder("test/recorder", context.address.id, int_value=count))
    caller = context.caller
    if caller is not None and caller.typename == "pystatefun.http/reply":
        context.send(message_builder(caller.typename, caller.id, int_value=count))


@functions.bind("test/recorder")
def recorder(context: Context, message: Message) -> None:
    assert context.caller is not None and context.caller.typename == "test/counter"
    context.send_egress(
        egress_message_builder(OUT, f"{context.address.id}={message.as_int()}", StringType)
    )


@functions.bind("test/async-echo", specs=[ValueSpec("seen", make_json_type("test/seen"))])
async def async_echo(context: Context, message: Message) -> None:
    seen = context.storage.seen or []
    seen.append(message.as_string())
    context.storage.seen = seen
    context.send_egress(egress_message_builder(OUT, "|".join(seen), StringType))


@functions.bind("test/reminder", specs=[ValueSpec("armed", BoolType)])
def reminder(context: Context, message: Message) -> None:
    command = message.as_string()
    if command == "arm":
        context.storage.armed = True
        context.send_after(
            timedelta(milliseconds=150),
            message_builder("test/reminder", context.address.id, str_value="fire"),
            cancellation_token=f"reminder-{context.address.id}",
        )
    elif command == "disarm":
        del context.storage.armed
        context.cancel_delayed_message(f"reminder-{context.address.id}")
    elif command == "fire":
        context.send_egress(egress_message_builder(OUT, f"fired {context.address.id}", StringType))


@functions.bind(
    "test/ttl",
    specs=[ValueSpec("value", StringType, expire_after_write=timedelta(milliseconds=300))],
)
def ttl(context: Context, message: Message) -> None:
    command = message.as_string()
    if command.startswith("set:"):
        context.storage.value = command[4:]
    else:
        context.send_egress(
            egress_message_builder(OUT, f"value={context.storage.value}", StringType)
        )


@functions.bind("test/fails")
def fails(context: Context, message: Message) -> None:
    raise ValueError(f"cannot handle {message.as_string()!r}")
