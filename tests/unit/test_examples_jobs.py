"""The examples' module.yaml files as written, on the real runtime in this process
(statefun.testing.JobHarness): their Kafka, HTTP, file and stdout connectors swapped for
in-memory stand-ins by id, remote endpoints bound to the examples' functions, a virtual clock.
Nothing sleeps, no socket opens. The same examples against real processes, HTTP and a real
Kafka broker are in tests/integration and tests/jvm."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from examples.greeter.functions import functions as greeter_functions
from statefun.testing import IngressStandIn, JobHarness, KafkaRecord
from tests.unit.test_examples_functions import kafka_shop

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def feed(ingress: IngressStandIn, jsonl: Path) -> None:
    """The lines of a file ingress's JSON-lines file, as records of its stand-in."""
    for line in jsonl.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        ingress.send(
            record["id"], record["value"], target=record["target"], typename=record["type"]
        )


# -- examples/greeter ------------------------------------------------------------------------


def test_greeter_module_greets_through_its_egress() -> None:
    with JobHarness(EXAMPLES / "greeter" / "module.yaml", functions=greeter_functions) as h:
        http = h.ingress("example/http")
        http.send("Ada", "hi", target="example/greeter")
        http.send("Ada", "hi", target="example/greeter")
        http.send("Bob", "hi", target="example/greeter")
        h.run_until_idle()
        assert h.egress("example/greets").records == [
            KafkaRecord("greetings", "Ada", b"Hello Ada! Nice to meet you."),
            KafkaRecord("greetings", "Ada", b"Hello Ada for the 2nd time!"),
            KafkaRecord("greetings", "Bob", b"Hello Bob! Nice to meet you."),
        ]
        assert h.state("example/greeter", "Ada") == {"seen": 2}
        # a request-reply call, as `statefun send example/greeter/Ada hi --call`
        assert h.call("example/greeter", "Ada", "hi") == "Hello Ada for the 3rd time!"


# -- examples/shopping-cart ------------------------------------------------------------------

SHOP = EXAMPLES / "shopping-cart"
#: the example's default (its functions read SHOP_CART_TIMEOUT_SECONDS when loaded)
DEFAULT_TIMEOUT = timedelta(seconds=300)


@pytest.fixture
def shop() -> Iterator[JobHarness]:
    if "SHOP_CART_TIMEOUT_SECONDS" in os.environ:
        pytest.skip("SHOP_CART_TIMEOUT_SECONDS is set: the carts' expiry is not the default")
    with JobHarness(SHOP / "module.yaml") as harness:
        feed(harness.ingress("shop/orders"), SHOP / "orders.jsonl")
        harness.run_until_idle()
        yield harness


def test_shopping_cart_orders_wait_for_their_expiry(shop: JobHarness) -> None:
    receipts = shop.egress("shop/receipts")
    assert receipts.records == [{"event": "out-of-stock", "user": "carol", "item": "pear"}]
    receipts.clear()
    shop.advance(DEFAULT_TIMEOUT - timedelta(milliseconds=1))
    assert receipts.records == []
    shop.advance(timedelta(milliseconds=1))
    assert sorted(receipts.records, key=json.dumps) == [
        {"event": "expired", "user": "alice", "items": {"apple": 2}},
        {"event": "expired", "user": "bob", "items": {"apple": 1, "pear": 1}},
    ]
    assert shop.state("shop/inventory", "apple") == {"stock": 5}


def test_shopping_cart_checkout_before_the_expiry(shop: JobHarness) -> None:
    shop.advance(DEFAULT_TIMEOUT / 2)
    feed(shop.ingress("shop/orders"), SHOP / "checkout.jsonl")
    shop.advance(DEFAULT_TIMEOUT)
    assert shop.egress("shop/receipts").records[1:] == [
        {"event": "checkout", "user": "alice", "items": {"apple": 2}},
        {"event": "expired", "user": "bob", "items": {"apple": 1, "pear": 1}},
    ]
    assert shop.state("shop/inventory", "apple") == {"stock": 3}  # 5, less alice's two


