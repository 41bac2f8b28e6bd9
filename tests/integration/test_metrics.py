"""``GET /metrics`` and ``GET /status`` of a running job, scraped over real HTTP after driving
traffic through embedded and remote functions; the admin port's bearer token."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from statefun._exceptions import ConfigurationError
from statefun._settings import Settings
from statefun.ingress.base import IngressContext, Source
from statefun.module._specs import ModuleSpec, TransportSpec
from statefun.runtime import Job
from statefun.sdk._serve import start_server
from tests._support import free_port
from tests.integration.fns.shop import functions
from tests.integration.test_runtime import ListSink, embedded, remote, string

pytestmark = pytest.mark.timeout(60)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class HeldSource(Source):
    """Sends its messages - the first half with ``submit``, then runs to one function type
    with ``emit_many`` and lone messages with ``emit`` - then waits until the job stops."""

    def __init__(self, messages: list[tuple[str, str]]) -> None:
        super().__init__("test/held")
        self.messages = messages

    async def run(self, context: IngressContext) -> None:
        half = len(self.messages) // 2
        for typename, id_ in self.messages[:half]:
            await context.submit(typename, id_, string("x"))
        rest = self.messages[half:]
        while rest:
            typename = rest[0][0]
            same = itertools.takewhile(lambda m, t=typename: m[0] == t, rest)
            run = [(id_, string("x")) for _, id_ in same]
            rest = rest[len(run) :]
            if len(run) == 1:
                await context.room()
                context.emit(typename, run[0][0], run[0][1])
                continue
            sent = 0
            while sent < len(run):
                await context.room()
                sent = context.emit_many(typename, run, sent)
        await asyncio.Event().wait()


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def running(
    module: ModuleSpec,
    messages: list[tuple[str, str]],
    done: Callable[[Job, ListSink], bool],
    tmp: Path,
    **kw: Any,
) -> AsyncIterator[tuple[Job, str, ListSink]]:
    """A job with an admin port, once it handled ``messages`` and ``done`` says so."""
    sink = ListSink()
    settings = Settings(admin_port=free_port(), dead_letter_path=str(tmp / "dead.jsonl"), **kw)
    job = Job(module, settings, sources=[HeldSource(messages)], sinks=[sink])
    task = asyncio.create_task(job.run())
    url = f"http://127.0.0.1:{settings.admin_port}"
    try:
        for _ in range(1000):
            if done(job, sink) and job.pending == 0 and await answers(url):
                break
            assert not task.done(), task
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"the job did not finish its work: {len(sink.values)} records")
        yield job, url, sink
    finally:
        job.stop()
        await asyncio.wait_for(task, 20)


async def answers(url: str) -> bool:
    try:
        await get(f"{url}/status")
    except aiohttp.ClientConnectionError:
        return False
    return True


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.text()


async def test_embedded_job_metrics_count_what_was_sent(tmp_path: Path) -> None:
    n = 100
    messages = [("test/counter", f"k{i % 7}") for i in range(n)] + [("test/nobody", "x")]
    module = ModuleSpec(endpoints=(embedded(),))
    async for job, url, _ in running(
        module,
        messages,
        lambda _, s: len(s.values) == n,
        tmp_path,
        checkpoint_dir=str(tmp_path / "cp"),
    ):
        assert job.checkpoints is not None
        await job.checkpoints.checkpoint()
        status, content_type, text = await get(f"{url}/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        samples = parse(text)
        counter, recorder = {"function": "test/counter"}, {"function": "test/recorder"}
        assert value(samples, "pystatefun_function_invocations_total", **counter) == n
        assert value(samples, "pystatefun_function_messages_in_total", **counter) == n
        assert value(samples, "pystatefun_function_messages_out_total", **counter) == n
        assert value(samples, "pystatefun_function_invocations_total", **recorder) == n
        assert value(samples, "pystatefun_function_messages_out_total", **recorder) == 0
        failures = {"function": "test/counter", "kind": "terminal"}
        assert value(samples, "pystatefun_function_failures_total", **failures) == 0
        # one synchronous embedded invocation in 16 is timed
        timed = value(samples, "pystatefun_function_invocation_seconds_count", **counter)
        assert timed == -(-n // 16)
        assert value(samples, "pystatefun_function_mailbox_messages", **counter) == 0
        assert value(samples, "pystatefun_ingress_records_total", ingress="test/held") == n + 1
        assert value(samples, "pystatefun_egress_records_total", egress="test/out") == n
        assert value(samples, "pystatefun_dead_letters_total") == 1
        assert value(samples, "pystatefun_messages_in_flight") == 0
        assert value(samples, "pystatefun_checkpoints_total") >= 1
        assert value(samples, "pystatefun_checkpoint_duration_seconds_count") >= 1
        assert value(samples, "pystatefun_checkpoint_written_bytes_total") > 0
        assert value(samples, "pystatefun_checkpoint_last_completed_age_seconds") < 60
        assert value(samples, "pystatefun_event_loop_lag_seconds_count") >= 0
        assert value(samples, "process_resident_memory_bytes") > 1e6
        assert value(samples, "process_cpu_seconds_total") > 0
        # no label names an address
        assert not any("k1" in str(labels) for _, labels in samples)

        status, content_type, body = await get(f"{url}/status")
        assert status == 200
        report = json.loads(body)
        assert report["functions"]["test/counter"] == {
            "invocations": n,
            "messages_in": n,
            "messages_out": n,
            "failures": 0,
            "mailbox": 0,
        }
        assert report["ingresses"]["test/held"]["records"] == n + 1
        assert report["egresses"] == {"test/out": {"records": n}}
        assert report["endpoints"] == {}
        assert report["dead_letters"] == 1
        history = report["checkpoint_history"]
        assert history and history[-1]["bytes"] > 0 and history[-1]["duration_ms"] > 0
        assert report["invocations"] == 2 * n  # (the keys it had stay)


@pytest.fixture
async def remote_url() -> AsyncIterator[str]:
    async with await start_server(functions) as server:
        yield server.url


async def test_remote_job_metrics_count_calls_and_batches(remote_url: str, tmp_path: Path) -> None:
    n = 120
    messages = [("test/counter", "hot")] * n
    module = ModuleSpec(endpoints=(remote(remote_url, max_num_batch_requests=10),))
    async for _, url, _ in running(module, messages, lambda _, s: len(s.values) == n, tmp_path):
        _, _, text = await get(f"{url}/metrics")
        samples = parse(text)
        counter, recorder = {"function": "test/counter"}, {"function": "test/recorder"}
        assert value(samples, "pystatefun_function_invocations_total", **counter) == n
        assert value(samples, "pystatefun_function_invocations_total", **recorder) == n
        assert value(samples, "pystatefun_function_messages_out_total", **counter) == n
        batches = value(samples, "pystatefun_function_batch_messages_count", **counter)
        assert value(samples, "pystatefun_function_batch_messages_sum", **counter) == n
        assert n / 10 <= batches < n  # a hot key's messages are batched, at most 10 a batch
        assert value(samples, "pystatefun_function_invocation_seconds_count", **counter) == batches
        assert value(samples, "pystatefun_function_mailbox_max_messages", **counter) >= 10
        origin = {"endpoint": remote_url.rsplit("/", 1)[0]}
        recorder_batches = value(samples, "pystatefun_function_batch_messages_count", **recorder)
        calls = value(samples, "pystatefun_endpoint_calls_total", **origin)
        # and one more: the counter's first call asks for its state spec (the batch goes again)
        assert calls == batches + recorder_batches + 1
        assert value(samples, "pystatefun_endpoint_call_seconds_count", **origin) == calls
        assert value(samples, "pystatefun_endpoint_errors_total", **origin) == 0
        assert value(samples, "pystatefun_endpoint_retries_total", **origin) == 0
        assert value(samples, "pystatefun_endpoint_calls_in_flight", **origin) == 0
        assert value(samples, "pystatefun_remote_open_connections") >= 1
        assert value(samples, "pystatefun_remote_calls_waiting_for_slot") == 0

        _, _, body = await get(f"{url}/status")
        endpoint = json.loads(body)["endpoints"][origin["endpoint"]]
        assert endpoint["calls"] == calls and endpoint["errors"] == 0
        assert endpoint["latency_p99_ms"] > 0


async def test_failures_are_counted_by_kind(tmp_path: Path) -> None:
    # a remote endpoint nobody listens on: each call fails until its timeout (retryable)
    origin = f"http://127.0.0.1:{free_port()}"
    transport = TransportSpec(call=timedelta(milliseconds=300))
    module = ModuleSpec(endpoints=(remote(f"{origin}/statefun", transport=transport),))
    messages = [("test/counter", "a"), ("test/counter", "b")]
    async for _, url, _ in running(
        module,
        messages,
        lambda job, _: job.dead_letters == 2,
        tmp_path,
        remote_failure_policy="dead-letter",
        remote_probe_timeout_ms=0,
    ):
        _, _, text = await get(f"{url}/metrics")
        samples = parse(text)
        kind = {"function": "test/counter", "kind": "retryable"}
        assert value(samples, "pystatefun_function_failures_total", **kind) == 2
        assert value(samples, "pystatefun_dead_letters_total") == 2
        assert value(samples, "pystatefun_endpoint_errors_total", endpoint=origin) == 2
        assert value(samples, "pystatefun_endpoint_retries_total", endpoint=origin) >= 2


async def test_admin_token_is_required_when_set(tmp_path: Path) -> None:
    token = "s3cret-admin-token"
    module = ModuleSpec(endpoints=(embedded(),))
    async for _, url, _ in running(module, [], lambda *_: True, tmp_path, admin_token=token):
        for path in ("/metrics", "/status"):
            status, _, text = await get(url + path)
            assert status == 401 and "bearer token" in text and token not in text
            wrong = {"Authorization": "Bearer nope"}
            assert (await get(url + path, wrong))[0] == 401
            right = {"Authorization": f"Bearer {token}"}
            assert (await get(url + path, right))[0] == 200


async def test_metrics_off_serves_no_metrics(tmp_path: Path) -> None:
    module = ModuleSpec(endpoints=(embedded(),))
    messages = [("test/counter", "a")]
    one = lambda _, sink: len(sink.values) == 1  # noqa: E731
    async for _, url, _ in running(module, messages, one, tmp_path, metrics=False):
        status, _, text = await get(f"{url}/metrics")
        assert status == 404 and "setting metrics" in text
        status, _, body = await get(f"{url}/status")
        assert json.loads(body)["functions"]["test/counter"]["invocations"] == 1


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        ({"admin_port": "9000", "admin_host": "0.0.0.0"}, True),
        ({"admin_port": "9000", "admin_host": "192.168.1.5"}, True),
        ({"admin_port": "9000", "admin_host": "0.0.0.0", "admin_token": "t0ken"}, False),
        ({"admin_port": "9000", "admin_host": "0.0.0.0", "admin_insecure": "true"}, False),
        ({"admin_port": "9000", "admin_host": "::1"}, False),
        ({"admin_port": "0", "admin_host": "0.0.0.0"}, False),
    ],
)
def test_admin_beyond_loopback_needs_a_token(settings: dict[str, str], refused: bool) -> None:
    if refused:
        with pytest.raises(ConfigurationError, match=r"admin_token is not set.*--insecure-admin"):
            Settings.load(settings, environ={})
    else:
        Settings.load(settings, environ={})


def test_admin_token_is_not_shown_in_settings_repr() -> None:
    assert "t0ken" not in repr(Settings.load({"admin_token": "t0ken"}, environ={}))
