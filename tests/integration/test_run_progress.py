"""``statefun run`` in a process of its own: the progress line (``--progress``, ``--quiet``),
an admin port with a bearer token that ``statefun savepoint create`` sends, and an admin port
beyond loopback without one refused at start."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._support import free_port
from tests.integration.test_http_defences import HANG, MODULE, ROOT, STATEFUN, port_answers

pytestmark = pytest.mark.timeout(120)

TOKEN = "progress-test-token"
PROGRESS = re.compile(
    r"^statefun: [\d,]+ in/s, [\d,]+ out/s, [\d,]+ in flight, "
    r"(checkpoint \d+ [\d.]+ s ago \(\d+ ms\)|no checkpoint yet), [\d,]+ dead letters$"
)


class Runtime:
    def __init__(self, process: subprocess.Popen[bytes], log: Path, port: int, admin: int):
        self.process, self.log, self.port, self.admin = process, log, port, admin

    def send(self, name: str) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/messages/example/greeter/{name}",
            data=b"hi",
            headers={"Content-Type": "text/plain"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=HANG).close()

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()


def start(tmp_path: Path, *options: str) -> Iterator[Runtime]:
    port, admin = free_port(), free_port()
    module = tmp_path / "module.yaml"
    module.write_text(MODULE.format(port=port, extra=""))
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                *STATEFUN,
                "run",
                str(module),
                "--set",
                f"checkpoint_dir={tmp_path / 'checkpoints'}",
                "--set",
                f"savepoint_dir={tmp_path / 'savepoints'}",
                "--set",
                "checkpoint_interval_ms=100",
                "--set",
                f"admin_port={admin}",
                "--set",
                "progress_interval_ms=200",
                *options,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, "PYSTATEFUN_ADMIN_TOKEN": TOKEN},
        )
    try:
        deadline = time.monotonic() + HANG
        while not (port_answers(port) and port_answers(admin)):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the runtime did not start"
            time.sleep(0.05)
        yield Runtime(process, log, port, admin)
    finally:
        process.terminate()
        process.wait(timeout=HANG)


def wait_for(check: object, runtime: Runtime) -> None:
    deadline = time.monotonic() + HANG
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, runtime.log.read_text()
        time.sleep(0.05)


@pytest.fixture
def progress(tmp_path: Path) -> Iterator[Runtime]:
    yield from start(tmp_path, "--progress")


def test_progress_lines_show_rates_checkpoints_and_dead_letters(progress: Runtime) -> None:
    for name in ("Ada", "Bob", "Cy"):
        progress.send(name)

    def moving() -> bool:
        return any(
            PROGRESS.match(line) and not line.startswith("statefun: 0 in/s")
            for line in progress.lines()
        )

    wait_for(moving, progress)
    wait_for(
        lambda: any("checkpoint" in line and "s ago" in line for line in progress.lines()), progress
    )
    shown = [line for line in progress.lines() if line.startswith("statefun: ")]
    assert all(PROGRESS.match(line) for line in shown), shown
    assert any(line.endswith(", 0 dead letters") for line in shown)


def test_savepoint_create_sends_the_admin_token(tmp_path: Path) -> None:
    for runtime in start(tmp_path, "--set", f"admin_token={TOKEN}", "--quiet"):
        url = f"http://127.0.0.1:{runtime.admin}"
        created = subprocess.run(
            [*STATEFUN, "savepoint", "create", "--admin-url", url],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYSTATEFUN_ADMIN_TOKEN": TOKEN},
            timeout=HANG,
        )
        assert created.returncode == 0, created.stderr
        assert Path(created.stdout.strip()).is_dir()
        env = {k: v for k, v in os.environ.items() if k != "PYSTATEFUN_ADMIN_TOKEN"}
        refused = subprocess.run(
            [*STATEFUN, "savepoint", "create", "--admin-url", url],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=HANG,
        )
        assert refused.returncode == 1
        assert "HTTP 401" in refused.stderr and TOKEN not in refused.stderr
        time.sleep(0.5)  # two intervals: --quiet prints no progress line, logs no INFO
        assert not [line for line in runtime.lines() if "statefun: " in line or "INFO" in line]
        assert TOKEN not in runtime.log.read_text()


def test_no_progress_line_when_stderr_is_no_terminal(tmp_path: Path) -> None:
    for runtime in start(tmp_path):
        runtime.send("Ada")
        time.sleep(0.6)
        assert not [line for line in runtime.lines() if line.startswith("statefun: ")]


def test_admin_beyond_loopback_without_a_token_is_refused_at_start(tmp_path: Path) -> None:
    module = tmp_path / "module.yaml"
    module.write_text(MODULE.format(port=free_port(), extra=""))
    env = {k: v for k, v in os.environ.items() if k != "PYSTATEFUN_ADMIN_TOKEN"}
    refused = subprocess.run(
        [
            *STATEFUN,
            "run",
            str(module),
            "--set",
            f"admin_port={free_port()}",
            "--set",
            "admin_host=0.0.0.0",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=HANG,
    )
    assert refused.returncode == 2
    errors = refused.stderr.strip().splitlines()
    assert len(errors) == 1 and "admin_token" in errors[0] and "--insecure-admin" in errors[0]
