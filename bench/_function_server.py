"""The functions of bench/runtime_e2e.py and bench/checkpoints.py.

* ``bench/counter``: a counter that writes one egress record per message.
* ``bench/call``: increments the address's count and replies the new count to its caller
  (an HTTP request-reply call over the HTTP ingress: the caller is ``pystatefun.http/reply``);
  the string ``get`` only reads: the reply is the count as it is.

Written only against the StateFun SDK surface, so the same code runs embedded (the runtime
loads ``bench._function_server:functions``) and remote (``python -m statefun serve
bench._function_server:functions --port N``, started from the repository root).

Each message carries a sequence number (IntType); the function increments the address's
count (one IntType state) and sends the sequence number to the egress ``bench/out``, so the
benchmark's sink can find the time the message was submitted.
"""

from statefun import *  # noqa: F403

COUNTER = "bench/counter"
CALL = "bench/call"
OUT = "bench/out"

functions = StatefulFunctions()  # noqa: F405


@functions.bind(typename=COUNTER, specs=[ValueSpec(name="count", type=IntType)])  # noqa: F405
def counter(context: Context, message: Message) -> None:  # noqa: F405
    context.storage.count = (context.storage.count or 0) + 1
    context.send_egress(egress_message_builder(OUT, message.as_int(), IntType))  # noqa: F405


@functions.bind(typename=CALL, specs=[ValueSpec(name="count", type=IntType)])  # noqa: F405
def call(context: Context, message: Message) -> None:  # noqa: F405
    count = context.storage.count or 0
    if not (message.is_string() and message.as_string() == "get"):
        count += 1
        context.storage.count = count
    caller = context.caller
    if caller is not None:
        context.send(message_builder(caller.typename, caller.id, int_value=count))  # noqa: F405
