"""Functions whose state and outputs the admin port's views show: a cart with JSON, int and
TTL state that sends a message, a delayed message and an egress record per call."""

from __future__ import annotations

from datetime import timedelta

from statefun import (
    Context,
    IntType,
    Message,
    StatefulFunctions,
    ValueSpec,
    kafka_egress_message,
    make_json_type,
    message_builder,
)

functions = StatefulFunctions()

ITEMS = make_json_type("shop.types/items")


@functions.bind(
    typename="shop/cart",
    specs=[
        ValueSpec(name="items", type=ITEMS),
        ValueSpec(name="count", type=IntType, expire_after_write=timedelta(hours=1)),
    ],
)
def cart(context: Context, message: Message) -> None:
    item = message.as_string()
    items = context.storage.items or {}
    items[item] = items.get(item, 0) + 1
    context.storage.items = items
    context.storage.count = (context.storage.count or 0) + 1
    context.send(
        message_builder(target_typename="shop/audit", target_id=context.address.id, str_value=item)
    )
    context.send_after(
        timedelta(hours=1),
        message_builder(target_typename="shop/audit", target_id="reminder", str_value=item),
    )
    context.send_egress(
        kafka_egress_message(typename="shop/out", topic="carts", key=context.address.id, value=item)
    )


@functions.bind(typename="shop/audit", specs=[ValueSpec(name="seen", type=IntType)])
def audit(context: Context, message: Message) -> None:
    context.storage.seen = (context.storage.seen or 0) + 1
