"""The admin server of a running job (`statefun run` in a process of its own) against what a
web page in a browser could send it, and against a burst of savepoint requests."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests._support import free_port
from tests.integration.test_http_defences import HANG, MODULE, ROOT, STATEFUN, port_answers

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(admin URL, savepoint folder) of a running job with checkpoints on."""
    port, admin_port = free_port(), free_port()
    module = tmp_path / "module.yaml"
    module.write_text(MODULE.format(port=port, extra=""))
    savepoints = tmp_path / "savepoints"
    log = (tmp_path / "runtime.log").open("w")
    process = subprocess.Popen(
        [
            *STATEFUN,
            "run",
            str(module),
            "--set",
            f"checkpoint_dir={tmp_path / 'checkpoints'}",
            "--set",
            f"savepoint_dir={savepoints}",
            "--set",
            f"admin_port={admin_port}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + HANG
        while not port_answers(admin_port):
            assert process.poll() is None, (tmp_path / "runtime.log").read_text()
            assert time.monotonic() < deadline, "the admin server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{admin_port}", savepoints
    finally:
        process.terminate()
        process.wait(timeout=HANG)
        log.close()


def taken(savepoints: Path) -> int:
    return len(list(savepoints.iterdir())) if savepoints.is_dir() else 0


async def test_cross_site_requests_take_no_savepoints(admin: tuple[str, Path]) -> None:
    url, savepoints = admin
    statuses: Counter[int] = Counter()
    async with aiohttp.ClientSession() as http:

        async def post(headers: dict[str, str], data: bytes = b"x") -> None:
            async with http.post(f"{url}/savepoints", data=data, headers=headers) as response:
                statuses[response.status] += 1
                assert (await response.text()).count("\n") == 1

        forged = [
            # a form or fetch() of another site: its Origin
            {"Origin": "http://evil.example", "Content-Type": "text/plain"},
            {"Origin": "http://evil.example", "Content-Type": "application/json"},
            {"Origin": "null", "Content-Type": "application/x-www-form-urlencoded"},
            # a page whose name was rebound to 127.0.0.1: another Host
            {"Host": "evil.example", "Content-Type": "application/json"},
            # a "simple" request without Origin (old browsers, plugins): not JSON
            {"Content-Type": "text/plain"},
        ]
        for _ in range(60):
            await asyncio.gather(*(post(headers) for headers in forged))
        assert sum(statuses.values()) == 300
        assert set(statuses) == {403, 421, 415}, statuses
        # the job's own origin and a JSON body are fine
        origin = url.replace("127.0.0.1", "localhost")
        async with http.post(
            f"{url}/savepoints",
            data=b"{}",
            headers={"Origin": origin, "Content-Type": "application/json"},
        ) as response:
            assert response.status == 200, await response.text()
    assert taken(savepoints) == 1


async def test_a_burst_of_savepoint_requests_takes_a_bounded_number(
    admin: tuple[str, Path],
) -> None:
    url, savepoints = admin
    statuses: Counter[int] = Counter()
    retry_after: set[str] = set()
    start = time.monotonic()
    async with aiohttp.ClientSession() as http:

        async def post() -> None:
            headers = {"Content-Type": "application/json"}
            async with http.post(f"{url}/savepoints", data=b"{}", headers=headers) as response:
                statuses[response.status] += 1
                if response.status == 429:
                    retry_after.add(response.headers["Retry-After"])

        for _ in range(15):  # 300 requests in 15 waves, 0.1 s apart
            await asyncio.gather(*(post() for _ in range(20)))
            await asyncio.sleep(0.1)
    elapsed = time.monotonic() - start
    print(f"\n300 savepoint requests in {elapsed:.1f}s: {dict(statuses)}")
    assert set(statuses) == {200, 429}, statuses
    assert statuses[200] <= elapsed / 1.0 + 1  # admin_savepoint_min_interval_ms: 1 s
    assert taken(savepoints) == statuses[200]
    assert retry_after and all(value.isdigit() and int(value) >= 1 for value in retry_after)


def test_the_savepoint_command_still_works(admin: tuple[str, Path]) -> None:
    url, savepoints = admin
    done = subprocess.run(
        [*STATEFUN, "savepoint", "create", "--admin-url", url],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == savepoints
    assert taken(savepoints) == 1
