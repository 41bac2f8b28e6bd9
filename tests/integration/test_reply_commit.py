"""reply_release=on-checkpoint: when the checkpoint that releases a held reply starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from statefun._settings import Settings
from statefun.ingress.http import HttpSource
from statefun.module._specs import ModuleSpec
from statefun.runtime import Job
from tests.integration.test_checkpoints import embedded
from tests.integration.test_savepoints_and_wal import wait_port

pytestmark = pytest.mark.timeout(120)


def call_job(tmp: Path, **settings: int | str) -> tuple[Job, HttpSource]:
    job = Job(
        ModuleSpec(endpoints=(embedded(),)),
        Settings(
            checkpoint_dir=str(tmp / "checkpoints"),
            dead_letter_path=str(tmp / "dead.jsonl"),
            reply_release="on-checkpoint",
            **settings,
        ),
    )
    source = HttpSource("test/http", port=0, replies=job.replies, log_calls=False)
    job.sources = [source]
    return job, source


async def test_a_lone_call_is_committed_at_once(tmp_path: Path) -> None:
    """A held reply with nothing else in flight starts its checkpoint at once: neither the
    group-commit wait (reply_checkpoint_delay_ms) nor the interval, both ten minutes here,
    hold it back. Each call gets a checkpoint of its own."""
    job, source = call_job(
        tmp_path, checkpoint_interval_ms=600_000, reply_checkpoint_delay_ms=600_000
    )
    running = asyncio.create_task(job.run())
    url = await wait_port(source)
    headers = {"Content-Type": "text/plain"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for n in (1, 2, 3):
            async with http.post(f"{url}/call/test/counter/a", data="x", headers=headers) as r:
                assert r.status == 200 and await r.text() == str(n)
            assert job.checkpoints is not None and job.checkpoints.completed == n
    job.stop()
    await running


async def test_old_checkpoints_are_still_deleted(tmp_path: Path) -> None:
    """Deleting the checkpoints beyond checkpoints_retained runs beside the next checkpoint,
    after the replies; once the job stopped, only the retained ones are left."""
    job, source = call_job(tmp_path, checkpoint_interval_ms=600_000, checkpoints_retained=2)
    running = asyncio.create_task(job.run())
    url = await wait_port(source)
    headers = {"Content-Type": "text/plain"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for n in range(1, 7):
            async with http.post(f"{url}/call/test/counter/a", data="x", headers=headers) as r:
                assert r.status == 200 and await r.text() == str(n)
    job.stop()
    await running
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("chk-"))
    assert job.checkpoints is not None and job.checkpoints.completed == 7  # and the last one
    assert left == ["chk-000006", "chk-000007"]