# -- examples/shopping-cart-kafka ------------------------------------------------------------

KAFKA_SHOP = EXAMPLES / "shopping-cart-kafka" / "module.yaml"


def events(h: JobHarness) -> list[tuple[str | None, dict[str, Any]]]:
    """The shop-events topic as a read_committed consumer sees it."""
    records = h.egress("shop/events").records
    return [(r.key, json.loads(r.value)) for r in records if r.topic == "shop-events"]


@pytest.fixture
def kafka_cart() -> Iterator[JobHarness]:
    # the module as written: Kafka in and out, the functions behind an HTTP endpoint
    with JobHarness(KAFKA_SHOP, functions=kafka_shop.functions, checkpoints=True) as harness:
        yield harness


def test_kafka_cart_events_are_committed_by_checkpoints(kafka_cart: JobHarness) -> None:
    commands = kafka_cart.ingress("shop/commands")
    commands.send("pear", {"op": "restock", "qty": 1}, topic="shop-inventory")
    kafka_cart.run_until_idle()
    commands.send("erin", {"op": "add", "item": "pear", "qty": 1}, topic="shop-carts")
    kafka_cart.run_until_idle()
    commands.send("fred", {"op": "add", "item": "pear", "qty": 1}, topic="shop-carts")
    kafka_cart.run_until_idle()
    assert events(kafka_cart) == []  # exactly-once: nothing before a checkpoint commits
    kafka_cart.checkpoint()
    assert events(kafka_cart) == [
        ("pear", {"event": "stock", "item": "pear", "stock": 1, "why": "restock"}),
        ("pear", {"event": "stock", "item": "pear", "stock": 0, "why": "reserve"}),
        ("erin", {"event": "reserved", "user": "erin", "item": "pear"}),
        ("fred", {"event": "out-of-stock", "user": "fred", "item": "pear"}),
    ]
    kafka_cart.egress("shop/events").clear()
    kafka_cart.advance(kafka_shop.CART_TIMEOUT)
    kafka_cart.checkpoint()
    assert events(kafka_cart) == [
        ("erin", {"event": "expired", "user": "erin", "items": {"pear": 1}}),
        ("pear", {"event": "stock", "item": "pear", "stock": 1, "why": "release"}),
    ]


def test_kafka_cart_events_stay_exactly_once_across_a_crash(kafka_cart: JobHarness) -> None:
    commands = kafka_cart.ingress("shop/commands")
    commands.send("pear", {"op": "restock", "qty": 2}, topic="shop-inventory")
    commands.send("erin", {"op": "add", "item": "pear", "qty": 1}, topic="shop-carts")
    kafka_cart.run_until_idle()
    kafka_cart.checkpoint()
    commands.send("fred", {"op": "add", "item": "pear", "qty": 1}, topic="shop-carts")
    kafka_cart.run_until_idle()
    assert kafka_cart.state("shop/inventory", "pear") == {"stock": 0}
    kafka_cart.crash_and_restore()  # fred's command is read again; its first effects are gone
    kafka_cart.checkpoint()
    assert [(key, event["event"]) for key, event in events(kafka_cart)] == [
        ("pear", "stock"),
        ("pear", "stock"),
        ("erin", "reserved"),
        ("pear", "stock"),
        ("fred", "reserved"),
    ]
    assert kafka_cart.state("shop/inventory", "pear") == {"stock": 0}
    # both carts' expiry timers survived the crash (erin's in the checkpoint, fred's re-armed)
    kafka_cart.advance(kafka_shop.CART_TIMEOUT)
    assert kafka_cart.state("shop/inventory", "pear") == {"stock": 2}
    assert kafka_cart.state("shop/cart", "erin") == {}
    assert kafka_cart.state("shop/cart", "fred") == {}
