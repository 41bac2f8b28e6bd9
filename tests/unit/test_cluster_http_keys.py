"""Idempotency keys on a clustered job's HTTP ingress, without a broker: two workers' HTTP
ingresses (``WorkerHttp``, real HTTP on 127.0.0.1) in front of one real running ``Job`` serving
the key function, a loop standing in for the checkpoints (cut, the transaction's reply rows
handed to the worker whose instance they name, commit). The tests on a real broker are in
``tests/integration/test_cluster_http.py``."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.cluster import cluster_config
from statefun.cluster._http_ingress import WorkerHttp
from statefun.cluster._replies import decode_reply, instance_of
from statefun.ingress.base import IngressContext, Source
from statefun.module import load_module
from statefun.runtime._job import Job
from statefun.sdk._types import IntType
from tests.unit.test_cluster_http_epoch import Transaction

FNS = Path(__file__).parents[1] / "integration" / "fns" / "cluster_http_fns.py"


class _Idle(Source):
    """Keeps the job running (a job whose sources all ended stops)."""

    async def run(self, context: IngressContext) -> None:
        await asyncio.Event().wait()


@dataclass
class Answer:
    status: int
    body: str
    replayed: bool


def _post(url: str, body: str, key: str | None) -> Answer:
    headers = {"Content-Type": "text/plain"}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(url, data=body.encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, text, replayed = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, text, replayed = error.code, error.read(), error.headers
    return Answer(status, text.decode().strip(), replayed.get("Idempotent-Replayed") == "true")


@dataclass
class Workers:
    job: Job
    urls: dict[str, str]
    dead_letters: Path

    async def post(self, worker: str, path: str, body: str, key: str | None = None) -> Answer:
        return await asyncio.to_thread(_post, self.urls[worker] + path, body, key)

    def count(self, typename: str, id_: str) -> int:
        key_group = key_group_for(typename, id_, self.job.settings.max_parallelism)
        values = self.job.state.get(key_group, (typename, id_)) or {}
        value = values.get("count")
        return 0 if value is None else int(IntType.serializer().deserialize(value.value))


async def _commit_every(owners: list[WorkerHttp], links: list[Any], transaction: Any) -> None:
    """The checkpoints: cut every link, hand each reply row to its worker, commit."""
    config = owners[0].config
    by_instance = {owner.instance: owner for owner in owners}
    while True:
        await asyncio.sleep(0.02)
        cuts = [link.cut(config) for link in links]
        rows, transaction.rows = transaction.rows, []
        for cut in cuts:
            cut.committed()
        for _, key, value, _ in rows:
            _, request_id, reply = decode_reply(key.encode(), value)
            by_instance[str(instance_of(request_id))].complete(request_id, reply)


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[Workers]:
    path = tmp_path / "module.yaml"
    path.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: chttp/*\n"
        f"  module: {FNS}:functions\n---\n"
        "kind: io.pystatefun.http.v1/ingress\nspec:\n  id: chttp/http\n  port: 0\n"
        "  replyTimeout: 10s\n"
    )
    module = load_module(path)
    dead_letters = tmp_path / "dead-letters.jsonl"
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:9092",
            "cluster.job_id": "shop",
            "dead_letter_path": str(dead_letters),
            "remote_failure_policy": "dead-letter",
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None
    owners = [WorkerHttp(module, settings, config) for _ in range(2)]
    job = Job(module, settings, sources=[_Idle("idle")], serve_admin=False)
    owners[0].serve_keys(job, range(settings.max_parallelism))
    transaction = Transaction()
    links = [owner.attach(job, transaction) for owner in owners]
    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(job.run()),
        loop.create_task(_commit_every(owners, links, transaction)),
    ]
    urls = {}
    for name, owner in zip("AB", owners, strict=True):
        [source] = owner.sources
        await source.start()  # the servers alone: the replies reader needs a broker
        tasks.append(loop.create_task(source.run(owner.context(source))))
        urls[name] = source.url
    try:
        yield Workers(job, urls, dead_letters)
    finally:
        job.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for owner in owners:
            await owner.sources[0].close()


async def test_a_repeated_call_on_another_worker_is_replayed_not_run_again(
    workers: Workers,
) -> None:
    first = await workers.post("A", "/call/chttp/call/a", "x", "k1")
    assert (first.status, first.body, first.replayed) == (200, "a:1:x", False)
    again = await workers.post("B", "/call/chttp/call/a", "x", "k1")
    assert (again.status, again.body, again.replayed) == (200, "a:1:x", True)
    assert workers.count("chttp/call", "a") == 1
    conflict = await workers.post("B", "/call/chttp/call/a", "y", "k1")
    assert conflict.status == 422 and "'k1' was used for another request" in conflict.body
    other_route = await workers.post("A", "/messages/chttp/call/a", "x", "k1")
    assert other_route.status == 422
    # the same key on another ingress (or without one) is another request
    plain_call = await workers.post("A", "/call/chttp/call/a", "x")
    assert (plain_call.status, plain_call.body) == (200, "a:2:x")
    assert workers.count("chttp/call", "a") == 2


async def test_a_repeated_message_is_accepted_again_and_sent_once(workers: Workers) -> None:
    first = await workers.post("A", "/messages/chttp/record/m", "1:t", "k2")
    assert (first.status, first.body, first.replayed) == (202, "accepted", False)
    for worker in ("B", "A"):
        again = await workers.post(worker, "/messages/chttp/record/m", "1:t", "k2")
        assert (again.status, again.body, again.replayed) == (202, "accepted", True)
    await asyncio.sleep(0.1)
    assert workers.count("chttp/record", "m") == 1


async def test_many_repeats_at_once_run_the_function_once(workers: Workers) -> None:
    answers = await asyncio.gather(
        *(workers.post("AB"[n % 2], "/call/chttp/call/c", "z", "k5") for n in range(12))
    )
    assert {(a.status, a.body) for a in answers} == {(200, "c:1:z")}
    assert sum(not a.replayed for a in answers) == 1
    assert workers.count("chttp/call", "c") == 1


async def test_a_dead_lettered_call_is_a_422_and_its_key_is_forgotten(workers: Workers) -> None:
    first = await workers.post("B", "/call/chttp/flaky/z", "fail", "k3")
    assert first.status == 422 and "told to fail" in first.body and not first.replayed
    again = await workers.post("A", "/call/chttp/flaky/z", "fail", "k3")
    assert again.status == 422 and "told to fail" in again.body
    await asyncio.sleep(0.1)
    lines = [json.loads(line) for line in workers.dead_letters.read_text().splitlines()]
    # processed again: a dead letter is no outcome to replay
    assert [r["target"] for r in lines if r.get("target") == "chttp/flaky"] == ["chttp/flaky"] * 2
    ok = await workers.post("A", "/call/chttp/flaky/z", "ok", "k4")
    assert (ok.status, ok.body) == (200, "z:1:ok")


async def test_a_bad_key_is_refused(workers: Workers) -> None:
    answer = await workers.post("A", "/call/chttp/call/a", "x", "k" * 300)
    assert answer.status == 400 and "Idempotency-Key" in answer.body and "255" in answer.body
    assert workers.count("chttp/call", "a") == 0
