"""A shopping cart: carts reserve stock from inventories, and expire if left alone.

Functions (namespace ``shop``), written only with StateFun's SDK names:

* ``shop/inventory/<item>`` keeps the ``stock`` of one item. ``restock`` adds to it;
  ``reserve`` takes from it and answers the cart with ``reserved`` or ``out-of-stock``;
  ``release`` puts reserved units back.
* ``shop/cart/<user>`` keeps the reserved ``items``. Every change (re)arms a delayed
  ``expire`` message with the cancellation token ``expire-<user>``; ``checkout`` cancels it
  and writes a receipt to the ``shop/receipts`` egress; ``expire`` releases the items.

Commands are JSON values of type ``shop/Command``: ``{"op": "add", "item": "apple", "qty": 2}``.
A message of another type, or a command the function does not know, is an error: a cart
answers a waiting caller (``statefun send ... --call``) with ``error: ...``, and otherwise
raises, so the runtime reports it (and, per its ``remote_failure_policy``, stops the job or
writes the message to the dead letters) instead of dropping it silently.

A cart expires ``SHOP_CART_TIMEOUT_SECONDS`` (an environment variable of the runtime, 300 by
default) after its last reservation.
"""

import os
from datetime import timedelta

from statefun import *

functions = StatefulFunctions()

COMMAND = make_json_type("shop/Command")
RECEIPT = make_json_type("shop/Receipt")
ITEMS = make_json_type("shop/Items")
RECEIPTS = "shop/receipts"
# The caller of an HTTP request-reply call (`statefun send --call`): it waits for one reply.
HTTP_CALLER = "pystatefun.http/reply"
# The cart's operations and the fields each needs.
CART_OPS = {
    "add": ("item", "qty"),
    "checkout": (),
    "reserved": ("item", "qty"),
    "out-of-stock": ("item",),
    "expire": (),
}
CART_TIMEOUT = timedelta(seconds=float(os.environ.get("SHOP_CART_TIMEOUT_SECONDS", "300")))


def command(target: str, id_: str, **fields: object) -> Message:
    return message_builder(target, id_, value=fields, value_type=COMMAND)


def receipt(text: str, **fields: object) -> EgressMessage:
    return egress_message_builder(RECEIPTS, {"event": text, **fields}, RECEIPT)


def read_command(context: Context, message: Message) -> dict:
    """The command in ``message``; an error if it is not a shop/Command (e.g. JSON sent as
    text: ``statefun send`` needs ``--typename shop/Command``)."""
    if not message.is_type(COMMAND):
        raise TypeError(
            f"{context.address.typename}/{context.address.id} takes {COMMAND.typename} "
            f"messages (JSON; statefun send --typename {COMMAND.typename}), "
            f"got a {message.value_typename()}"
        )
    return message.as_type(COMMAND)


def cart_command(context: Context, message: Message) -> dict:
    request = read_command(context, message)
    op = request.get("op") if isinstance(request, dict) else None
    if op not in CART_OPS:
        raise ValueError(
            f"{context.address.typename} has no operation {op!r}; it has {', '.join(CART_OPS)}"
        )
    missing = [name for name in CART_OPS[op] if name not in request]
    if missing:
        raise ValueError(f"{op!r} needs {', '.join(missing)}")
    return request


def reply(context: Context, text: str) -> None:
    """Answer the caller, if it waits for an answer."""
    caller = context.caller
    if caller is not None and caller.typename == HTTP_CALLER:
        context.send(message_builder(caller.typename, caller.id, str_value=text))


def unknown(context: Context, op: object) -> ValueError:
    return ValueError(f"{context.address.typename} has no operation {op!r}")


@functions.bind("shop/inventory", specs=[ValueSpec("stock", IntType)])
def inventory(context: Context, message: Message) -> None:
    request = read_command(context, message)
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
    else:
        raise unknown(context, op)


@functions.bind("shop/cart", specs=[ValueSpec("items", ITEMS)])
def cart(context: Context, message: Message) -> None:
    try:
        request = cart_command(context, message)
    except (TypeError, ValueError) as exc:
        caller = context.caller
        if caller is None or caller.typename != HTTP_CALLER:
            raise
        reply(context, f"error: {exc}")  # nothing else changes
        return
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
    reply(context, f"{op}: ok")
