"""A function for the Kafka tests that reads JSON values (``make_json_type``)."""

from statefun import *

functions = StatefulFunctions()

ORDER = make_json_type("kafka-json/Order")
OUT = "kafka-json/out"


@functions.bind("kafka-json/orders")
def orders(context: Context, message: Message) -> None:
    order = message.as_type(ORDER)  # garbage JSON raises here
    context.send_egress(
        egress_message_builder(OUT, f"{context.address.id}:{order['n']}", StringType)
    )
