"""The test kit driving functions served by Apache StateFun's own SDK (and the 3.5.0 fork) in
their own virtualenvs, over pipes (``SdkProcess``): the examples' functions, which use only
StateFun's SDK names, give the same outcomes there as embedded with this package's SDK."""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest

from statefun.testing import FunctionHarness, SdkProcess

pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SHOP = ROOT / "examples" / "shopping-cart-kafka" / "functions.py"
GREETER = ROOT / "examples" / "greeter" / "functions.py"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def shop_scenario(h: FunctionHarness) -> list[object]:
    command = "shop/Command"
    seen: list[object] = [
        h.send("shop/inventory", "pear", {"op": "restock", "qty": 1}, typename=command),
        h.send("shop/cart", "erin", {"op": "add", "item": "pear", "qty": 1}, typename=command),
        h.send("shop/cart", "fred", {"op": "add", "item": "pear", "qty": 1}, typename=command),
        h.run_until_idle(),
        h.pending_delayed(),
        h.advance(timedelta(seconds=4)),
        h.send("shop/cart", "fred", {"op": "checkout"}, typename=command),
        h.advance(timedelta(seconds=2)),
        h.state("shop/inventory", "pear"),
        h.state("shop/cart", "erin"),
    ]
    return seen


def greeter_scenario(h: FunctionHarness) -> list[object]:
    return [
        h.send("example/greeter", "Ada", "hi"),
        h.call("example/greeter", "Ada", "hi"),
        h.state("example/greeter", "Ada"),
    ]


@pytest.mark.parametrize("peer", ["official_sdk_python", "fork_sdk_python"])
def test_the_examples_give_the_same_outcomes_on_a_peer_sdk(
    peer: str, request: pytest.FixtureRequest
) -> None:
    python = request.getfixturevalue(peer)
    shop = load(SHOP, "compat_testkit_shop")
    greeter = load(GREETER, "compat_testkit_greeter")
    embedded_shop = shop_scenario(FunctionHarness(shop.functions))
    embedded_greeter = greeter_scenario(FunctionHarness(greeter.functions))
    assert embedded_shop[-2] == {"stock": 1}  # erin's reservation expired and was released
    with SdkProcess(python, f"{SHOP}:functions") as served:
        assert sorted(served.typenames) == ["shop/cart", "shop/inventory"]
        harness = FunctionHarness(remote=served, types=[shop.ITEMS, shop.COMMAND])
        assert shop_scenario(harness) == embedded_shop
    with SdkProcess(python, f"{GREETER}:functions") as served:
        assert greeter_scenario(FunctionHarness(remote=served)) == embedded_greeter
