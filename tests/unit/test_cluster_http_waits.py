"""A clustered worker's HTTP ingress while it has no job (its group rebalancing), on real HTTP
on 127.0.0.1 and a real ``Job`` (not started; a list stands in for the Kafka transaction): a
request that cannot be handed to a job within ``cluster_http_wait_ms`` is answered 503 with
``Retry-After`` and sent nowhere; a call is bounded by its ``replyTimeout`` from its arrival,
waits included; ``maxPending`` bounds the requests waiting; a call whose message a failed or
dropped cut held is answered 503."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from statefun._settings import Settings
from statefun.cluster import cluster_config
from statefun.cluster._http_ingress import WorkerHttp
from statefun.module import load_module
from statefun.runtime._job import Job
from tests.unit.test_cluster_http_epoch import Transaction

FNS = Path(__file__).parents[1] / "integration" / "fns" / "cluster_http_fns.py"


@dataclass
class Answer:
    status: int
    body: str
    retry_after: str | None
    took: float


def _post(url: str) -> Answer:
    request = urllib.request.Request(url, data=b"hi", headers={"Content-Type": "text/plain"})
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, body, retry = response.status, response.read(), None
    except urllib.error.HTTPError as error:
        status, body, retry = error.code, error.read(), error.headers.get("Retry-After")
    return Answer(status, body.decode().strip(), retry, time.monotonic() - began)


@dataclass
class Served:
    owner: WorkerHttp
    job: Job
    url: str

    async def post(self, path: str) -> Answer:
        return await asyncio.to_thread(_post, self.url + path)


async def _serve(
    tmp_path: Path, wait_ms: int, reply_timeout: str = "20s", max_pending: int = 100
) -> AsyncIterator[Served]:
    path = tmp_path / "module.yaml"
    path.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: chttp/*\n"
        f"  module: {FNS}:functions\n---\n"
        "kind: io.pystatefun.http.v1/ingress\nspec:\n  id: chttp/http\n  port: 0\n"
        f"  replyTimeout: {reply_timeout}\n  maxPending: {max_pending}\n"
    )
    module = load_module(path)
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:9092",
            "cluster.job_id": "shop",
            "cluster.http_wait_ms": str(wait_ms),
            "dead_letter_path": str(tmp_path / "dead-letters.jsonl"),
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None
    owner = WorkerHttp(module, settings, config)
    [source] = owner.sources
    await source.start()  # the server alone: the replies reader needs a broker
    task = asyncio.get_running_loop().create_task(source.run(owner.context(source)))
    try:
        yield Served(owner, Job(module, settings), source.url)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.close()


@pytest.fixture
async def waits_300ms(tmp_path: Path) -> AsyncIterator[Served]:
    async for served in _serve(tmp_path, 300):
        yield served


async def test_a_message_with_no_job_to_take_it_is_refused_503_after_the_bound(
    waits_300ms: Served,
) -> None:
    served = waits_300ms
    answer = await served.post("/messages/chttp/record/a")
    assert answer.status == 503 and answer.retry_after == "1"
    assert "not accepted: worker" in answer.body and "for 0.3 s" in answer.body
    assert "rebalancing" in answer.body and "\n" not in answer.body
    assert 0.25 <= answer.took < 10

    # the job came back within the bound: the message is handed in, 202 after the commit
    pending = asyncio.ensure_future(served.post("/messages/chttp/record/b"))
    await asyncio.sleep(0.1)
    link = served.owner.attach(served.job, Transaction())
    while not link.wants_checkpoint():
        await asyncio.sleep(0.01)
    assert served.job.pending == 1  # only b: a was sent nowhere
    await asyncio.sleep(0.4)  # past the bound: a request handed in waits for its commit
    assert not pending.done()
    link.cut(served.owner.config).committed()
    answer = await pending
    assert (answer.status, answer.body) == (202, "accepted")


async def test_a_call_is_bounded_by_its_reply_timeout_from_its_arrival(tmp_path: Path) -> None:
    async for served in _serve(tmp_path, 60_000, reply_timeout="2s"):
        # no job within the reply timeout: not sent, 503 (the wait bound is longer)
        answer = await served.post("/call/chttp/call/a")
        assert answer.status == 503 and answer.retry_after == "1", answer
        assert "for 2 s" in answer.body and 1.9 <= answer.took < 10

        # a job after 1.5 s, no reply: 504 at 2 s from the request, not 2 s after the send
        pending = asyncio.ensure_future(served.post("/call/chttp/call/b"))
        await asyncio.sleep(1.5)
        link = served.owner.attach(served.job, Transaction())
        answer = await pending
        assert answer.status == 504 and "within 2 s" in answer.body
        assert answer.took < 3.2, answer
        assert served.job.pending == 1 and link.wants_checkpoint()


async def test_a_call_whose_cut_failed_or_whose_epoch_went_is_refused(
    waits_300ms: Served,
) -> None:
    served = waits_300ms
    owner = served.owner
    link = owner.attach(served.job, Transaction())
    pending = asyncio.ensure_future(served.post("/call/chttp/call/a"))
    while not link.wants_checkpoint():
        await asyncio.sleep(0.01)
    link.cut(owner.config).aborted(RuntimeError("fenced"))
    answer = await pending
    assert answer.status == 503 and answer.retry_after == "1"
    assert "checkpoint failed (fenced)" in answer.body

    pending = asyncio.ensure_future(served.post("/call/chttp/call/b"))
    while not link.wants_checkpoint():
        await asyncio.sleep(0.01)
    owner.detach(link)
    link.close()
    answer = await pending
    assert answer.status == 503 and "gave its key groups up" in answer.body
    assert owner.replies == {}


async def test_requests_waiting_for_a_job_are_bounded_by_max_pending(tmp_path: Path) -> None:
    async for served in _serve(tmp_path, 60_000, max_pending=2):
        waiting = [asyncio.ensure_future(served.post(f"/messages/chttp/record/{n}")) for n in "ab"]
        await asyncio.sleep(0.3)
        answer = await served.post("/messages/chttp/record/c")
        assert answer.status == 503 and answer.retry_after == "1"
        assert answer.body == "too many requests waiting; try again later"
        link = served.owner.attach(served.job, Transaction())
        while served.job.pending < 2:
            await asyncio.sleep(0.01)
        link.cut(served.owner.config).committed()
        assert [(await w).status for w in waiting] == [202, 202]
