"""End to end: a client retries every HTTP request with its Idempotency-Key until it gets an
answer, while the runtime (``statefun run``, a real process) is killed with SIGKILL at random
moments and restarted. Every request must count exactly once, and every call's answer must be
the reply of the one execution that counted."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests._support import endpoint_yaml, free_port

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ROOT / "tests" / "integration" / "fns" / "shop.py"
STATEFUN = [sys.executable, "-m", "statefun"]


def module_yaml(tmp: Path, port: int) -> None:
    (tmp / "module.yaml").write_text(
        endpoint_yaml(FUNCTIONS, None, namespace="test")
        # the ingress answers a call within 4 s (a 504 saying why), before the client gives up
        + f"---\nkind: io.pystatefun.http.v1/ingress\nspec:\n  id: test/http\n  port: {port}\n"
        + "  replyTimeout: 4s\n"
        + "---\nkind: io.pystatefun.file.v1/egress\nspec:\n  id: test/out\n  path: out.jsonl\n"
    )


def listening(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def run_args(tmp: Path) -> list[str]:
    return [
        *STATEFUN,
        "run",
        str(tmp / "module.yaml"),
        "--set",
        f"checkpoint_dir={tmp / 'checkpoints'}",
        "--set",
        "checkpoint_interval_ms=40",
        "--set",
        f"dead_letter_path={tmp / 'dead.jsonl'}",
    ]


class RetryingClient(threading.Thread):
    """Sends requests one after the other; each is retried with its key until answered."""

    def __init__(self, url: str, requests: list[tuple[str, str]]) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.requests = requests
        self.answers: dict[str, tuple[int, str]] = {}
        self.attempts = 0
        self.error: BaseException | None = None
        self.last_failure = ""  # of the request being retried: why it had no answer

    def run(self) -> None:
        try:
            for path, key in self.requests:
                self.answers[key] = self._until_answered(path, key)
                time.sleep(0.02)  # paced, so that the requests span every crash
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _until_answered(self, path: str, key: str) -> tuple[int, str]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self.attempts += 1
            request = urllib.request.Request(
                self.url + path,
                data=b"x",
                headers={"Content-Type": "text/plain", "Idempotency-Key": key},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, response.read().decode().strip()
            except urllib.error.HTTPError as exc:
                body = exc.read().decode().strip()
                if exc.code not in (503, 504):
                    return exc.code, body
                self.last_failure = f"{exc.code} {body}"
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                # the runtime is down, restarting or died mid-answer: retry with the key
                self.last_failure = repr(exc)
            time.sleep(0.02)
        raise AssertionError(f"no answer for {key} within 120 s; the last: {self.last_failure}")


def test_retries_with_keys_across_sigkills_count_once(tmp_path: Path) -> None:
    seed = int(os.environ.get("PYSTATEFUN_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    port = free_port()
    module_yaml(tmp_path, port)
    clients = [
        RetryingClient(
            f"http://127.0.0.1:{port}",
            [
                (f"/messages/test/counter/m{i}", f"m{i}-{n}")
                if n % 2
                else (f"/call/test/counter/c{i}", f"c{i}-{n}")
                for n in range(300)
            ],
        )
        for i in range(4)
    ]
    for client in clients:
        client.start()
    kills = 0
    for n in range(5):
        with (tmp_path / f"run-{n}.log").open("wb") as logged:
            process = subprocess.Popen(run_args(tmp_path), cwd=tmp_path, stderr=logged)
        time.sleep(rng.uniform(0.7, 1.4))  # starting takes ~0.5 s; then requests flow
        if process.poll() is not None:
            break
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
    final_log = tmp_path / "run-final.log"
    with final_log.open("wb") as logged:
        final = subprocess.Popen(run_args(tmp_path), cwd=tmp_path, stderr=logged)
    try:
        for client in clients:
            client.join(timeout=200)
            assert not client.is_alive(), f"seed {seed}: a client did not finish"
        listening(port)  # its signal handlers are installed once it listens
    finally:
        final.send_signal(signal.SIGTERM)
        final.wait(timeout=60)
    assert final.returncode == 0, f"seed {seed}: {final_log.read_text()[-2000:]}"
    assert kills >= 3, f"seed {seed}"
    for client in clients:
        assert client.error is None, f"seed {seed}: {client.error}\n{final_log.read_text()[-1500:]}"
    assert sum(c.attempts for c in clients) > 1200, f"seed {seed}: no request was retried"
    want: Counter[str] = Counter()
    for i, client in enumerate(clients):
        messages = [key for path, key in client.requests if path.startswith("/messages")]
        calls = [key for path, key in client.requests if path.startswith("/call")]
        assert all(client.answers[key] == (202, "accepted") for key in messages), f"seed {seed}"
        # Each call counted once: the replies are 1..n, in the order the calls were sent.
        replies = [client.answers[key] for key in calls]
        assert replies == [(200, str(n)) for n in range(1, len(calls) + 1)], f"seed {seed}"
        want += Counter(f"m{i}={n}" for n in range(1, len(messages) + 1))
        want += Counter(f"c{i}={n}" for n in range(1, len(calls) + 1))
    out = Counter(
        json.loads(line)["value"] for line in (tmp_path / "out.jsonl").read_text().splitlines()
    )
    assert out == want, f"seed {seed}: missing {want - out}, extra {out - want}"
