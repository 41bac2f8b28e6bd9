"""Savepoints (rescaling, lost function types) and the HTTP ingress's write-ahead log."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from statefun._exceptions import ConfigurationError, JobFailedError
from statefun._settings import Settings
from statefun.checkpoint import SimulatedCrash
from statefun.egress.file import FileSink
from statefun.ingress.file import FileSource
from statefun.ingress.http import HttpSource
from statefun.module._specs import EmbeddedEndpointSpec, FunctionTarget, ModuleSpec
from statefun.runtime import Job
from tests.integration.test_checkpoints import embedded, expected, output, write_input

pytestmark = pytest.mark.timeout(120)


def job_with(tmp: Path, parallelism: int, endpoint: Any = None, **settings: Any) -> Job:
    options = {
        "checkpoint_dir": str(tmp / "checkpoints"),
        "dead_letter_path": str(tmp / "dead-letters.jsonl"),
        "checkpoint_interval_ms": 10,
        "parallelism": parallelism,
        "max_in_flight_messages": 64,
        "max_in_flight_remote_messages": 64,
        **settings,
    }
    return Job(
        ModuleSpec(endpoints=(endpoint or embedded(),)),
        Settings(**options),
        sources=[FileSource("test/in", tmp / "in.jsonl")],
        sinks=[FileSink("test/out", tmp / "out.jsonl")],
    )


async def take_savepoint_midway(tmp: Path) -> Path:
    """Run until the first periodic checkpoint, take a savepoint, then 'crash'."""
    job = job_with(tmp, parallelism=2)
    holder: dict[str, Path] = {}

    def hook(name: str, checkpoint_id: int) -> None:
        if name == "committed" and checkpoint_id == 1:
            asyncio.get_running_loop().create_task(savepoint())

    async def savepoint() -> None:
        assert job.checkpoints is not None
        done = await job.checkpoints.checkpoint(savepoint=True)
        holder["path"] = done.path
        job._crashed = True  # stop as if killed, right after the savepoint
        job.fail(SimulatedCrash("stop after the savepoint"))

    job.checkpoint_hook = hook
    with pytest.raises(JobFailedError):
        await job.run()
    return holder["path"]


async def test_savepoint_restores_with_another_parallelism(tmp_path: Path) -> None:
    write_input(tmp_path / "in.jsonl", ids=30, per_id=600)
    savepoint = await take_savepoint_midway(tmp_path)
    assert savepoint.name.startswith("sp-") and (savepoint / "_metadata").is_file()
    # Start elsewhere: no checkpoints of the first run, only the savepoint.
    other = tmp_path / "other"
    other.mkdir()
    (other / "in.jsonl").write_bytes((tmp_path / "in.jsonl").read_bytes())
    written = tmp_path / "out.jsonl"  # none yet when the savepoint came before any output
    if written.exists():
        (other / "out.jsonl").write_bytes(written.read_bytes())
    job = job_with(other, parallelism=3)
    job.restore_from = savepoint
    await job.run()
    assert output(other / "out.jsonl") == expected(30, 600)


async def test_savepoint_with_state_of_a_lost_function_type(tmp_path: Path) -> None:
    write_input(tmp_path / "in.jsonl", ids=5, per_id=600)
    savepoint = await take_savepoint_midway(tmp_path)
    # A module whose endpoint serves nothing of namespace "test".
    other = EmbeddedEndpointSpec(
        FunctionTarget("elsewhere", None), "tests.integration.fns.shop:functions"
    )
    job = job_with(tmp_path / "x", parallelism=1, endpoint=other, checkpoint_dir="")
    job.sources = []
    job.sinks = {}
    job.restore_from = savepoint
    with pytest.raises(
        ConfigurationError, match=r"test/counter \(5 address\(es\)\).*--allow-dropping-state"
    ):
        await job.run()
    job = job_with(tmp_path / "y", parallelism=1, endpoint=other, checkpoint_dir="")
    job.sources = []
    job.sinks = {}
    job.restore_from = savepoint
    job.allow_dropping_state = True
    await job.run()
    assert job.state.key_groups() == []


def test_savepoint_cli_list_and_inspect(tmp_path: Path) -> None:
    write_input(tmp_path / "in.jsonl", ids=4, per_id=600)
    savepoint = asyncio.run(take_savepoint_midway(tmp_path))
    statefun = [sys.executable, "-m", "statefun"]
    listing = subprocess.run(
        [*statefun, "savepoint", "list", str(savepoint.parent)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(r"savepoint\s+\d+\s+\S+ \S+\s+" + re.escape(str(savepoint)), listing)
    described = json.loads(
        subprocess.run(
            [*statefun, "savepoint", "inspect", str(savepoint)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert described["savepoint"] is True
    assert described["addresses_with_state"]["test/counter"] == 4
    assert described["positions"]["test/in"]["line"] > 0


# -- the HTTP ingress's write-ahead log ---------------------------------------------------


def http_job(tmp: Path) -> tuple[Job, HttpSource]:
    job = Job(
        ModuleSpec(endpoints=(embedded(),)),
        Settings(checkpoint_dir=str(tmp / "checkpoints"), checkpoint_interval_ms=20),
        sinks=[FileSink("test/out", tmp / "out.jsonl")],
    )
    source = HttpSource("test/http", port=0, replies=job.replies, wal_dir=tmp / "wal")
    job.sources = [source]
    return job, source


async def wait_port(source: HttpSource) -> str:
    for _ in range(500):
        if source.port and source.accepting:
            return source.url
        await asyncio.sleep(0.01)
    raise AssertionError("the HTTP ingress did not start taking requests")


async def test_acknowledged_messages_survive_a_crash_exactly_once(tmp_path: Path) -> None:
    job, source = http_job(tmp_path)
    crash_now = asyncio.Event()

    def hook(name: str, checkpoint_id: int) -> None:
        if name == "cut" and crash_now.is_set():
            raise SimulatedCrash("crash with acknowledged messages after the last checkpoint")

    job.checkpoint_hook = hook
    running = asyncio.create_task(job.run())
    url = await wait_port(source)
    acked = 0
    headers = {"Content-Type": "text/plain"}
    async with aiohttp.ClientSession() as http:
        for n in range(60):
            if n == 40:
                crash_now.set()
            try:
                async with http.post(
                    f"{url}/messages/test/counter/a", data=str(n), headers=headers
                ) as r:
                    if r.status == 202:
                        acked += 1
            except aiohttp.ClientError:
                break
    with pytest.raises(JobFailedError):
        await running
    assert acked >= 40
    # Restart on the same WAL and checkpoints: every acknowledged message counts once.
    job, source = http_job(tmp_path)
    running = asyncio.create_task(job.run())
    await wait_port(source)
    for _ in range(200):
        if job.pending == 0 and source.position >= acked:
            break
        await asyncio.sleep(0.02)
    job.stop()
    await running
    seen = output(tmp_path / "out.jsonl")
    final = max(int(v.split("=")[1]) for v in seen)
    assert final >= acked
    assert seen == Counter(f"a={n}" for n in range(1, final + 1))


async def test_call_reply_is_released_when_its_checkpoint_completes(tmp_path: Path) -> None:
    job, source = http_job(tmp_path)
    running = asyncio.create_task(job.run())
    url = await wait_port(source)
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{url}/call/test/counter/b", data="x", headers={"Content-Type": "text/plain"}
        ) as r,
    ):
        assert r.status == 200 and await r.text() == "1"
    assert job.checkpoints is not None and job.checkpoints.completed >= 1
    job.stop()
    await running


async def test_a_held_reply_asks_for_a_checkpoint(tmp_path: Path) -> None:
    """With checkpoints a minute apart, a call still gets its reply at once: the held reply
    asks for a checkpoint within reply_checkpoint_delay_ms."""
    job = Job(
        ModuleSpec(endpoints=(embedded(),)),
        Settings(checkpoint_dir=str(tmp_path / "checkpoints"), checkpoint_interval_ms=60_000),
        sinks=[FileSink("test/out", tmp_path / "out.jsonl")],
    )
    source = HttpSource("test/http", port=0, replies=job.replies, log_calls=False)
    job.sources = [source]
    running = asyncio.create_task(job.run())
    url = await wait_port(source)
    headers = {"Content-Type": "text/plain"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for expected in ("1", "2", "3"):
            async with http.post(f"{url}/call/test/counter/b", data="x", headers=headers) as r:
                assert r.status == 200 and await r.text() == expected
    assert job.checkpoints is not None and job.checkpoints.completed == 3
    job.stop()
    await running


async def test_calls_outside_the_wal_take_effect_once_a_reply_is_sent(tmp_path: Path) -> None:
    """reply_release=on-checkpoint: calls skip the WAL. A call whose reply arrived has its
    effect in the restored state exactly once; one that got no reply left nothing behind."""

    def call_job() -> tuple[Job, HttpSource]:
        job = Job(
            ModuleSpec(endpoints=(embedded(),)),
            Settings(
                checkpoint_dir=str(tmp_path / "checkpoints"),
                checkpoint_interval_ms=60_000,
                dead_letter_path=str(tmp_path / "dead.jsonl"),
            ),
            sinks=[FileSink("test/out", tmp_path / "out.jsonl")],
        )
        source = HttpSource(
            "test/http", port=0, replies=job.replies, wal_dir=tmp_path / "wal", log_calls=False
        )
        job.sources = [source]
        return job, source

    job, source = call_job()
    crash_now = asyncio.Event()

    def hook(name: str, checkpoint_id: int) -> None:
        if name == "cut" and crash_now.is_set():
            raise SimulatedCrash("crash while a call waits for its checkpoint")

    job.checkpoint_hook = hook
    running = asyncio.create_task(job.run())
    url = await wait_port(source)
    headers = {"Content-Type": "text/plain"}
    replies: list[str] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for n in range(12):
            if n == 10:
                crash_now.set()
            try:
                async with http.post(f"{url}/call/test/counter/c", data="x", headers=headers) as r:
                    if r.status == 200:
                        replies.append(await r.text())
            except aiohttp.ClientError:
                break
    with pytest.raises(JobFailedError):
        await running
    assert replies == [str(n) for n in range(1, 11)]
    assert source.position == 0  # nothing went through the WAL
    # Restart: the next call sees exactly the ten calls that were answered.
    job, source = call_job()
    running = asyncio.create_task(job.run())
    url = await wait_port(source)
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.post(f"{url}/call/test/counter/c", data="x", headers=headers) as r,
    ):
        assert r.status == 200 and await r.text() == "11"
    job.stop()
    await running


def test_savepoint_cli_list_searches_subfolders_and_says_when_none(tmp_path: Path) -> None:
    """`statefun savepoint list .statefun` finds what is in .statefun/checkpoints and
    .statefun/savepoints; a folder without any says so."""
    write_input(tmp_path / "in.jsonl", ids=4, per_id=600)
    savepoint = asyncio.run(take_savepoint_midway(tmp_path))
    statefun = [sys.executable, "-m", "statefun"]
    listing = subprocess.run(
        [*statefun, "savepoint", "list", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(r"savepoint\s+\d+\s+\S+ \S+\s+" + re.escape(str(savepoint)), listing)
    assert re.search(r"checkpoint\s+\d+\s+\S+ \S+\s+" + re.escape(str(tmp_path)), listing)
    assert savepoint.parent != tmp_path
    empty = tmp_path / "nothing-here"
    (empty / "sub").mkdir(parents=True)
    done = subprocess.run(
        [*statefun, "savepoint", "list", str(empty)], capture_output=True, text=True, check=True
    )
    assert done.stdout == f"no savepoints or checkpoints in {empty} or its subfolders\n"
