# ruff: noqa: F405  (the names of StateFun's SDK, as its users import them)
"""The function of bench/statefun_jvm_vs_pystatefun.py: a counter, one egress record per input.

Served by ``python -m statefun serve bench/_jvm_counter.py:functions`` for both runtimes. Each
input is a Kafka record whose value is ``b"<output topic> <produce time, ns>"`` (typed
``bench/stamp`` by the ingress, bytes as they are); the function increments the address's
``count`` (one IntType state) and writes ``b"<output topic> <produce time> <count>"`` to the
output topic through the Kafka egress ``bench/out``, keyed by the address id. The output topic
travels in the record so that every phase of the benchmark gets its own topic.
"""

from statefun import *  # noqa: F403

functions = StatefulFunctions()


@functions.bind(typename="bench/counter", specs=[ValueSpec(name="count", type=IntType)])
def counter(context: Context, message: Message) -> None:
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    stamp = message.raw_value() or b""
    topic = stamp.partition(b" ")[0].decode()
    context.send_egress(
        kafka_egress_message(
            typename="bench/out",
            topic=topic,
            key=context.address.id,
            value=b"%s %d" % (stamp, count),
        )
    )
