"""One bad HTTP request does not stop `statefun run`: real processes, checkpoints on."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._support import free_port
from tests.integration.test_examples import ROOT, STATEFUN, wait_http

pytestmark = pytest.mark.timeout(120)


def post(url: str, text: str) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=text.encode(), headers={"Content-Type": "text/plain"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def function_server() -> Iterator[int]:
    port = free_port()
    server = subprocess.Popen(
        [*STATEFUN, "serve", "examples.greeter.functions:functions", "--port", str(port)],
        cwd=ROOT,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        yield port
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)


def start_runtime(module: Path, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *STATEFUN,
            "run",
            str(module),
            "--set",
            f"checkpoint_dir={tmp_path / 'checkpoints'}",
            "--set",
            f"dead_letter_path={tmp_path / 'dead.jsonl'}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(runtime: subprocess.Popen[str]) -> str:
    if runtime.poll() is None:
        runtime.send_signal(signal.SIGTERM)
    _, err = runtime.communicate(timeout=30)
    return err


def test_a_message_to_a_type_nobody_serves_does_not_stop_the_job(
    function_server: int, tmp_path: Path
) -> None:
    """`functions: example/*`; a message to example/typo is answered 202, the function server
    answers 404: it becomes a dead letter, the job goes on, and starting it again works."""
    ingress_port = free_port()
    template = (ROOT / "examples/greeter/module.yaml").read_text()
    module = tmp_path / "module.yaml"
    module.write_text(
        template.replace("127.0.0.1:8000", f"127.0.0.1:{function_server}").replace(
            "port: 8090", f"port: {ingress_port}"
        )
    )
    url = f"http://127.0.0.1:{ingress_port}"
    runtime = start_runtime(module, tmp_path)
    try:
        wait_http(f"{url}/health")
        assert post(f"{url}/messages/example/typo/x", "hi")[0] == 202
        started = time.monotonic()
        status, text = post(f"{url}/call/example/typo/y", "hi")
        assert status == 422 and "HTTP 404" in text, text
        assert time.monotonic() - started < 20  # not the 30 s reply timeout
        assert post(f"{url}/call/example/greeter/Ada", "hi") == (
            200,
            "Hello Ada! Nice to meet you.",
        )
        assert runtime.poll() is None
    finally:
        err = stop(runtime)
    assert runtime.returncode == 0, err
    # started again from its checkpoint: nothing replays into a failure
    runtime = start_runtime(module, tmp_path)
    try:
        wait_http(f"{url}/health")
        assert post(f"{url}/call/example/greeter/Ada", "hi")[0] == 200
        assert runtime.poll() is None
    finally:
        err = stop(runtime)
    assert runtime.returncode == 0, err
    records = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert [(r["seq"], r["target"], r["id"]) for r in records] == [
        (1, "example/typo", "x"),
        (2, "example/typo", "y"),
    ]
    listed = subprocess.run(
        [*STATEFUN, "dead-letters", "list", "--file", str(tmp_path / "dead.jsonl")],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.splitlines()
    assert len(listed) == 2 and "example/typo/x" in listed[0] and "HTTP 404" in listed[0]
