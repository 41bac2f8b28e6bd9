"""The function of bench/idempotency_keys.py's latency runs.

``bench/echo`` counts its messages in state and, when it has a caller (``POST /call``), answers
``<id>:<count>:<body>``.
"""

from statefun import Context, IntType, Message, StatefulFunctions, ValueSpec, message_builder

functions = StatefulFunctions()


@functions.bind("bench/echo", specs=[ValueSpec("count", IntType)])
def echo(context: Context, message: Message) -> None:
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    caller = context.caller
    if caller is not None:
        answer = f"{context.address.id}:{count}:{message.as_string()}"
        context.send(message_builder(caller.typename, caller.id, str_value=answer))
