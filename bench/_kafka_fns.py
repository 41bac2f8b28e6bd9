"""The counter of bench/kafka_e2e.py, embedded in the runtime process.

Input records (valueType ``bench/Stamp``) hold ``<kind>:<produce time ns>`` as UTF-8 bytes; the
counter keeps one IntType state and writes one Kafka egress record per input: the input's value
followed by `` <count>``, keyed by the function id, to the topic ``$BENCH_KAFKA_OUT``.
"""

import os

from statefun import (
    Context,
    IntType,
    Message,
    StatefulFunctions,
    ValueSpec,
    kafka_egress_message,
)

functions = StatefulFunctions()

EGRESS = "bench/out"
TOPIC = os.environ.get("BENCH_KAFKA_OUT", "bench-out")


@functions.bind("bench/counter", specs=[ValueSpec("count", IntType)])
def counter(context: Context, message: Message) -> None:
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    raw = message.raw_value() or b""
    context.send_egress(
        kafka_egress_message(
            typename=EGRESS,
            topic=TOPIC,
            key=context.address.id,
            value=raw + b" %d" % count,
        )
    )
