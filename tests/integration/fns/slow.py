"""A counter that takes its time, so that requests to it overlap (written against the SDK)."""

import asyncio

from statefun import *

functions = StatefulFunctions()


@functions.bind("slow/counter", specs=[ValueSpec("count", IntType)])
async def slow_counter(context: Context, message: Message) -> None:
    await asyncio.sleep(float(message.as_string() or "0"))
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    caller = context.caller
    if caller is not None and caller.typename == "pystatefun.http/reply":
        context.send(message_builder(caller.typename, caller.id, int_value=count))
