"""The shopping cart on Kafka: carts reserve stock from inventories, and expire if left alone.

The functions of ``examples/shopping-cart`` with Kafka in and out, written only with StateFun's
SDK names, so that the same file serves Apache StateFun's JVM runtime and pystatefun's
(``statefun serve examples/shopping-cart-kafka/functions.py:functions --port 8001``).

* ``shop/inventory/<item>`` keeps the ``stock`` of one item: ``restock`` adds to it,
  ``reserve`` takes from it and answers the cart with ``reserved`` or ``out-of-stock``,
  ``release`` puts units back. Every change of the stock is an event.
* ``shop/cart/<user>`` keeps the reserved ``items``. Every reservation (re)arms a delayed
  ``expire`` message with the cancellation token ``expire-<user>``; ``checkout`` cancels it;
  ``expire`` releases the items.

Commands are JSON Kafka record values, typed ``shop/Command`` by the ingress (the record key
is the item or the user): ``{"op": "add", "item": "apple", "qty": 2}``. Events are JSON records
on the topic ``shop-events`` (key: the item or the user), sent through the egress
``shop/events``.
"""

import json
from datetime import timedelta

from statefun import *

functions = StatefulFunctions()

COMMAND = make_json_type("shop/Command")
ITEMS = make_json_type("shop/Items")
EVENTS_EGRESS = "shop/events"
EVENTS_TOPIC = "shop-events"
# Long enough for a command to follow a reservation through an exactly-once egress that
# commits once per 1 s checkpoint.
CART_TIMEOUT = timedelta(seconds=5)


def command(target: str, id_: str, **fields: object) -> Message:
    return message_builder(target, id_, value=fields, value_type=COMMAND)


def event(key: str, name: str, **fields: object) -> EgressMessage:
    value = json.dumps({"event": name, **fields}, sort_keys=True, separators=(",", ":"))
    return kafka_egress_message(typename=EVENTS_EGRESS, topic=EVENTS_TOPIC, key=key, value=value)


@functions.bind("shop/inventory", specs=[ValueSpec("stock", IntType)])
def inventory(context: Context, message: Message) -> None:
    request = message.as_type(COMMAND)
    item = context.address.id
    stock = context.storage.stock or 0
    op = request["op"]
    if op in ("restock", "release"):
        stock += request["qty"]
    elif op == "reserve":
        assert context.caller is not None, "reserve comes from a cart"
        ok = stock >= request["qty"]
        if ok:
            stock -= request["qty"]
        context.send(
            command(
                context.caller.typename,
                context.caller.id,
                op="reserved" if ok else "out-of-stock",
                item=item,
                qty=request["qty"],
            )
        )
        if not ok:
            return
    else:
        return
    context.storage.stock = stock
    context.send_egress(event(item, "stock", item=item, stock=stock, why=op))


@functions.bind("shop/cart", specs=[ValueSpec("items", ITEMS)])
def cart(context: Context, message: Message) -> None:
    request = message.as_type(COMMAND)
    items: dict[str, int] = context.storage.items or {}
    user = context.address.id
    token = f"expire-{user}"
    op = request["op"]
    if op == "add":
        context.send(command("shop/inventory", request["item"], op="reserve", qty=request["qty"]))
    elif op == "reserved":
        items[request["item"]] = items.get(request["item"], 0) + request["qty"]
        context.storage.items = items
        context.cancel_delayed_message(token)
        context.send_after(CART_TIMEOUT, command("shop/cart", user, op="expire"), token)
        context.send_egress(event(user, "reserved", user=user, item=request["item"]))
    elif op == "out-of-stock":
        context.send_egress(event(user, "out-of-stock", user=user, item=request["item"]))
    elif op == "checkout":
        context.cancel_delayed_message(token)
        context.send_egress(event(user, "checkout", user=user, items=items))
        del context.storage.items
    elif op == "expire":
        for item, qty in sorted(items.items()):
            context.send(command("shop/inventory", item, op="release", qty=qty))
        context.send_egress(event(user, "expired", user=user, items=items))
        del context.storage.items
