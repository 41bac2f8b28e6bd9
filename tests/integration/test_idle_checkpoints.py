"""Early checkpoints when the job goes idle with exactly-once output waiting (in one process).

With a long ``checkpoint_interval_ms``, output of an exactly-once egress would wait for the
interval; ``idle_checkpoint_delay_ms`` commits it once the job has nothing left in flight.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statefun._settings import Settings
from statefun.checkpoint import CheckpointCoordinator
from statefun.checkpoint.storage import CheckpointStorage
from statefun.egress.file import FileSink
from statefun.ingress.base import IngressContext, Source
from statefun.module._specs import EmbeddedEndpointSpec, FunctionTarget, ModuleSpec
from statefun.runtime import Job
from statefun.runtime._admin import AdminServer
from statefun.sdk import StringType, TypedValue

pytestmark = pytest.mark.timeout(60)


class Feed(Source):
    """Submits ``(typename, id, command)`` messages, ``every`` seconds apart, then waits for
    the job to stop (an unbounded source)."""

    def __init__(self, messages: list[tuple[str, str, str]], every: float = 0.0) -> None:
        super().__init__("test/feed")
        self.messages = messages
        self.every = every
        self.sent = 0

    async def run(self, context: IngressContext) -> None:
        for typename, id_, command in self.messages:
            value = StringType.serializer().serialize(command)
            await context.submit(typename, id_, TypedValue(StringType.typename, value))
            self.sent += 1
            if self.every:
                await asyncio.sleep(self.every)
        await asyncio.Event().wait()


def make_job(tmp: Path, source: Source, **settings: Any) -> Job:
    options = {
        "checkpoint_dir": str(tmp / "checkpoints"),
        "dead_letter_path": str(tmp / "dead-letters.jsonl"),
        "checkpoint_interval_ms": 600_000,  # never within a test: only early checkpoints run
        **settings,
    }
    endpoint = EmbeddedEndpointSpec(
        FunctionTarget("test", None), "tests.integration.fns.shop:functions"
    )
    return Job(
        ModuleSpec(endpoints=(endpoint,)),
        Settings(**options),
        sources=[source],
        sinks=[FileSink("test/out", tmp / "out.jsonl")],
    )


def lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["value"] for line in path.read_text().splitlines()]


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def counters(n: int) -> list[tuple[str, str, str]]:
    return [("test/counter", f"k{i % 7}", "x") for i in range(n)]


async def test_output_is_committed_once_the_job_is_idle(tmp_path: Path) -> None:
    job = make_job(tmp_path, Feed(counters(300)))
    task = asyncio.create_task(job.run())
    await until(lambda: len(lines(tmp_path / "out.jsonl")) == 300)
    # (the output is visible from the egress's commit on, a few steps before the checkpoint
    # records its figures)
    await until(lambda: job.checkpoints is not None and job.checkpoints.last_cpu_ms > 0)
    status = AdminServer(job, 0).status()["checkpoints"]
    assert status["completed"] >= 1
    # (the status rounds to 0.01 ms: a small checkpoint's CPU time may show as 0.0 there)
    assert job.checkpoints is not None and job.checkpoints.last_cpu_ms > 0
    assert status["last_duration_ms"] >= status["last_cpu_ms"] >= 0
    assert sorted(lines(tmp_path / "out.jsonl")) == sorted(
        f"k{k}={n}" for k in range(7) for n in range(1, len(range(k, 300, 7)) + 1)
    )
    job.stop()
    await task


async def test_off_output_waits_for_the_interval(tmp_path: Path) -> None:
    source = Feed(counters(50))
    job = make_job(tmp_path, source, idle_checkpoint_delay_ms=0)
    task = asyncio.create_task(job.run())
    await until(lambda: source.sent == 50 and job.pending == 0)
    await asyncio.sleep(0.5)  # ten idle delays of the default
    assert job.checkpoints is not None and job.checkpoints.completed == 0
    assert lines(tmp_path / "out.jsonl") == []
    job.stop()
    await task  # the final checkpoint commits everything
    assert len(lines(tmp_path / "out.jsonl")) == 50


async def test_no_early_checkpoint_without_waiting_output(tmp_path: Path) -> None:
    # "disarm" changes state and sends nothing to the egress
    source = Feed([("test/reminder", f"r{i}", "disarm") for i in range(50)])
    job = make_job(tmp_path, source)
    task = asyncio.create_task(job.run())
    await until(lambda: source.sent == 50 and job.pending == 0)
    await asyncio.sleep(0.5)
    assert job.checkpoints is not None and job.checkpoints.completed == 0
    job.stop()
    await task


async def test_early_checkpoints_are_spaced_by_their_duration(tmp_path: Path) -> None:
    def slow_write(step: str, checkpoint_id: int) -> None:
        if step == "written":  # in the worker thread: every checkpoint takes 100 ms of CPU
            until = time.thread_time() + 0.1
            while time.thread_time() < until:
                pass

    # idle with output every 20 ms, for ~2 s: without spacing, ~12 checkpoints
    source = Feed(counters(100), every=0.02)
    job = make_job(tmp_path, source)
    job.checkpoint_hook = slow_write
    task = asyncio.create_task(job.run())
    await until(lambda: source.sent == 100 and job.pending == 0)
    assert job.checkpoints is not None
    # each next one starts >= 9 x 100 ms after the previous one ended
    assert 1 <= job.checkpoints.completed <= 3
    job.stop()
    await task
    assert len(lines(tmp_path / "out.jsonl")) == 100


async def test_an_early_checkpoint_waits_for_the_delay(tmp_path: Path) -> None:
    job = make_job(tmp_path, Feed([]))
    storage = CheckpointStorage(str(tmp_path / "checkpoints"), 1)
    coordinator = CheckpointCoordinator(job, storage, interval_ms=600_000)
    taken: list[float] = []

    async def checkpoint(savepoint: bool = False) -> Any:
        taken.append(asyncio.get_running_loop().time())

    coordinator.checkpoint = checkpoint  # type: ignore[method-assign]
    runner = asyncio.create_task(coordinator.run())
    await asyncio.sleep(0)
    asked = asyncio.get_running_loop().time()
    coordinator.request_when_idle(100)
    coordinator.request_when_idle(1)  # asked already: the first due time holds
    await until(lambda: len(taken) == 1, timeout=5)
    assert taken[0] - asked >= 0.1
    await coordinator.stop()
    await runner
