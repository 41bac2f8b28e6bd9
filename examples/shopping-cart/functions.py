"""A shopping cart: carts reserve stock from inventories, and expire if left alone.

Functions (namespace ``shop``), written only with StateFun's SDK names:

* ``shop/inventory/<item>`` keeps the ``stock`` of one item. ``restock`` adds to it;
  ``reserve`` takes from it and answers the cart with ``reserved`` or ``out-of-stock``;
  ``release`` puts reserved units back.
* ``shop/cart/<user>`` keeps the reserved ``items``. Every change (re)arms a delayed
  ``expire`` message with the cancellation token ``expire-<user>``; ``checkout`` cancels it
  and writes a receipt to the ``shop/receipts`` egress; ``expire`` releases the items.

Commands are JSON values of type ``shop/Command``: ``{"op": "add", "item": "apple", "qty": 2}``.
"""

from datetime import timedelta

from statefun import *

functions = StatefulFunctions()

COMMAND = make_json_type("shop/Command")
RECEIPT = make_json_type("shop/Receipt")
ITEMS = make_json_type("shop/Items")
RECEIPTS = "shop/receipts"
CART_TIMEOUT = timedelta(seconds=2)


def command(target: str, id_: str, **fields: object) -> Message:
    return message_builder(target, id_, value=fields, value_type=COMMAND)


def receipt(text: str, **fields: object) -> EgressMessage:
    return egress_message_builder(RECEIPTS, {"event": text, **fields}, RECEIPT)


@functions.bind("shop/inventory", specs=[ValueSpec("stock", IntType)])
def inventory(context: Context, message: Message) -> None:
    request = message.as_type(COMMAND)
    stock = context.storage.stock or 0
    op = request["op"]
    if op == "restock":
        context.storage.stock = stock + request["qty"]
    elif op == "reserve":
        assert context.caller is not None, "reserve comes from a cart"
        ok = stock >= request["qty"]
        if ok:
            context.storage.stock = stock - request["qty"]
        reply = "reserved" if ok else "out-of-stock"
        context.send(
            command(
                context.caller.typename,
                context.caller.id,
                op=reply,
                item=context.address.id,
                qty=request["qty"],
            )
        )
    elif op == "release":
        context.storage.stock = stock + request["qty"]
    elif op == "query" and context.caller is not None:
        context.send(message_builder(context.caller.typename, context.caller.id, int_value=stock))


@functions.bind("shop/cart", specs=[ValueSpec("items", ITEMS)])
def cart(context: Context, message: Message) -> None:
    request = message.as_type(COMMAND) if message.is_type(COMMAND) else {"op": message.as_string()}
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
    elif op == "out-of-stock":
        context.send_egress(receipt("out-of-stock", user=user, item=request["item"]))
    elif op == "checkout":
        context.cancel_delayed_message(token)
        context.send_egress(receipt("checkout", user=user, items=items))
        del context.storage.items
    elif op == "expire":
        for item, qty in items.items():
            context.send(command("shop/inventory", item, op="release", qty=qty))
        context.send_egress(receipt("expired", user=user, items=items))
        del context.storage.items
    caller = context.caller
    if caller is not None and caller.typename == "pystatefun.http/reply":
        context.send(message_builder(caller.typename, caller.id, str_value=f"{op}: ok"))
