"""Functions of the randomized crash test; their expected output is computed by a model."""

from datetime import timedelta

from statefun import *

functions = StatefulFunctions()

OUT = "model/out"


def command(text: str) -> tuple[str, int]:
    op, _, seq = text.partition(":")
    return op, int(seq)


@functions.bind("model/counter", specs=[ValueSpec("count", IntType)])
def counter(context: Context, message: Message) -> None:
    _op, seq = command(message.as_string())
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    key = context.address.id
    context.send_egress(egress_message_builder(OUT, f"count {key}={count}", StringType))
    context.send(message_builder("model/echo", f"{key}-f", str_value=f"fwd:{seq}"))
    if seq % 5 == 0:
        context.send_after(
            timedelta(milliseconds=30 + seq % 200),
            message_builder("model/echo", f"{key}-late", str_value=f"late:{seq}"),
            cancellation_token=f"t{seq}",
        )
    if seq % 10 == 0:
        context.cancel_delayed_message(f"t{seq}")


@functions.bind("model/echo", specs=[ValueSpec("seen", IntType)])
def echo(context: Context, message: Message) -> None:
    op, seq = command(message.as_string())
    context.storage.seen = (context.storage.seen or 0) + 1
    context.send_egress(egress_message_builder(OUT, f"{op} {seq}", StringType))
