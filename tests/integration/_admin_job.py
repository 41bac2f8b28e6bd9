"""A running job (``statefun run`` in a process of its own) with its admin port, for the tests
of the admin port's views: the shop functions of ``fns/inspect_fns.py`` behind an HTTP
ingress, checkpoints on."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests._support import endpoint_yaml, free_port
from tests.integration.test_http_defences import HANG, ROOT, STATEFUN, port_answers

EMBEDDED = """\
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: shop/*
  module: tests.integration.fns.inspect_fns:functions
"""
MODULE = """\
{endpoint}---
kind: io.pystatefun.http.v1/ingress
spec:
  id: shop/http
  port: {port}
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: shop/out
"""


@dataclass
class AdminJob:
    admin: str  # http://127.0.0.1:<admin port>
    ingress: str
    folder: Path

    def send(self, address: str, body: str) -> None:
        """POST one message; a ``503`` (not accepted: the job has no room yet, as on a loaded
        machine) is sent again after its ``Retry-After``, as a client does, for up to 30 s."""
        deadline = time.monotonic() + 30
        while True:
            request = urllib.request.Request(
                f"{self.ingress}/messages/{address}",
                data=body.encode(),
                headers={"Content-Type": "text/plain"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=HANG) as response:
                    assert response.status == 202
                    return
            except urllib.error.HTTPError as exc:
                reason = exc.read().decode(errors="replace")
                if exc.code != 503 or time.monotonic() > deadline:
                    raise AssertionError(f"{exc.code} for {address}: {reason}") from exc
                time.sleep(min(float(exc.headers.get("Retry-After") or 1), 1.0))


@contextmanager
def admin_job(folder: Path, *settings: str, remote: str | None = None) -> Iterator[AdminJob]:
    """The job, its functions embedded, or at ``remote`` (a function server's URL)."""
    port, admin_port = free_port(), free_port()
    folder.mkdir(parents=True, exist_ok=True)
    module = folder / "module.yaml"
    endpoint = EMBEDDED
    if remote is not None:
        endpoint = endpoint_yaml(Path(), remote, "shop")
    module.write_text(MODULE.format(port=port, endpoint=endpoint))
    extra = [part for pair in settings for part in ("--set", pair)]
    log = (folder / "runtime.log").open("w")
    process = subprocess.Popen(
        [
            *STATEFUN,
            "run",
            str(module),
            "--set",
            f"checkpoint_dir={folder / 'checkpoints'}",
            "--set",
            f"savepoint_dir={folder / 'savepoints'}",
            "--set",
            f"admin_port={admin_port}",
            "--set",
            "checkpoint_interval_ms=500",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + HANG
        while not (port_answers(admin_port) and port_answers(port)):
            assert process.poll() is None, (folder / "runtime.log").read_text()
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.05)
        yield AdminJob(f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{port}", folder)
    finally:
        process.terminate()
        process.wait(timeout=HANG)
        log.close()


def wait_for(check: object, what: str) -> None:
    """Poll ``check()`` until it is true (HANG seconds at most)."""
    deadline = time.monotonic() + HANG
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
