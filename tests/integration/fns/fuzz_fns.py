"""Functions behind the HTTP ingress fuzz test: they accept any value and always answer."""

from statefun import *

functions = StatefulFunctions()


@functions.bind("fuzz/echo")
def echo(context: Context, message: Message) -> None:
    """Sends the value back to its caller as it came, whatever its type and bytes."""
    caller = context.caller
    if caller is not None and caller.id:
        context.send(Message(caller.typename, caller.id, message.typed_value))


@functions.bind("fuzz/count", specs=[ValueSpec("seen", IntType)])
def count(context: Context, message: Message) -> None:
    """Counts messages; answers a caller with the count."""
    seen = (context.storage.seen or 0) + 1
    context.storage.seen = seen
    caller = context.caller
    if caller is not None and caller.id:
        context.send(message_builder(caller.typename, caller.id, int_value=seen))
