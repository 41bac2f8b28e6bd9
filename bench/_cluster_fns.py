"""Functions of bench/cluster.py: the counter of bench/kafka_e2e.py, and a first hop.

``bench/counter`` keeps one IntType state and writes one Kafka egress record per message: the
input's bytes followed by `` <count>``, keyed by its id, to ``$BENCH_KAFKA_OUT``. ``bench/hop``
(the two-hop job) sends each input on to the counter of another id (``<id>x``, another key
group, so with two workers most hops cross between them).
"""

import os

from statefun import (
    Context,
    IntType,
    Message,
    StatefulFunctions,
    ValueSpec,
    kafka_egress_message,
    message_builder,
)

functions = StatefulFunctions()

EGRESS = "bench/out"
TOPIC = os.environ.get("BENCH_KAFKA_OUT", "bench-out")


@functions.bind("bench/counter", specs=[ValueSpec("count", IntType)])
def counter(context: Context, message: Message) -> None:
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    if message.is_string():
        raw = (message.as_string() or "").encode()
    else:
        raw = message.raw_value() or b""
    context.send_egress(
        kafka_egress_message(
            typename=EGRESS, topic=TOPIC, key=context.address.id, value=raw + b" %d" % count
        )
    )


@functions.bind("bench/hop")
def hop(context: Context, message: Message) -> None:
    text = (message.raw_value() or b"").decode()
    context.send(message_builder("bench/counter", context.address.id + "x", str_value=text))
