# The star import is the point (only the names of StateFun's SDK), so allow it:
"""A greeter: remembers how often it greeted each person and sends a greeting to Kafka.

Each person is one address ``example/greeter/<name>``; its state ``seen`` counts the
greetings. Only StateFun's SDK names are used, so this file runs unchanged on Apache
StateFun's Python SDK too.

    statefun serve examples.greeter.functions:functions --port 8000
"""

from statefun import *

functions = StatefulFunctions()

GREETINGS_EGRESS = "example/greets"
GREETINGS_TOPIC = "greetings"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def greeting(name: str, seen: int) -> str:
    if seen == 1:
        return f"Hello {name}! Nice to meet you."
    return f"Hello {name} for the {ordinal(seen)} time!"


@functions.bind(
    typename="example/greeter",
    specs=[ValueSpec(name="seen", type=IntType)],
)
async def greeter(context: Context, message: Message) -> None:
    """Greet the person this address stands for; the message content is not used."""
    seen = (context.storage.seen or 0) + 1
    context.storage.seen = seen
    name = context.address.id
    context.send_egress(
        kafka_egress_message(
            typename=GREETINGS_EGRESS,
            topic=GREETINGS_TOPIC,
            key=name,
            value=greeting(name, seen),
        )
    )
    # Called over the HTTP ingress's /call/...: the caller waits for a reply.
    if context.caller is not None:
        context.send(
            message_builder(
                target_typename=context.caller.typename,
                target_id=context.caller.id,
                str_value=greeting(name, seen),
            )
        )
