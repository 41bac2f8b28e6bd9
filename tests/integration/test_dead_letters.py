"""Bad input is the sender's problem, never the job's: dead letters, refused state writes,
quarantine of a message that keeps failing the job, and request-reply calls that hear at once."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from statefun._exceptions import JobFailedError
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.ingress.base import IngressContext, Source
from statefun.module._specs import FunctionTarget, HttpEndpointSpec, ModuleSpec, TransportSpec
from statefun.runtime import Job
from statefun.sdk import TypedValue
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._serve import start_server
from statefun.state.memory import MemoryStateBackend
from tests.integration.fns.shop import functions
from tests.integration.test_runtime import (
    ListSink,
    ScriptSource,
    embedded,
    function_server,
    remote,
    run_job,
)

pytestmark = pytest.mark.timeout(60)


def dead_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("checkpoints", [False, True])
async def test_a_type_a_wildcard_endpoint_does_not_serve_is_a_dead_letter(
    tmp_path: Path, checkpoints: bool
) -> None:
    """`functions: test/*`, and a message to test/typo: the function server answers 404; the
    message goes to the dead letters (policy fail notwithstanding) and the job goes on."""
    dead = tmp_path / "dead.jsonl"
    more = {"checkpoint_dir": str(tmp_path / "checkpoints")} if checkpoints else {}
    async with await start_server(functions) as server:
        values = await run_job(
            ModuleSpec(endpoints=(remote(server.url),)),
            [("test/typo", "x", "hi"), ("test/counter", "a", "x")],
            dead_letter_path=str(dead),
            **more,
        )
    assert values == ["a=1"]
    (record,) = dead_records(dead)
    assert (record["target"], record["id"], record["seq"]) == ("test/typo", "x", 1)
    assert "HTTP 404" in record["reason"] and "no function is registered" in record["reason"]


async def test_a_call_to_a_dead_lettered_message_hears_at_once(tmp_path: Path) -> None:
    from statefun.ingress.http import HttpSource

    async with await start_server(functions) as server:
        job = Job(
            ModuleSpec(endpoints=(remote(server.url),)),
            Settings(dead_letter_path=str(tmp_path / "dead.jsonl")),
            sinks=[ListSink()],
        )
        source = HttpSource("test/http", port=0, replies=job.replies, reply_timeout_s=30)
        job.sources = [source]
        running = asyncio.create_task(job.run())
        try:
            for _ in range(100):
                if source.port:
                    break
                await asyncio.sleep(0.02)
            headers = {"Content-Type": "text/plain"}
            async with aiohttp.ClientSession() as http:
                started = time.monotonic()
                async with http.post(
                    f"{source.url}/call/test/typo/x", data="hi", headers=headers
                ) as r:
                    text = await r.text()
                    assert r.status == 422, text
                assert time.monotonic() - started < 10  # not the 30 s reply timeout
                assert "dead letter 1" in text and "HTTP 404" in text
                assert "\n" not in text.strip()
                async with http.post(
                    f"{source.url}/call/test/counter/a", data="hi", headers=headers
                ) as r:
                    assert (r.status, await r.text()) == (200, "1")  # the job went on
        finally:
            job.stop()
            await running


def _rewrite_state_type(raw: bytes, typename: str) -> tuple[bytes, bool]:
    """The answer with its state writes retyped; whether it had any."""
    response = pb.FromFunction.FromString(raw)
    mutations = response.invocation_result.state_mutations
    for mutation in mutations:
        mutation.state_value.typename = typename
    return response.SerializeToString(), bool(mutations)


async def test_a_state_write_of_another_type_is_refused_and_the_address_works_on(
    tmp_path: Path,
) -> None:
    """The first answer writes `count` as a string although its spec says int: refused (the
    message goes to the dead letters, the state stays as it was); the next messages count on."""
    writes = 0

    async def first_writes_a_string(
        body: bytes, handle: Callable[[bytes], Awaitable[bytes]]
    ) -> bytes:
        nonlocal writes
        raw = await handle(body)
        retyped, wrote = _rewrite_state_type(raw, "io.statefun.types/string")
        writes += wrote
        return retyped if wrote and writes == 1 else raw

    dead = tmp_path / "dead.jsonl"
    async with function_server(first_writes_a_string) as url:
        endpoint = remote(url, transport=TransportSpec(call=timedelta(seconds=3)))
        values = await run_job(
            ModuleSpec(endpoints=(endpoint,)),
            [("test/counter", "a", "1"), ("sleep", 0.3), ("test/counter", "a", "2")],
            dead_letter_path=str(dead),
        )
    assert values == ["a=1"]  # the refused write left no count behind
    (record,) = dead_records(dead)
    assert record["target"] == "test/counter" and "wrote state 'count'" in record["reason"]


@pytest.mark.parametrize("where", ["remote", "embedded"])
async def test_state_of_another_type_already_stored_is_moved_out(
    tmp_path: Path, where: str
) -> None:
    """A stored value whose type is not its spec's (from a checkpoint written before such
    writes were refused, or before a spec changed its type) would fail every call to the
    address: it goes to the dead letters (nothing lost) and out of the state, and the address
    works."""
    dead = tmp_path / "dead.jsonl"
    state = MemoryStateBackend()
    settings = Settings(dead_letter_path=str(dead))
    key_group = key_group_for("test/counter", "a", settings.max_parallelism)
    state.put(key_group, ("test/counter", "a"), {"count": TypedValue("other/type", b"\x01\x02")})
    script = [("test/counter", "a", "x"), ("test/counter", "a", "x")]
    async with await start_server(functions) as server:
        endpoint = (
            remote(server.url, transport=TransportSpec(call=timedelta(seconds=3)))
            if where == "remote"
            else embedded()
        )
        # remote: the spec is known from the first answer (IncompleteInvocationContext); the
        # check runs before every call with the specs known then
        sink = ListSink()
        job = Job(
            ModuleSpec(endpoints=(endpoint,)),
            settings,
            sources=[ScriptSource(script)],
            sinks=[sink],
            state=state,
        )
        await asyncio.wait_for(job.run(), 30)
    assert sink.values == ["a=1", "a=2"]
    (record,) = dead_records(dead)
    assert record["state"] == "count" and record["type"] == "other/type"
    assert record["value_base64"] == "AQI="
    assert "its spec says io.statefun.types/int" in record["reason"]


async def test_a_message_that_keeps_failing_the_job_is_quarantined(tmp_path: Path) -> None:
    """Under remote_failure_policy=fail a batch holding 'boom' fails the job each time; the
    third time the same way, 'boom' goes to the dead letters and the other messages of its
    batch are sent again without it: each takes effect once."""

    async def boom_fails(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> Any:
        from aiohttp import web

        await asyncio.sleep(0.02)  # messages pile up into one batch meanwhile
        if b"boom" in body:
            return web.Response(status=400, text="cannot handle boom")
        return await handle(body)

    dead = tmp_path / "dead.jsonl"
    settings = {
        "dead_letter_path": str(dead),
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "checkpoint_interval_ms": 60_000,  # no checkpoint before the failure
        "quarantine_after_failures": 3,
    }
    script = [("test/counter", "a", text) for text in ("one", "two", "boom", "three")]
    async with function_server(boom_fails) as url:
        module = ModuleSpec(endpoints=(remote(url, max_num_batch_requests=10),))
        for _ in range(2):
            with pytest.raises(JobFailedError, match="cannot handle boom"):
                await run_job(module, script, **settings)
            assert not dead.exists()
        values = await run_job(module, script, **settings)
        (record,) = dead_records(dead)
        assert "quarantined after failing 3" in record["reason"]
        assert record["target"] == "test/counter" and b"boom" in base64.b64decode(
            record["value_base64"]
        )
        journal = json.loads((tmp_path / "checkpoints" / "quarantine.json").read_text())
        (suspect,) = journal["suspects"]
        assert suspect["failures"] == 3 and len(suspect["messages"]) == 1
        assert sorted(values) == ["a=1", "a=2", "a=3"]
        # the same messages again (as a replay after a crash sends them, should it come before
        # a checkpoint covers the quarantine): 'boom' is quarantined at once, no stop
        again = await run_job(module, script, **settings)
    assert len(dead_records(dead)) == 2
    assert len(again) == 3


async def test_without_a_quarantine_the_job_keeps_failing(tmp_path: Path) -> None:
    settings = {
        "dead_letter_path": str(tmp_path / "dead.jsonl"),
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "quarantine_after_failures": 0,
    }
    for _ in range(3):
        with pytest.raises(JobFailedError, match="cannot handle 'boom'"):
            await run_job(
                ModuleSpec(endpoints=(embedded(),)), [("test/fails", "a", "boom")], **settings
            )


async def test_an_async_embedded_function_gets_state_of_another_type_moved_out(
    tmp_path: Path,
) -> None:
    dead = tmp_path / "dead.jsonl"
    state = MemoryStateBackend()
    settings = Settings(dead_letter_path=str(dead))
    key = ("test/async-echo", "a")
    state.put(key_group_for(*key, settings.max_parallelism), key, {"seen": TypedValue("x/y", b"")})
    sink = ListSink()
    job = Job(
        ModuleSpec(endpoints=(embedded(),)),
        settings,
        sources=[ScriptSource([("test/async-echo", "a", "p"), ("test/async-echo", "a", "q")])],
        sinks=[sink],
        state=state,
    )
    await asyncio.wait_for(job.run(), 30)
    assert sink.values == ["p", "p|q"]
    (record,) = dead_records(dead)
    assert (record["target"], record["state"], record["type"]) == ("test/async-echo", "seen", "x/y")


async def test_a_500_that_says_no_such_function_is_a_dead_letter_at_once(tmp_path: Path) -> None:
    """StateFun's Python SDK raises "Unable to find a function of type ..." for a type it does
    not have, which its web server may answer with 500 and that text: no retries until the
    call timeout, no stopped job."""
    from aiohttp import web

    async def official_style(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> Any:
        if b"typo" in body:
            return web.Response(status=500, text="Unable to find a function of type test/typo")
        return await handle(body)

    dead = tmp_path / "dead.jsonl"
    async with function_server(official_style) as url:
        endpoint = remote(url, transport=TransportSpec(call=timedelta(seconds=30)))
        started = time.monotonic()
        values = await run_job(
            ModuleSpec(endpoints=(endpoint,)),
            [("test/typo", "x", "hi"), ("test/counter", "a", "x")],
            dead_letter_path=str(dead),
        )
    assert time.monotonic() - started < 20  # not retried until the 30 s call timeout
    assert values == ["a=1"]
    (record,) = dead_records(dead)
    assert record["target"] == "test/typo" and "HTTP 500" in record["reason"]


class OrderSource(Source):
    """Submits JSON values typed kafka-json/Order to kafka-json/orders/<id>."""

    bounded = True

    def __init__(self, values: list[tuple[str, bytes]]) -> None:
        super().__init__("test/orders")
        self.values = values

    async def run(self, context: IngressContext) -> None:
        for id_, raw in self.values:
            await context.submit("kafka-json/orders", id_, TypedValue("kafka-json/Order", raw))


async def test_a_value_that_fails_its_own_type_in_a_remote_batch_is_found_and_dead_lettered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The function server reports InvalidValueError for a batch holding one bad value among
    good ones: each message goes again alone, the bad one is a dead letter, the others take
    effect once and in order; the job (policy fail) goes on."""
    from tests.integration.fns import json_fns

    dead = tmp_path / "dead.jsonl"
    values = [("a", b'{"n": 1}'), ("a", b"{garbage"), ("a", b'{"n": 2}'), ("a", b'{"n": 3}')]
    sink = ListSink(json_fns.OUT)
    async with await start_server(json_fns.functions) as server:
        # the first message goes alone; the others wait for it and form one batch
        endpoint = HttpEndpointSpec(FunctionTarget("kafka-json", None), server.url)
        job = Job(
            ModuleSpec(endpoints=(endpoint,)),
            Settings(dead_letter_path=str(dead)),
            sources=[OrderSource(values)],
            sinks=[sink],
        )
        await asyncio.wait_for(job.run(), 30)
    assert sink.values == ["a:1", "a:2", "a:3"]
    assert "messages of the batch go again one by one" in caplog.text
    (record,) = dead_records(dead)
    assert base64.b64decode(record["value_base64"]) == b"{garbage"
    assert "InvalidValueError" in record["reason"] and "kafka-json/Order" in record["reason"]


