"""Functions of the clustered-job tests: messages that hop between addresses (and so between
key groups and workers) and a Kafka egress record at the end of each path.

A message is the text ``<seq>:<hops>:<topic>``. ``cluster/hop`` counts every message its
address receives (state ``count``); with hops left it sends ``<seq>:<hops - 1>:<topic>`` to
the address ``(id * 7 + 3) mod 50``, else it writes ``<seq>`` to the topic, keyed by its id.
"""

from statefun import *

functions = StatefulFunctions()

EGRESS = "cluster/out"
ADDRESSES = 50


def next_id(id_: str) -> str:
    return str((int(id_) * 7 + 3) % ADDRESSES)


@functions.bind("cluster/hop", specs=[ValueSpec("count", IntType)])
def hop(context: Context, message: Message) -> None:
    seq, hops, topic = message.as_string().split(":", 2)
    context.storage.count = (context.storage.count or 0) + 1
    if int(hops) > 0:
        text = f"{seq}:{int(hops) - 1}:{topic}"
        context.send(message_builder("cluster/hop", next_id(context.address.id), str_value=text))
        return
    context.send_egress(
        kafka_egress_message(typename=EGRESS, topic=topic, key=context.address.id, value=seq)
    )
