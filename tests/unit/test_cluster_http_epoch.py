"""The clustered HTTP ingress's link to an epoch, on a real ``Job`` (not started) and a list
standing in for the Kafka transaction: a request is acknowledged and a reply released only
when the checkpoint whose cut took them committed; a failed checkpoint or a dropped epoch
refuses the requests it held (503 upstream); replies for other workers go into the
transaction; a reply nobody waits for is dropped with a rate-limited line."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from statefun._addresses import REPLY_TYPENAME
from statefun._exceptions import UnavailableError, UndeliverableError
from statefun._settings import Settings
from statefun.cluster import cluster_config
from statefun.cluster._http_ingress import WorkerHttp
from statefun.cluster._replies import decode_reply, request_prefix
from statefun.module import load_module
from statefun.runtime._envelope import Envelope
from statefun.runtime._job import Job
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import TypedValue

FNS = Path(__file__).parents[1] / "integration" / "fns" / "cluster_http_fns.py"
OTHER = "fedcba9876543210"


class Transaction:
    """Rows written into the worker's open transaction."""

    def __init__(self) -> None:
        self.rows: list[Any] = []

    def write_rows(self, rows: list[Any]) -> None:
        self.rows.extend(rows)


def _worker(tmp_path: Path) -> tuple[WorkerHttp, Job]:
    path = tmp_path / "module.yaml"
    path.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: chttp/*\n"
        f"  module: {FNS}:functions\n---\n"
        "kind: io.pystatefun.http.v1/ingress\nspec:\n  id: chttp/http\n  port: 0\n"
    )
    module = load_module(path)
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:9092",
            "cluster.job_id": "shop",
            "dead_letter_path": str(tmp_path / "dead-letters.jsonl"),
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None
    return WorkerHttp(module, settings, config), Job(module, settings)


def _reply(request_id: str, text: bytes) -> Envelope:
    return Envelope(REPLY_TYPENAME, request_id, TypedValue("ex/T", text), None)


async def test_acks_and_replies_wait_for_the_commit_of_their_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    owner, job = _worker(tmp_path)
    transaction = Transaction()
    link = owner.attach(job, transaction)
    assert await owner.epoch() is link
    loop = asyncio.get_running_loop()
    own_id = f"{request_prefix(owner.instance, 0)}-1"
    other_id = f"{OTHER}.0-9"
    waiting: asyncio.Future[Any] = loop.create_future()
    owner.replies[own_id] = waiting

    submitted = loop.create_task(
        link.submit(Envelope("chttp/call", "a", TypedValue("ex/T", b"x"), None))
    )
    await asyncio.sleep(0)
    assert job.pending == 1 and not submitted.done() and link.wants_checkpoint()
    for envelope in (_reply(own_id, b"mine"), _reply(other_id, b"theirs"), _reply("junk", b"")):
        job.send(envelope)  # as a function's message to its caller

    with caplog.at_level(logging.WARNING, logger="statefun.cluster._replies"):
        cut = link.cut(owner.config)
    assert not link.wants_checkpoint()
    [(topic, key, value, _)] = transaction.rows  # the other worker's reply, in the transaction
    assert topic == "pystatefun.shop.replies" and key.endswith(f":{OTHER}")
    assert decode_reply(key.encode(), value)[1:] == (other_id, TypedValue("ex/T", b"theirs"))
    assert any(
        "'junk': not a clustered request id; dropped" in r.getMessage() for r in caplog.records
    )
    await asyncio.sleep(0)
    assert not waiting.done() and not submitted.done()  # not before the commit

    cut.committed()
    assert waiting.result() == TypedValue("ex/T", b"mine")
    assert await submitted is True
    assert own_id not in owner.replies

    # a failed checkpoint refuses what its cut held
    failing = loop.create_task(
        link.submit(Envelope("chttp/call", "b", TypedValue("t/T", b""), None))
    )
    await asyncio.sleep(0)
    link.cut(owner.config).aborted(RuntimeError("fenced"))
    with pytest.raises(UnavailableError, match=r"not accepted: .*checkpoint failed \(fenced\)"):
        await failing

    # an epoch dropped before its cut refuses what it held; new requests wait for the next
    dropped = loop.create_task(
        link.submit(Envelope("chttp/call", "c", TypedValue("t/T", b""), None))
    )
    await asyncio.sleep(0)
    owner.detach(link)
    link.close()
    with pytest.raises(UnavailableError, match="gave its key groups up"):
        await dropped
    assert owner.current is None
    next_epoch = loop.create_task(owner.epoch())
    await asyncio.sleep(0)
    assert not next_epoch.done()
    second = owner.attach(job, transaction)
    assert await next_epoch is second


async def test_a_reply_nobody_waits_for_is_dropped_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    owner, _ = _worker(tmp_path)
    with caplog.at_level(logging.WARNING, logger="statefun.cluster._replies"):
        for n in range(50):
            owner.complete(f"{request_prefix(owner.instance, 0)}-{n}", TypedValue("ex/T", b""))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "arrived after its caller left; dropped" in lines[0]


async def test_a_dead_lettered_call_is_answered_on_its_callers_worker_after_the_commit(
    tmp_path: Path,
) -> None:
    owner, job = _worker(tmp_path)
    transaction = Transaction()
    link = owner.attach(job, transaction)
    own_id = f"{request_prefix(owner.instance, 0)}-1"
    other_id = f"{OTHER}.0-2"
    waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    owner.replies[own_id] = waiting
    value = TypedValue("ex/T", b"")
    job.dead_letter(
        [
            Envelope(
                "chttp/call",
                "a",
                value,
                SdkAddress("pystatefun.http", "reply", rid, REPLY_TYPENAME),
            )
            for rid in (own_id, other_id)
        ],
        "the function failed",
    )
    assert link.wants_checkpoint()
    cut = link.cut(owner.config)
    [(_, key, record, _)] = transaction.rows
    _, request_id, reply = decode_reply(key.encode(), record)
    assert request_id == other_id and isinstance(reply, UndeliverableError)
    assert str(reply) == "dead letter 2: the function failed"
    assert not waiting.done()
    cut.committed()
    with pytest.raises(UndeliverableError, match="dead letter 1: the function failed"):
        waiting.result()


def _job_of_one(tmp_path: Path) -> Job:
    """A job with room for one message in flight (after ``_worker`` wrote the module)."""
    settings = Settings.load(
        {"max_in_flight_messages": "1", "dead_letter_path": str(tmp_path / "d.jsonl")},
        environ={},
    )
    return Job(load_module(tmp_path / "module.yaml"), settings)


async def test_a_request_waiting_for_room_moves_on_when_its_epoch_goes(tmp_path: Path) -> None:
    owner, _ = _worker(tmp_path)
    job = _job_of_one(tmp_path)
    link = owner.attach(job, Transaction())
    loop = asyncio.get_running_loop()
    first = loop.create_task(link.submit(Envelope("chttp/call", "a", TypedValue("t/T", b""), None)))
    await asyncio.sleep(0)
    assert not job.has_room()  # the one message in flight fills the job
    second = loop.create_task(
        link.submit(Envelope("chttp/call", "b", TypedValue("t/T", b""), None))
    )
    await asyncio.sleep(0.05)
    assert not second.done()
    owner.detach(link)  # the epoch stops: its job never makes room again
    assert await asyncio.wait_for(second, 1) is False  # sent to the next epoch instead
    assert job.pending == 1
    link.close()
    with pytest.raises(UnavailableError):
        await first


async def test_a_request_waits_for_room_within_the_bound_and_again_if_another_took_it(
    tmp_path: Path,
) -> None:
    owner, _ = _worker(tmp_path)
    job = _job_of_one(tmp_path)
    link = owner.attach(job, Transaction())
    loop = asyncio.get_running_loop()

    def message(id_: str) -> Envelope:
        return Envelope("chttp/record", id_, TypedValue("t/T", b""), None)

    first = loop.create_task(link.submit(message("a")))
    await asyncio.sleep(0)
    assert not job.has_room()
    began = loop.time()
    with pytest.raises(UnavailableError, match="job had no room for it in time"):
        await asyncio.wait_for(link.submit(message("b"), loop.time() + 0.3), 5)
    assert loop.time() - began >= 0.29 and job.pending == 1

    waiting = [loop.create_task(link.submit(message(i), loop.time() + 30)) for i in "cd"]
    await asyncio.sleep(0.05)
    job.release(1)  # room for one: c takes it, d waits again (not refused)
    await asyncio.sleep(0.05)
    assert job.pending == 1 and [w.done() for w in waiting] == [False, False]
    link.cut(owner.config).committed()
    assert await first is True and await waiting[0] is True
    assert not waiting[1].done()
    owner.detach(link)
    assert await waiting[1] is False  # to the next epoch