async def test_quarantine_keeps_every_other_message_exactly_once(tmp_path: Path) -> None:
    """A replayable file ingress, an exactly-once file egress, checkpoints every 20 ms, and a
    function server that fails (HTTP 400) every batch holding 'boom': the job stops twice,
    restarting from its checkpoint each time, then quarantines 'boom'. The committed output
    then holds every other message's count exactly once, in order, per address."""
    from aiohttp import web

    from statefun.module import load_module_text
    from statefun.runtime._plan import build_job

    async def boom_fails(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> Any:
        await asyncio.sleep(0.005)
        if b"boom" in body:
            return web.Response(status=400, text="cannot handle boom")
        return await handle(body)

    lines = []
    for i in range(300):
        lines.append({"target": "test/counter", "id": "abc"[i % 3], "value": f"m{i}"})
        if i == 200:
            lines.append({"target": "test/counter", "id": "b", "value": "boom"})
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    dead = tmp_path / "dead.jsonl"
    settings = Settings(
        dead_letter_path=str(dead),
        checkpoint_dir=str(tmp_path / "checkpoints"),
        checkpoint_interval_ms=20,
    )
    async with function_server(boom_fails) as url:
        text = (
            f"kind: io.statefun.endpoints.v2/http\nspec:\n  functions: test/*\n"
            f"  urlPathTemplate: {url}\n  maxNumBatchRequests: 7\n---\n"
            "kind: io.pystatefun.file.v1/ingress\nspec:\n  id: test/in\n  path: in.jsonl\n---\n"
            "kind: io.pystatefun.file.v1/egress\nspec:\n  id: test/out\n  path: out.jsonl\n"
        )
        (tmp_path / "module.yaml").write_text(text)
        for _ in range(2):
            job = build_job(load_module_text(text, base_dir=tmp_path), settings)
            with pytest.raises(JobFailedError, match="cannot handle boom"):
                await asyncio.wait_for(job.run(), 30)
        job = build_job(load_module_text(text, base_dir=tmp_path), settings)
        await asyncio.wait_for(job.run(), 30)
    out = [json.loads(line)["value"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    for key, sent in (("a", 100), ("b", 100), ("c", 100)):
        assert [v for v in out if v.startswith(f"{key}=")] == [
            f"{key}={n}" for n in range(1, sent + 1)
        ]
    (record,) = dead_records(dead)
    assert record["id"] == "b" and b"boom" in base64.b64decode(record["value_base64"])


async def test_a_flood_of_dead_letters_logs_a_few_lines_and_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = tmp_path / "dead.jsonl"
    script = [("other/thing", str(i), "lost?") for i in range(200)]
    await run_job(ModuleSpec(endpoints=(embedded(),)), script, dead_letter_path=str(dead))
    assert len(dead_records(dead)) == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "statefun.runtime._job"]
    assert len(lines) == 10 and all(
        line.startswith("dead letter to other/thing/") for line in lines
    )
    assert "190 more dead letter(s) within 10 s" in caplog.text
