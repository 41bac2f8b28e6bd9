"""The functions of the examples (greeter, shopping-cart, shopping-cart-kafka), tested with the
test kit: in this process, on a virtual clock, nothing sleeps. The examples' end-to-end tests
(real runtime processes) are in tests/integration."""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest

from examples.greeter.functions import functions as greeter_functions
from examples.greeter.functions import greeting, ordinal
from statefun.testing import (
    Delayed,
    EgressRecord,
    FunctionFailedError,
    FunctionHarness,
    KafkaRecord,
    Sent,
)

ROOT = Path(__file__).resolve().parents[2]
START = datetime(2025, 1, 1, tzinfo=UTC)


def load(example: str) -> ModuleType:
    """examples/<example>/functions.py (the folder's name is not a package name)."""
    name = f"example_{example.replace('-', '_')}_functions"
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "examples" / example / "functions.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- examples/greeter ------------------------------------------------------------------------


def test_ordinals() -> None:
    expected = {
        1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 10: "10th", 11: "11th", 12: "12th", 13: "13th",
        14: "14th", 21: "21st", 22: "22nd", 23: "23rd", 101: "101st", 111: "111th",
        112: "112th", 113: "113th", 121: "121st",
    }  # fmt: skip
    assert {n: ordinal(n) for n in expected} == expected
    assert greeting("Ada", 1) == "Hello Ada! Nice to meet you."
    assert greeting("Ada", 22) == "Hello Ada for the 22nd time!"


def test_greeter_counts_and_greets_through_the_egress() -> None:
    h = FunctionHarness(greeter_functions)
    out = h.send("example/greeter", "Ada", "hi")
    assert out.egress_records == [
        EgressRecord(
            "example/greets", KafkaRecord("greetings", "Ada", b"Hello Ada! Nice to meet you.")
        )
    ]
    assert out.state == {"seen": 1} and out.messages == []
    h.send("example/greeter", "Ada", "hi")
    assert h.state("example/greeter", "Ada") == {"seen": 2}
    assert h.state("example/greeter", "Grace") == {}


def test_greeter_replies_to_a_caller() -> None:
    h = FunctionHarness(greeter_functions)
    h.set_state("example/greeter", "Ada", seen=10)
    out = h.call("example/greeter", "Ada", "hi")
    assert out.reply == "Hello Ada for the 11th time!"
    assert out.egress("example/greets") == [
        KafkaRecord("greetings", "Ada", b"Hello Ada for the 11th time!")
    ]


# -- examples/shopping-cart --------------------------------------------------------------------

shop = load("shopping-cart")
TIMEOUT = shop.CART_TIMEOUT


def order(item: str, qty: int) -> dict[str, object]:
    return {"op": "add", "item": item, "qty": qty}


@pytest.fixture
def cart() -> FunctionHarness:
    h = FunctionHarness(shop.functions)
    h.send("shop/inventory", "apple", {"op": "restock", "qty": 3}, typename="shop/Command")
    return h


def test_adding_reserves_stock_and_arms_the_expiry(cart: FunctionHarness) -> None:
    out = cart.send("shop/cart", "dave", order("apple", 2), typename="shop/Command")
    assert out.messages == [Sent("shop/inventory", "apple", {"op": "reserve", "qty": 2})]
    out = cart.run_until_idle()
    assert out.messages == [
        Sent("shop/cart", "dave", {"op": "reserved", "item": "apple", "qty": 2})
    ]
    assert out.states == {
        ("shop/inventory", "apple"): {"stock": 1},
        ("shop/cart", "dave"): {"items": {"apple": 2}},
    }
    assert out.cancellations == ["expire-dave"]
    assert out.delayed == [
        Delayed("shop/cart", "dave", {"op": "expire"}, TIMEOUT, "expire-dave", START + TIMEOUT)
    ]


def test_out_of_stock_is_a_receipt(cart: FunctionHarness) -> None:
    cart.send("shop/cart", "carol", order("apple", 5), typename="shop/Command")
    out = cart.run_until_idle()
    assert out.egress("shop/receipts") == [
        {"event": "out-of-stock", "user": "carol", "item": "apple"}
    ]
    assert cart.state("shop/cart", "carol") == {}
    assert cart.state("shop/inventory", "apple") == {"stock": 3}


