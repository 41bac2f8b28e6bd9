"""Functions of the clustered HTTP ingress tests.

* ``chttp/record``: a message ``<seq>:<topic>`` (sent with ``POST /messages``) counts in the
  address's state ``count`` and writes ``<seq>`` to the Kafka topic, keyed by its id.
* ``chttp/call``: a ``POST /call`` with a text body; it counts (state ``count``) and answers its
  caller ``<id>:<count>:<body>``.
* ``chttp/flaky``: as ``chttp/call``, but raises on the body ``fail``.
"""

from statefun import *

functions = StatefulFunctions()

EGRESS = "chttp/out"


@functions.bind("chttp/record", specs=[ValueSpec("count", IntType)])
def record(context: Context, message: Message) -> None:
    seq, topic = message.as_string().split(":", 1)
    context.storage.count = (context.storage.count or 0) + 1
    context.send_egress(
        kafka_egress_message(typename=EGRESS, topic=topic, key=context.address.id, value=seq)
    )


@functions.bind("chttp/call", specs=[ValueSpec("count", IntType)])
def call(context: Context, message: Message) -> None:
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    assert context.caller is not None
    answer = f"{context.address.id}:{count}:{message.as_string()}"
    context.send(message_builder(context.caller.typename, context.caller.id, str_value=answer))


@functions.bind("chttp/flaky", specs=[ValueSpec("count", IntType)])
def flaky(context: Context, message: Message) -> None:
    """Raises on the body ``fail`` (a dead letter under remote_failure_policy=dead-letter);
    else counts and answers its caller as ``chttp/call`` does."""
    text = message.as_string()
    if text == "fail":
        raise RuntimeError("told to fail")
    count = (context.storage.count or 0) + 1
    context.storage.count = count
    assert context.caller is not None
    answer = f"{context.address.id}:{count}:{text}"
    context.send(message_builder(context.caller.typename, context.caller.id, str_value=answer))
