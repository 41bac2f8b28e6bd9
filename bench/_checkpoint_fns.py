"""The functions of bench/checkpoints.py, written only against the StateFun SDK surface.

* ``bench/counter``: increments the address's count (one IntType state) and sends the
  message's sequence number (IntType) to the egress ``bench/out``, so that the benchmark's
  sink counts processed messages and finds the time each one was submitted.
* ``bench/call``: increments the address's count and replies the new count to its caller
  (an HTTP request-reply call over the HTTP ingress: the caller is ``pystatefun.http/reply``).

Loaded embedded, in process (``bench._checkpoint_fns:functions``) or by ``statefun run``
from a generated module.yaml (``<path>/bench/_checkpoint_fns.py:functions``).
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
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    caller = context.caller
    if caller is not None:
        context.send(message_builder(caller.typename, caller.id, int_value=count))  # noqa: F405
