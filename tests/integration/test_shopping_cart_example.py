"""examples/shopping-cart as its README runs it: orders, then checkout.jsonl restored from the
first run's checkpoints; and a message of the wrong type is an error, never silence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import free_port
from tests.integration.test_examples import wait_http

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "shopping-cart"
STATEFUN = [sys.executable, "-m", "statefun"]


def receipts(out: str) -> list[dict[str, object]]:
    return [json.loads(line)["value"] for line in out.splitlines()]


def run_until(args: list[str], cwd: Path, wanted: int, env: dict[str, str]) -> str:
    """`statefun run ARGS` until it printed ``wanted`` receipts, then SIGTERM (the job stops
    with a last checkpoint, which holds what they came from); its stdout."""
    process = subprocess.Popen(
        [*STATEFUN, "run", *args], cwd=cwd, stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if len(lines) == wanted:
            break
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    return "".join(lines) + rest


def test_cart_expiry_is_long_by_default_and_checkout_jsonl_checks_out(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SHOP_CART_TIMEOUT_SECONDS"}
    checkpoints = f"checkpoint_dir={tmp_path / 'checkpoints'}"
    first = run_until(["module.yaml", "--set", checkpoints], EXAMPLE, 1, env)
    # Only carol's reservation fails at once; alice's and bob's carts wait for 5 minutes.
    assert receipts(first) == [{"event": "out-of-stock", "user": "carol", "item": "pear"}]
    second = run_until(["checkout.yaml", "--set", checkpoints], EXAMPLE, 1, env)
    assert receipts(second) == [{"event": "checkout", "user": "alice", "items": {"apple": 2}}]


def test_a_message_of_the_wrong_type_is_an_error(tmp_path: Path) -> None:
    port = free_port()
    module = tmp_path / "module.yaml"
    module.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: shop/*\n"
        f"  module: {EXAMPLE / 'functions.py'}:functions\n"
        f"---\nkind: io.pystatefun.http.v1/ingress\nspec:\n  id: shop/http\n  port: {port}\n"
        "---\nkind: io.pystatefun.stdout.v1/egress\nspec:\n  id: shop/receipts\n"
    )
    runtime = subprocess.Popen(
        [*STATEFUN, "run", str(module)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    order = '{"op": "add", "item": "apple", "qty": 1}'

    def send(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*STATEFUN, "send", *args, "--url", url, "--timeout", "20"],
            capture_output=True,
            text=True,
            timeout=30,
        )

    try:
        wait_http(f"{url}/health")
        # Waiting for an answer: the answer is the error; the job goes on.
        called = send("shop/cart/dave", order, "--call")
        assert called.returncode == 0, called.stderr
        assert called.stdout == (
            "error: shop/cart/dave takes shop/Command messages (JSON; statefun send --typename "
            "shop/Command), got a io.statefun.types/string\n"
        )
        called = send("shop/cart/dave", '{"op": "buy"}', "--call", "--typename", "shop/Command")
        assert called.stdout.startswith("error: shop/cart has no operation 'buy'; it has add, ")
        ok = send("shop/cart/dave", '{"op": "checkout"}', "--call", "--typename", "shop/Command")
        assert ok.stdout == "checkout: ok\n"
        # Nobody waits: the function raises and the runtime says so (and, by default, stops).
        assert send("shop/cart/dave", order).returncode == 0
        _, err = runtime.communicate(timeout=30)
    finally:
        if runtime.poll() is None:
            runtime.kill()
            runtime.communicate()
    assert runtime.returncode == 1
    assert (
        "function shop/cart failed on 'dave': TypeError: shop/cart/dave takes shop/Command "
        "messages" in err
    )
