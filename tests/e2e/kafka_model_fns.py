"""Functions of the randomized Kafka crash test; a model in the test predicts their output.

The Kafka ingress passes record values as they are, typed with the topic's ``valueType``
(``model/Command``): UTF-8 text ``<op>:<seq>:<output topic>``, read with ``raw_value()``.
Every output is a record of the Kafka egress ``model/out`` (exactly-once), keyed by the
address id, so a key's records stay in order in the (single-partition) output topic.
"""

from datetime import timedelta

from statefun import *

functions = StatefulFunctions()

OUT = "model/out"
COMMAND = "model/Command"


def parse(text: str) -> tuple[str, int, str]:
    op, seq, topic = text.split(":", 2)
    return op, int(seq), topic


def emit(context: Context, topic: str, value: str) -> None:
    context.send_egress(
        kafka_egress_message(typename=OUT, topic=topic, key=context.address.id, value=value)
    )


@functions.bind("model/counter", specs=[ValueSpec("count", IntType)])
def counter(context: Context, message: Message) -> None:
    if message.value_typename() != COMMAND:
        raise ValueError(f"unexpected {message.value_typename()}")
    raw = message.raw_value()
    assert raw is not None
    _op, seq, topic = parse(raw.decode("utf-8"))
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    key = context.address.id
    emit(context, topic, f"count {key}={count}")
    context.send(message_builder("model/echo", f"{key}-f", str_value=f"fwd:{seq}:{topic}"))
    if seq % 5 == 0:
        context.send_after(
            timedelta(milliseconds=30 + seq % 200),
            message_builder("model/echo", f"{key}-late", str_value=f"late:{seq}:{topic}"),
            cancellation_token=f"t{seq}",
        )
    if seq % 10 == 0:
        context.cancel_delayed_message(f"t{seq}")


@functions.bind("model/echo", specs=[ValueSpec("seen", IntType)])
def echo(context: Context, message: Message) -> None:
    text = message.as_string()
    assert text is not None
    op, seq, topic = parse(text)
    seen = (context.storage.seen or 0) + 1
    context.storage.seen = seen
    emit(context, topic, f"{op} {seq}")
    emit(context, topic, f"seen {context.address.id}={seen}")
