"""The examples and the CLI, as a user runs them: real processes, real HTTP on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._support import free_port

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
STATEFUN = [sys.executable, "-m", "statefun"]


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_shopping_cart_runs_to_completion() -> None:
    done = subprocess.run(
        [*STATEFUN, "run", "examples/shopping-cart/module.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SHOP_CART_TIMEOUT_SECONDS": "2"},
    )
    assert done.returncode == 0, done.stderr
    receipts = [json.loads(line)["value"] for line in done.stdout.splitlines()]
    assert sorted(receipts, key=json.dumps) == sorted(
        [
            {"event": "out-of-stock", "user": "carol", "item": "pear"},
            {"event": "expired", "user": "alice", "items": {"apple": 2}},
            {"event": "expired", "user": "bob", "items": {"apple": 1, "pear": 1}},
        ],
        key=json.dumps,
    )
    assert "plan: 1 ingress(es) -> router" in done.stderr


def test_plan_prints_text_and_dot() -> None:
    text = subprocess.run(
        [*STATEFUN, "plan", "module.yaml", "--parallelism", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "dispatcher 2/3" in text and "feedback" in text
    dot = subprocess.run(
        [*STATEFUN, "plan", "module.yaml", "--format", "dot"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert dot.startswith("digraph job {") and '"dispatcher0" -> "keyby"' in dot


def test_bad_module_yaml_is_a_one_line_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "module.yaml"
    bad.write_text("kind: io.statefun.endpoints.v2/http\nspec:\n  functions: nope\n")
    done = subprocess.run([*STATEFUN, "run", str(bad)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "document 1 (io.statefun.endpoints.v2/http): spec.functions" in done.stderr


@pytest.fixture
def greeter(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    function_port, ingress_port = free_port(), free_port()
    template = (ROOT / "examples/greeter/module.yaml").read_text()
    module = tmp_path / "module.yaml"
    module.write_text(
        template.replace("127.0.0.1:8000", f"127.0.0.1:{function_port}").replace(
            "port: 8090", f"port: {ingress_port}"
        )
    )
    server = subprocess.Popen(
        [*STATEFUN, "serve", "examples.greeter.functions:functions", "--port", str(function_port)],
        cwd=ROOT,
    )
    runtime = subprocess.Popen(
        [*STATEFUN, "run", str(module)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{function_port}/health")
        wait_http(f"http://127.0.0.1:{ingress_port}/health")
        yield ingress_port, runtime
    finally:
        for process in (runtime, server):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        runtime.wait(timeout=20)
        server.wait(timeout=20)


def test_greeter_remote_function_through_the_runtime(
    greeter: tuple[int, subprocess.Popen[str]],
) -> None:
    port, runtime = greeter
    url = f"http://127.0.0.1:{port}"
    replies = [
        subprocess.run(
            [*STATEFUN, "send", "example/greeter/Ada", "hi", "--call", "--url", url],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        for _ in range(2)
    ]
    assert replies == ["Hello Ada! Nice to meet you.", "Hello Ada for the 2nd time!"]
    sent = subprocess.run(
        [*STATEFUN, "send", "example/greeter/Bob", "hi", "--url", url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert sent.returncode == 0 and sent.stdout.startswith("202")
    missing = subprocess.run(
        [*STATEFUN, "send", "nobody/here/x", "hi", "--url", url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    # (the stdout egress is flushed as the job stops)
    runtime.send_signal(signal.SIGTERM)
    out, _ = runtime.communicate(timeout=20)
    assert runtime.returncode == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert {(r["key"], r["value"]) for r in records} == {
        ("Ada", "Hello Ada! Nice to meet you."),
        ("Ada", "Hello Ada for the 2nd time!"),
        ("Bob", "Hello Bob! Nice to meet you."),
    }
    assert all(r["topic"] == "greetings" for r in records)


def test_run_restarts_a_failed_job_from_its_last_checkpoint(tmp_path: Path) -> None:
    """A remote function that stays down past its call timeout fails the job; `statefun run`
    restarts it from the last checkpoint until the function is back, and every effect is
    then in the output once."""
    port = free_port()
    lines = [
        json.dumps({"target": "test/counter", "id": f"k{i % 3}", "value": "x"}) for i in range(30)
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "module.yaml").write_text(
        "kind: io.statefun.endpoints.v2/http\n"
        f"spec:\n  functions: test/*\n  urlPathTemplate: http://127.0.0.1:{port}/statefun\n"
        "  transport:\n    call: 1s\n    connect: 200ms\n"
        "---\nkind: io.pystatefun.file.v1/ingress\nspec:\n  id: test/in\n  path: in.jsonl\n"
        "---\nkind: io.pystatefun.file.v1/egress\nspec:\n  id: test/out\n  path: out.jsonl\n"
    )
    runtime = subprocess.Popen(
        [
            *STATEFUN,
            "run",
            "module.yaml",
            "--set",
            "checkpoint_dir=checkpoints",
            "--set",
            "restart_strategy=fixed-delay",
            "--set",
            "restart_delay_ms=300",
        ],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert runtime.stderr is not None
    log: list[str] = []
    for line in runtime.stderr:  # wait for the first failure and restart
        log.append(line)
        if "restart 1 of" in line:
            break
    server = subprocess.Popen(
        [*STATEFUN, "serve", "tests.integration.fns.shop:functions", "--port", str(port)], cwd=ROOT
    )
    try:
        log.extend(runtime.stderr)
        assert runtime.wait(timeout=60) == 0, "".join(log[-20:])
    finally:
        runtime.stderr.close()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
    text = "".join(log)
    assert "did not answer within its call timeout" in text
    out = [json.loads(line)["value"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(out) == sorted(f"k{k}={n}" for k in range(3) for n in range(1, 11))