def test_an_idle_cart_expires_and_gives_its_items_back(cart: FunctionHarness) -> None:
    cart.send("shop/cart", "dave", order("apple", 2), typename="shop/Command")
    cart.run_until_idle()
    assert cart.advance(TIMEOUT - timedelta(seconds=1)).invocations == 0
    out = cart.advance(timedelta(seconds=1))
    assert out.egress("shop/receipts") == [
        {"event": "expired", "user": "dave", "items": {"apple": 2}}
    ]
    assert cart.state("shop/cart", "dave") == {}
    assert cart.state("shop/inventory", "apple") == {"stock": 3}


def test_each_reservation_moves_the_expiry(cart: FunctionHarness) -> None:
    cart.send("shop/cart", "dave", order("apple", 1), typename="shop/Command")
    cart.advance(TIMEOUT / 2)
    cart.send("shop/cart", "dave", order("apple", 1), typename="shop/Command")
    cart.run_until_idle()
    (pending,) = cart.pending_delayed()
    assert pending.deadline == START + TIMEOUT / 2 + TIMEOUT
    assert cart.advance(TIMEOUT - timedelta(seconds=1)).egress_records == []
    assert cart.advance(timedelta(seconds=1)).egress("shop/receipts") == [
        {"event": "expired", "user": "dave", "items": {"apple": 2}}
    ]


def test_checkout_cancels_the_expiry(cart: FunctionHarness) -> None:
    cart.send("shop/cart", "dave", order("apple", 2), typename="shop/Command")
    cart.run_until_idle()
    out = cart.call("shop/cart", "dave", {"op": "checkout"}, typename="shop/Command")
    assert out.reply == "checkout: ok"
    assert out.cancellations == ["expire-dave"]
    assert out.egress("shop/receipts") == [
        {"event": "checkout", "user": "dave", "items": {"apple": 2}}
    ]
    assert cart.pending_delayed() == []
    assert cart.advance(TIMEOUT * 2).invocations == 0
    assert cart.state("shop/inventory", "apple") == {"stock": 1}


def test_a_caller_gets_an_error_as_its_reply_and_nothing_changes(cart: FunctionHarness) -> None:
    out = cart.call("shop/cart", "dave", '{"op": "add"}')  # text, not a shop/Command
    assert out.reply == (
        "error: shop/cart/dave takes shop/Command messages (JSON; statefun send --typename "
        "shop/Command), got a io.statefun.types/string"
    )
    out = cart.call("shop/cart", "dave", {"op": "buy"}, typename="shop/Command")
    assert out.reply.startswith("error: shop/cart has no operation 'buy'; it has add, ")
    assert out.states == {} and out.messages == []


def test_without_a_caller_a_bad_command_raises() -> None:
    h = FunctionHarness(shop.functions)
    with pytest.raises(
        FunctionFailedError, match=r"^function shop/cart/dave raised TypeError"
    ) as e:
        h.send("shop/cart", "dave", "add apple")
    assert isinstance(e.value.__cause__, TypeError)


# -- examples/shopping-cart-kafka --------------------------------------------------------------

kafka_shop = load("shopping-cart-kafka")


def events(records: list[KafkaRecord]) -> list[tuple[str | None, dict[str, object]]]:
    return [(r.key, json.loads(r.value)) for r in records if r.topic == "shop-events"]


def test_kafka_cart_reserves_expires_and_reports_events() -> None:
    h = FunctionHarness(kafka_shop.functions)
    h.send("shop/inventory", "pear", {"op": "restock", "qty": 1}, typename="shop/Command")
    h.send("shop/cart", "erin", order("pear", 1), typename="shop/Command")
    h.send("shop/cart", "fred", order("pear", 1), typename="shop/Command")
    out = h.run_until_idle()
    assert events(out.egress("shop/events")) == [
        ("pear", {"event": "stock", "item": "pear", "stock": 0, "why": "reserve"}),
        ("erin", {"event": "reserved", "user": "erin", "item": "pear"}),
        ("fred", {"event": "out-of-stock", "user": "fred", "item": "pear"}),
    ]
    out = h.advance(kafka_shop.CART_TIMEOUT)
    assert events(out.egress("shop/events")) == [
        ("erin", {"event": "expired", "user": "erin", "items": {"pear": 1}}),
        ("pear", {"event": "stock", "item": "pear", "stock": 1, "why": "release"}),
    ]
    assert h.state("shop/inventory", "pear") == {"stock": 1}
