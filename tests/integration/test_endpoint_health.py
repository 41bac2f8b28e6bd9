"""A function server that is down: found at start, reported in few lines, explained to callers.

Real function servers on loopback (the SDK's), real closed ports, the real HTTP ingress.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from statefun._settings import Settings
from statefun.ingress.base import IngressContext, Source
from statefun.ingress.http import HttpSource
from statefun.module._specs import (
    EmbeddedEndpointSpec,
    FunctionTarget,
    HttpEndpointSpec,
    HttpIngressSpec,
    ModuleSpec,
    TransportSpec,
)
from statefun.runtime import Job
from statefun.runtime._plan import build_job
from statefun.sdk._serve import start_server
from tests._support import free_port
from tests.integration.fns.shop import functions
from tests.integration.test_runtime import ListSink, string

pytestmark = pytest.mark.timeout(60)


class Idle(Source):
    """Sends nothing and runs until the job stops."""

    def __init__(self) -> None:
        super().__init__("test/idle")

    async def run(self, context: IngressContext) -> None:
        await asyncio.Event().wait()


def remote(namespace: str, url: str, **transport: Any) -> HttpEndpointSpec:
    return HttpEndpointSpec(
        FunctionTarget(namespace, None), url, transport=TransportSpec(**transport)
    )


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= level and r.name.startswith("statefun")
    ]


async def test_an_unreachable_endpoint_is_one_warning_at_start_and_the_job_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()
    module = ModuleSpec(
        endpoints=(
            remote("shop", f"http://127.0.0.1:{port}/statefun"),
            remote("bank", f"http://127.0.0.1:{port}/{{function.name}}"),
            EmbeddedEndpointSpec(
                FunctionTarget("test", None), "tests.integration.fns.shop:functions"
            ),
        )
    )
    job = Job(module, Settings(), sources=[Idle()])
    running = asyncio.create_task(job.run())
    try:
        await until(lambda: any("not reachable" in line for line in lines(caplog)))
        await until(lambda: "job started" in caplog.text)
        assert not running.done()  # the job runs
    finally:
        job.stop()
        await running
    warnings = lines(caplog)
    assert len(warnings) == 1, warnings  # one probe per origin, one line
    (line,) = warnings
    assert f"http://127.0.0.1:{port}/statefun" in line
    assert "shop/*" in line and "bank/*" in line
    assert "ConnectionRefusedError" in line


async def test_a_reachable_endpoint_gives_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with await start_server(functions) as server:
        job = Job(ModuleSpec(endpoints=(remote("test", server.url),)), sources=[Idle()])
        running = asyncio.create_task(job.run())
        await until(lambda: "job started" in caplog.text)
        await asyncio.sleep(0.3)
        job.stop()
        await running
    assert lines(caplog) == []


class Steady(Source):
    """Sends to ``count`` counters over and over until ``stop`` is set."""

    bounded = True

    def __init__(self, count: int) -> None:
        super().__init__("test/steady")
        self.count = count
        self.sent = 0
        self.stop = asyncio.Event()

    async def run(self, context: IngressContext) -> None:
        while not self.stop.is_set():
            for index in range(self.count):
                await context.submit("test/counter", str(index), string("x"))
                self.sent += 1
            await asyncio.sleep(0.005)


async def test_an_outage_of_a_busy_endpoint_logs_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()
    sink = ListSink()
    source = Steady(50)
    module = ModuleSpec(endpoints=(remote("test", f"http://127.0.0.1:{port}/statefun"),))
    server = await start_server(functions, port=port)
    job = Job(module, Settings(), sources=[source], sinks=[sink])
    running = asyncio.create_task(job.run())
    try:
        await until(lambda: len(sink.values) > 500)
        await server.close()  # a 2 s outage while messages keep coming
        await asyncio.sleep(2.0)
        server = await start_server(functions, port=port)
        sent_after = source.sent
        await until(lambda: source.sent > sent_after + 500)
        source.stop.set()
        await asyncio.wait_for(running, 30)
    finally:
        source.stop.set()
        job.stop()
        await server.close()
    assert len(sink.values) == source.sent  # nothing lost
    logged = [line for line in lines(caplog, logging.INFO) if "endpoint" in line]
    # the first failure, at most a count or two, and the recovery: not one per attempt
    assert 2 <= len(logged) <= 5, logged
    assert any("answers again" in line for line in logged), logged
    assert len(lines(caplog)) <= 4, lines(caplog)


async def test_a_state_registered_by_many_concurrent_calls_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    sink = ListSink()
    script = [("test/counter", str(index), "x") for index in range(300)]

    class Burst(Source):
        bounded = True

        async def run(self, context: IngressContext) -> None:
            for typename, id_, text in script:
                await context.submit(typename, id_, string(text))

    async with await start_server(functions) as server:
        job = Job(
            ModuleSpec(endpoints=(remote("test", server.url),)),
            Settings(),
            sources=[Burst("test/burst")],
            sinks=[sink],
        )
        await asyncio.wait_for(job.run(), 30)
    assert len(sink.values) == 300
    registered = [line for line in lines(caplog, logging.INFO) if "registered state" in line]
    assert registered == ["function test/counter registered state 'count' (io.statefun.types/int)"]


async def call(url: str, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + path, data="disarm", headers={"Content-Type": "text/plain"}) as response,
    ):
        return response.status, await response.text()


async def run_with_ingress(module: ModuleSpec, tmp_path: Path, request: str) -> tuple[int, str]:
    settings = Settings(
        remote_failure_policy="dead-letter", dead_letter_path=str(tmp_path / "dead.jsonl")
    )
    job = build_job(module, settings)
    running = asyncio.create_task(job.run())
    (source,) = job.sources
    assert isinstance(source, HttpSource)
    try:
        for _ in range(250):
            try:
                status, text = await call(source.url, request)
            except aiohttp.ClientConnectorError:  # not listening yet
                status, text = 0, ""
            if status not in (0, 503):  # (503: the job is not running yet)
                return status, text
            await asyncio.sleep(0.02)
        raise AssertionError(f"the ingress did not answer: {status} {text}")
    finally:
        job.stop()
        await running


def ingress(port: int) -> HttpIngressSpec:
    return HttpIngressSpec("test/http", port=port, reply_timeout=timedelta(milliseconds=500))


async def test_a_call_to_a_function_that_never_replies_says_it_was_invoked(
    tmp_path: Path,
) -> None:
    module = ModuleSpec(
        endpoints=(
            EmbeddedEndpointSpec(
                FunctionTarget("test", None), "tests.integration.fns.shop:functions"
            ),
        ),
        ingresses=(ingress(free_port()),),
    )
    status, text = await run_with_ingress(module, tmp_path, "/call/test/reminder/a")
    assert status == 504
    assert text.startswith("no reply from test/reminder/a within 0.5 s: "), text
    assert "the function was invoked with the message" in text, text
    assert "sent no message to its caller" in text, text
    assert "context.caller" in text, text


async def test_a_call_to_a_function_whose_server_is_down_says_it_is_still_waiting(
    tmp_path: Path,
) -> None:
    down = f"http://127.0.0.1:{free_port()}/statefun"
    module = ModuleSpec(
        endpoints=(remote("down", down, call=timedelta(seconds=1.5)),),
        ingresses=(ingress(free_port()),),
    )
    status, text = await run_with_ingress(module, tmp_path, "/call/down/greeter/a")
    assert status == 504
    assert text.startswith("no reply from down/greeter/a within 0.5 s: "), text
    assert "the message is still waiting" in text, text
    assert "has not answered" in text and "is its endpoint up?" in text, text
    assert "ConnectionRefusedError" in text, text


@pytest.mark.parametrize("policy", ["fail", "dead-letter"])
async def test_many_batches_failing_at_once_log_a_few_lines(
    policy: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO)
    down = f"http://127.0.0.1:{free_port()}/statefun"
    module = ModuleSpec(endpoints=(remote("test", down, call=timedelta(milliseconds=500)),))
    script = [("test/counter", str(index), "x") for index in range(100)]

    class Burst(Source):
        bounded = True

        async def run(self, context: IngressContext) -> None:
            for typename, id_, text in script:
                await context.submit(typename, id_, string(text))

    settings = Settings(remote_failure_policy=policy, dead_letter_path=str(tmp_path / "dl"))
    job = Job(module, settings, sources=[Burst("test/burst")])
    try:
        await asyncio.wait_for(job.run(), 30)
    except Exception as exc:  # the fail policy fails the job: that is the point
        assert policy == "fail", exc
    errors = lines(caplog, logging.ERROR)
    assert 1 <= len(errors) <= 12, errors  # not one (or two) per batch
    assert len(lines(caplog)) <= 15, lines(caplog)


async def test_failures_go_on_being_counted_once_per_interval(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO)
    down = f"http://127.0.0.1:{free_port()}/statefun"
    module = ModuleSpec(endpoints=(remote("test", down, call=timedelta(seconds=1.5)),))
    script = [("test/counter", str(index), "x") for index in range(20)]

    class Burst(Source):
        bounded = True

        async def run(self, context: IngressContext) -> None:
            for typename, id_, text in script:
                await context.submit(typename, id_, string(text))

    settings = Settings(
        remote_failure_policy="dead-letter",
        dead_letter_path=str(tmp_path / "dl"),
        remote_log_interval_ms=400,
        remote_probe_timeout_ms=0,
    )
    await asyncio.wait_for(Job(module, settings, sources=[Burst("test/burst")]).run(), 30)
    logged = [line for line in lines(caplog) if line.startswith("endpoint ")]
    assert logged[0].startswith(f"endpoint {down.removesuffix('/statefun')}: call to test/counter")
    counted = logged[1:]
    # 1.5 s of failures, one line per 0.4 s at most
    assert 1 <= len(counted) <= 4, logged
    for line in counted:
        assert "call attempt(s) failed in the last" in line, line
        assert "last error: ConnectionRefusedError" in line, line
    assert not any("not reachable" in line for line in lines(caplog))  # (probe off)
