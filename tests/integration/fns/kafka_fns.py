"""Functions for the Kafka tests, written only against the StateFun SDK surface.

Records of the input topic go to ``kafka-test/counter``: the key is the id and the value (a
io.statefun.types/string) names the output topic. The counter counts and messages
``kafka-test/writer``, which produces ``<id>=<count>`` to that topic through the Kafka egress.
"""

from statefun import *

functions = StatefulFunctions()

EGRESS = "kafka-test/out"


@functions.bind("kafka-test/counter", specs=[ValueSpec("count", IntType)])
def counter(context: Context, message: Message) -> None:
    if context.address.id == "bad-egress":  # a record the Kafka egress cannot produce
        context.send_egress(egress_message_builder(EGRESS, "not a Kafka record", StringType))
        return
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    text = f"{message.as_string()}|{count}"
    context.send(message_builder("kafka-test/writer", context.address.id, str_value=text))


@functions.bind("kafka-test/writer")
def writer(context: Context, message: Message) -> None:
    topic, _, count = message.as_string().rpartition("|")
    context.send_egress(
        kafka_egress_message(
            typename=EGRESS,
            topic=topic,
            key=context.address.id,
            value=f"{context.address.id}={count}",
        )
    )
