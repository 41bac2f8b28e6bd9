"""The runtime end to end in one process: embedded and remote functions, real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from statefun._exceptions import JobFailedError
from statefun._settings import Settings
from statefun.egress.base import EgressRecord, Sink, describe_typed_value
from statefun.ingress.base import IngressContext, Source
from statefun.module._specs import (
    EmbeddedEndpointSpec,
    FunctionTarget,
    HttpEndpointSpec,
    ModuleSpec,
    TransportSpec,
)
from statefun.runtime import Job
from statefun.sdk import StringType, TypedValue
from statefun.sdk._serve import start_server
from tests.integration.fns.shop import OUT, functions

pytestmark = pytest.mark.timeout(60)


def string(text: str) -> TypedValue:
    return TypedValue(StringType.typename, StringType.serializer().serialize(text))


class ListSink(Sink):
    def __init__(self, egress_id: str = OUT) -> None:
        super().__init__(egress_id)
        self.values: list[Any] = []

    def write(self, record: EgressRecord) -> None:
        self.values.append(describe_typed_value(record.value)["value"])


class ScriptSource(Source):
    """Submits (typename, id, text) messages, with optional pauses ('sleep', seconds)."""

    bounded = True

    def __init__(self, script: Iterable[tuple[Any, ...]]) -> None:
        super().__init__("test/script")
        self.script = list(script)

    async def run(self, context: IngressContext) -> None:
        for step in self.script:
            if step[0] == "sleep":
                await asyncio.sleep(step[1])
            elif step[0] == "do":
                step[1]()
            else:
                await context.submit(step[0], step[1], string(step[2]))


def embedded() -> EmbeddedEndpointSpec:
    return EmbeddedEndpointSpec(
        FunctionTarget("test", None), "tests.integration.fns.shop:functions"
    )


async def run_job(
    module: ModuleSpec, script: Iterable[tuple[Any, ...]], **settings: Any
) -> list[Any]:
    sink = ListSink()
    job = Job(module, Settings(**settings), sources=[ScriptSource(script)], sinks=[sink])
    await asyncio.wait_for(job.run(), 30)
    return sink.values


@pytest.fixture
async def remote_url() -> AsyncIterator[str]:
    async with await start_server(functions) as server:
        yield server.url


def remote(url: str, **kwargs: Any) -> HttpEndpointSpec:
    return HttpEndpointSpec(FunctionTarget("test", None), url, **kwargs)


SCRIPT = [("test/counter", "a", "x"), ("test/counter", "a", "x"), ("test/counter", "b", "x")]


async def test_embedded_state_and_messages_between_functions() -> None:
    values = await run_job(ModuleSpec(endpoints=(embedded(),)), SCRIPT)
    assert sorted(values) == ["a=1", "a=2", "b=1"]


async def test_remote_state_and_messages_between_functions(remote_url: str) -> None:
    values = await run_job(ModuleSpec(endpoints=(remote(remote_url),)), SCRIPT)
    assert sorted(values) == ["a=1", "a=2", "b=1"]


async def test_remote_hot_key_is_batched_and_ordered(remote_url: str) -> None:
    script = [("test/counter", "hot", "x")] * 300
    module = ModuleSpec(endpoints=(remote(remote_url, max_num_batch_requests=50),))
    sink = ListSink()
    job = Job(module, Settings(), sources=[ScriptSource(script)], sinks=[sink])
    await job.run()
    assert sink.values == [f"hot={i}" for i in range(1, 301)]
    counter_calls = job.counters()["invocations"]
    assert counter_calls == 600  # 300 counter + 300 recorder invocations


class Concurrency:
    """Remote functions that count the requests being served at once (each sleeps a little)."""

    def __init__(self) -> None:
        from statefun import IntType, StatefulFunctions, ValueSpec, egress_message_builder

        self.now = self.peak = 0
        self.functions = StatefulFunctions()

        @self.functions.bind("test/slow", specs=[ValueSpec("count", IntType)])
        async def slow(context: Any, message: Any) -> None:
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                await asyncio.sleep(0.001)
            finally:
                self.now -= 1
            count = (context.storage.count or 0) + 1
            context.storage.count = count
            text = f"{context.address.id}={count}:{message.as_string()}"
            context.send_egress(egress_message_builder(OUT, text, StringType))


@pytest.mark.parametrize("slots", [1, 3, 256])
async def test_remote_calls_in_flight_stay_within_remote_max_connections(slots: int) -> None:
    """More addresses than call slots: the waiting ones take turns, in order per address."""
    fns = Concurrency()
    script = [("test/slow", f"k{i % 40}", str(i)) for i in range(400)]
    async with await start_server(fns.functions) as server:
        module = ModuleSpec(endpoints=(remote(server.url, max_num_batch_requests=3),))
        sink = ListSink()
        job = Job(
            module,
            Settings(remote_max_connections=slots, parallelism=2),
            sources=[ScriptSource(script)],
            sinks=[sink],
        )
        await asyncio.wait_for(job.run(), 30)
    assert 1 <= fns.peak <= slots
    by_key: dict[str, list[str]] = {}
    for value in sink.values:
        key, _, rest = value.partition("=")
        by_key.setdefault(key, []).append(rest)
    assert len(by_key) == 40
    for i in range(40):
        got = by_key[f"k{i}"]
        assert got == [f"{n + 1}:{i + 40 * n}" for n in range(10)]  # counts and order
    for _ in range(slots):  # every slot came back
        await asyncio.wait_for(job.remote_slots.acquire(), 1)


async def test_async_embedded_function_keeps_order_and_state() -> None:
    script = [("test/async-echo", "k", t) for t in "abc"]
    values = await run_job(ModuleSpec(endpoints=(embedded(),)), script)
    assert values == ["a", "a|b", "a|b|c"]


@pytest.mark.parametrize("where", ["embedded", "remote"])
async def test_delayed_message_fires_and_cancellation_removes_it(
    where: str, remote_url: str
) -> None:
    endpoint = embedded() if where == "embedded" else remote(remote_url)
    script = [
        ("test/reminder", "keep", "arm"),
        ("test/reminder", "drop", "arm"),
        ("test/reminder", "drop", "disarm"),
    ]
    values = await run_job(ModuleSpec(endpoints=(endpoint,)), script)
    assert values == ["fired keep"]


# embedded functions' TTL, without sleeping: tests/unit/test_runtime_virtual_time.py
@pytest.mark.parametrize("where", ["remote"])
async def test_expire_after_write(where: str, remote_url: str) -> None:
    endpoint = embedded() if where == "embedded" else remote(remote_url)
    script = [
        ("test/ttl", "k", "set:v1"),
        ("test/ttl", "k", "get"),
        ("sleep", 0.5),
        ("test/ttl", "k", "get"),
    ]
    values = await run_job(ModuleSpec(endpoints=(endpoint,)), script)
    assert values == ["value=v1", "value=None"]


class ManualClock:
    """A wall clock (ms since the epoch) that moves only when told."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.mark.parametrize("where", ["remote"])  # embedded: tests/unit/test_runtime_virtual_time.py
async def test_ttl_reads_the_jobs_clock(where: str, remote_url: str) -> None:
    """State TTL and delayed messages share the job's clock: while it stands still nothing
    expires, however long the wait; once it moves past the TTL, the value is gone."""
    endpoint = embedded() if where == "embedded" else remote(remote_url)
    clock = ManualClock()
    script = [
        ("test/ttl", "k", "set:v1"),
        ("sleep", 0.5),  # longer than the TTL (300 ms) on the real clock
        ("test/ttl", "k", "get"),
        ("sleep", 0.2),
        ("do", lambda: clock.advance(1_000)),
        ("test/ttl", "k", "get"),
    ]
    sink = ListSink()
    job = Job(
        ModuleSpec(endpoints=(endpoint,)),
        Settings(),
        sources=[ScriptSource(script)],
        sinks=[sink],
        clock=clock,
    )
    await asyncio.wait_for(job.run(), 30)
    assert sink.values == ["value=v1", "value=None"]


async def test_unknown_function_type_goes_to_dead_letters(tmp_path: Path) -> None:
    dead = tmp_path / "dead.jsonl"
    script = [("test/counter", "a", "x"), ("other/thing", "z", "lost?")]
    values = await run_job(ModuleSpec(endpoints=(embedded(),)), script, dead_letter_path=str(dead))
    assert values == ["a=1"]
    (line,) = dead.read_text().splitlines()
    record = json.loads(line)
    assert record["target"] == "other/thing" and record["id"] == "z"
    assert "no endpoint" in record["reason"]


async def test_function_failure_with_dead_letter_policy(tmp_path: Path) -> None:
    dead = tmp_path / "dead.jsonl"
    script = [("test/fails", "a", "boom"), ("test/counter", "a", "x")]
    values = await run_job(
        ModuleSpec(endpoints=(embedded(),)),
        script,
        remote_failure_policy="dead-letter",
        dead_letter_path=str(dead),
    )
    assert values == ["a=1"]
    record = json.loads(dead.read_text())
    assert "ValueError: cannot handle 'boom'" in record["reason"]


async def test_function_failure_with_fail_policy_stops_the_job() -> None:
    with pytest.raises(JobFailedError, match="cannot handle 'boom'"):
        await run_job(ModuleSpec(endpoints=(embedded(),)), [("test/fails", "a", "boom")])


async def test_remote_function_down_fails_after_call_timeout(unused_tcp_port: int) -> None:
    endpoint = remote(
        f"http://127.0.0.1:{unused_tcp_port}/statefun",
        transport=TransportSpec(call=__import__("datetime").timedelta(milliseconds=600)),
    )
    with pytest.raises(JobFailedError, match="did not answer within its call timeout"):
        await run_job(ModuleSpec(endpoints=(endpoint,)), SCRIPT[:1])


async def test_remote_garbage_answer_is_a_terminal_error(tmp_path: Path) -> None:
    from aiohttp import web

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(body=b"\xff\xfe not protobuf")

    app = web.Application()
    app.router.add_post("/statefun", garbage)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    dead = tmp_path / "dead.jsonl"
    try:
        values = await run_job(
            ModuleSpec(endpoints=(remote(f"http://127.0.0.1:{port}/statefun"),)),
            SCRIPT[:1],
            remote_failure_policy="dead-letter",
            dead_letter_path=str(dead),
        )
    finally:
        await runner.cleanup()
    assert values == []
    assert "not a FromFunction" in json.loads(dead.read_text())["reason"]


@contextlib.asynccontextmanager
async def http_ingress_job(sink: ListSink) -> AsyncIterator[str]:
    """A job with an embedded counter and an HTTP ingress; yields the ingress's URL."""
    from statefun.ingress.http import HttpSource

    job = Job(ModuleSpec(endpoints=(embedded(),)), Settings(), sinks=[sink])
    source = HttpSource("test/http", port=0, replies=job.replies, reply_timeout_s=5)
    job.sources = [source]
    running = asyncio.create_task(job.run())
    try:
        for _ in range(100):
            if source.port:
                break
            await asyncio.sleep(0.02)
        yield source.url
    finally:
        job.stop()
        await running


async def test_http_ingress_send_and_call(remote_url: str) -> None:
    sink = ListSink()
    async with http_ingress_job(sink) as url, aiohttp.ClientSession() as http:
        raw = {"Content-Type": "application/octet-stream"}
        async with http.post(f"{url}/messages/test/counter/a", data=b"hi", headers=raw) as r:
            assert r.status == 415  # no type, not text/plain
        headers = {"Content-Type": "text/plain"}
        async with http.post(f"{url}/messages/test/counter/a", data="hi", headers=headers) as r:
            assert r.status == 202
        async with http.post(f"{url}/call/test/counter/a", data="hi", headers=headers) as r:
            assert r.status == 200
            assert await r.text() == "2"
            assert r.headers["X-Statefun-Typename"] == "io.statefun.types/int"
        async with http.post(f"{url}/messages/nope/x/a", data="hi", headers=headers) as r:
            assert r.status == 404
        big = io.BytesIO(b"x" * (2 << 20))
        async with http.post(f"{url}/messages/test/counter/a", data=big, headers=headers) as r:
            assert r.status == 413
    assert sorted(sink.values) == ["a=1", "a=2"]


INGRESS_REQUESTS: list[tuple[str, str, str, bytes, dict[str, str], int, str]] = [
    # (what, method, path, body, headers, status, text in the reply)
    (
        "int as text",
        "POST",
        "/call/test/counter/b?typename=io.statefun.types/int",
        b"41",
        {"Content-Type": "text/plain"},
        200,
        "1",
    ),
    (
        "bad int text",
        "POST",
        "/messages/test/counter/b?typename=io.statefun.types/int",
        b"x1",
        {"Content-Type": "text/plain"},
        400,
        "int",
    ),
    (
        "bad typename",
        "POST",
        "/messages/test/counter/b",
        b"x",
        {"X-Statefun-Typename": "no-slash"},
        400,
        "typename",
    ),
    (
        "malformed function type (an encoded slash)",
        "POST",
        "/messages/test/counter%2F/b",
        b"x",
        {"Content-Type": "text/plain"},
        400,
        "empty name",
    ),
    (
        "function type not in the module",
        "POST",
        "/messages/te st/counter/b",
        b"x",
        {"Content-Type": "text/plain"},
        404,
        "no function type 'te st/counter'",
    ),
    ("unknown path", "POST", "/elsewhere", b"x", {}, 404, "no such path"),
    ("wrong method", "GET", "/messages/test/counter/b", b"", {}, 405, "use POST"),
    ("health", "GET", "/health", b"", {}, 200, '"ingress": "test/http"'),
    ("health by POST", "POST", "/health", b"", {}, 405, "use GET"),
    (
        "percent-encoded id",
        "POST",
        "/call/test/counter/a%2Fb",
        b"x",
        {"Content-Type": "text/plain"},
        200,
        "1",
    ),
]


async def test_http_ingress_answers_every_request_with_a_reason() -> None:
    async with http_ingress_job(ListSink()) as url, aiohttp.ClientSession() as http:
        for what, method, path, body, headers, status, text in INGRESS_REQUESTS:
            async with http.request(method, url + path, data=body, headers=headers) as response:
                got = await response.text()
                assert (response.status, text in got) == (status, True), (what, got)


@contextlib.asynccontextmanager
async def function_server(
    respond: Callable[[bytes, Callable[[bytes], Awaitable[bytes]]], Awaitable[Any]],
) -> AsyncIterator[str]:
    """An aiohttp server on 127.0.0.1 for the test functions; ``respond(body, handle)`` gives
    the response (bytes, or an aiohttp Response), ``handle`` the SDK's answer to ``body``."""
    from aiohttp import web

    from statefun.sdk import RequestReplyHandler

    handler = RequestReplyHandler(functions)

    async def answer(request: web.Request) -> web.Response:
        got = await respond(await request.read(), handler.handle_async)
        return got if isinstance(got, web.Response) else web.Response(body=got)

    app = web.Application()
    app.router.add_post("/statefun", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/statefun"
    finally:
        await runner.cleanup()


async def test_a_batchs_outputs_go_out_when_the_next_batch_fails(tmp_path: Path) -> None:
    """The outputs of a remote batch are sent once the address's next request is written; a
    next batch that fails for good does not take them along: every message ends either as an
    output (in order) or as a dead letter."""
    from aiohttp import web

    requests = 0

    async def second_fails(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> Any:
        nonlocal requests
        requests += 1
        await asyncio.sleep(0.01)  # messages pile up into the next batch meanwhile
        if requests == 2:
            return web.Response(status=400, text="no")
        return await handle(body)

    sink = ListSink()
    async with function_server(second_fails) as url:
        job = Job(
            ModuleSpec(endpoints=(remote(url, max_num_batch_requests=5),)),
            Settings(
                remote_failure_policy="dead-letter",
                dead_letter_path=str(tmp_path / "dead-letters.jsonl"),
            ),
            sources=[ScriptSource([("test/counter", "hot", "x")] * 40)],
            sinks=[sink],
        )
        await asyncio.wait_for(job.run(), 30)
    assert requests >= 3
    counted = len(sink.values)
    assert 0 < counted < 40 and job.dead_letters == 40 - counted
    assert len((tmp_path / "dead-letters.jsonl").read_text().splitlines()) == 40 - counted
    # the first batch's outputs (before the failed one) and all after it, counting on from
    # the state the first batch left
    assert sink.values == [f"hot={i}" for i in range(1, counted + 1)]


def from_function_with_egress(*egress: tuple[str, str]) -> bytes:
    """A FromFunction whose only effects are egress records: (egress id, text) each."""
    from statefun.sdk._proto import request_reply_pb2 as pb

    records = []
    for egress_id, text in egress:
        namespace, _, kind = egress_id.rpartition("/")
        argument = string(text)
        records.append(
            pb.FromFunction.EgressMessage(
                egress_namespace=namespace,
                egress_type=kind,
                argument=pb.TypedValue(
                    typename=argument.typename, has_value=True, value=argument.value
                ),
            )
        )
    result = pb.FromFunction.InvocationResponse(outgoing_egresses=records)
    return bytes(pb.FromFunction(invocation_result=result).SerializeToString())


async def test_a_batchs_egress_records_reach_each_egress_in_order(tmp_path: Path) -> None:
    """Records of one remote batch for several egresses, interleaved: each sink gets its own
    in order; a record for an egress the module lacks goes to the dead letters."""
    reply = from_function_with_egress(
        ("test/out", "a1"),
        ("test/other", "b1"),
        ("test/out", "a2"),
        ("test/nowhere", "lost"),
        ("test/out", "a3"),
        ("test/other", "b2"),
    )

    async def answer(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> bytes:
        return reply

    out, other = ListSink(), ListSink("test/other")
    dead = tmp_path / "dead.jsonl"
    async with function_server(answer) as url:
        job = Job(
            ModuleSpec(endpoints=(remote(url),)),
            Settings(dead_letter_path=str(dead)),
            sources=[ScriptSource(SCRIPT[:1])],
            sinks=[out, other],
        )
        await asyncio.wait_for(job.run(), 30)
    assert out.values == ["a1", "a2", "a3"]
    assert other.values == ["b1", "b2"]
    [letter] = [json.loads(line) for line in dead.read_text().splitlines()]
    assert letter["egress"] == "test/nowhere" and "unknown egress" in letter["reason"]


async def test_egress_without_an_id_fails_the_batch_and_changes_nothing(tmp_path: Path) -> None:
    """A response with an egress record that lacks its namespace is garbage: none of its
    records go out (not even those before it), and the batch is a dead letter."""
    reply = from_function_with_egress(("test/out", "a1"), ("/out", "no namespace"))

    async def answer(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> bytes:
        return reply

    sink = ListSink()
    dead = tmp_path / "dead.jsonl"
    async with function_server(answer) as url:
        job = Job(
            ModuleSpec(endpoints=(remote(url),)),
            Settings(remote_failure_policy="dead-letter", dead_letter_path=str(dead)),
            sources=[ScriptSource(SCRIPT[:1])],
            sinks=[sink],
        )
        await asyncio.wait_for(job.run(), 30)
    assert sink.values == []
    [letter] = [json.loads(line) for line in dead.read_text().splitlines()]
    assert "sent egress without an id" in letter["reason"]


async def run_watched(job: Job, look: Callable[[], None]) -> None:
    """Run ``job``, calling ``look`` at every turn of the loop meanwhile."""

    async def watch() -> None:
        while True:
            look()
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(job.run(), 30)
    finally:
        watcher.cancel()


async def test_mailbox_past_max_batch_stops_the_sources() -> None:
    """Backpressure: past maxNumBatchRequests a hot key's mailbox closes the sources' gate.

    What was admitted before the gate closed still arrives, so the mailbox is bounded by
    max_in_flight_remote_messages, and the gate stays closed until it is back under the limit.
    """

    async def slow(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> bytes:
        await asyncio.sleep(0.02)
        return await handle(body)

    async with function_server(slow) as url:
        sink = ListSink()
        job = Job(
            ModuleSpec(endpoints=(remote(url, max_num_batch_requests=5),)),
            Settings(max_in_flight_remote_messages=30),
            sources=[ScriptSource([("test/counter", "hot", "x")] * 100)],
            sinks=[sink],
        )
        largest = 0
        gate_closed_by_mailbox = False
        encoded_ahead = False

        def look() -> None:
            nonlocal largest, gate_closed_by_mailbox, encoded_ahead
            gate_closed_by_mailbox |= bool(job._overfull_mailboxes)
            for dispatcher in job.dispatchers:
                mailbox = dispatcher.busy.get(("test/counter", "hot"))
                largest = max(largest, len(mailbox) if mailbox else 0)
                # waiting messages of a remote function are encoded while they wait
                encoded_ahead |= bool(mailbox) and all(e.wire is not None for e in mailbox or ())

        await run_watched(job, look)
    assert sink.values == [f"hot={i}" for i in range(1, 101)]
    assert gate_closed_by_mailbox
    assert encoded_ahead
    assert 5 < largest <= 30


async def test_a_burst_to_a_busy_address_stops_at_its_batch_limit() -> None:
    """An ingress emitting to an address with a batch in flight finds the gate closed right
    after the message that fills the mailbox past the batch limit (in the same loop step, not
    after the dispatcher's next turn), and every message still arrives in order."""

    async def slow(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> bytes:
        await asyncio.sleep(0.05)
        return await handle(body)

    open_after: list[bool] = []

    class Burst(Source):
        bounded = True

        async def run(self, context: IngressContext) -> None:
            context.emit("test/counter", "hot", string("x"))
            while not job.dispatchers[0].busy and not job.dispatchers[1].busy:
                await asyncio.sleep(0.001)  # the first batch is in flight
            for _ in range(20):
                await context.room()
                context.emit("test/counter", "hot", string("x"))
                open_after.append(job._room.is_set())

    async with function_server(slow) as url:
        sink = ListSink()
        job = Job(
            ModuleSpec(endpoints=(remote(url, max_num_batch_requests=5),)),
            Settings(),
            sources=[Burst("test/burst")],
            sinks=[sink],
        )
        await asyncio.wait_for(job.run(), 30)
    assert open_after[:6] == [True] * 5 + [False]  # the 6th message is one past the limit
    assert sink.values == [f"hot={i}" for i in range(1, 22)]


@pytest.mark.parametrize(
    ("local_limit", "remote_limit"), [(5, 40), (1_000, 12)], ids=["embedded-low", "remote-low"]
)
async def test_messages_to_remote_functions_have_their_own_limit(
    local_limit: int, remote_limit: int
) -> None:
    """Messages to remote functions count against ``max_in_flight_remote_messages``, not
    ``max_in_flight_messages``: many keys' messages may wait for their batches past the
    embedded limit, up to the remote one; the counts return to zero."""

    async def slow(body: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> bytes:
        await asyncio.sleep(0.01)
        return await handle(body)

    script = [("test/counter", f"k{i % 30}", "x") for i in range(300)]
    async with function_server(slow) as url:
        sink = ListSink()
        job = Job(
            ModuleSpec(endpoints=(remote(url),)),
            Settings(
                max_in_flight_messages=local_limit, max_in_flight_remote_messages=remote_limit
            ),
            sources=[ScriptSource(script)],
            sinks=[sink],
        )
        largest = 0
        counted_apart = True  # every message is to a remote function

        def look() -> None:
            nonlocal largest, counted_apart
            counted_apart &= job.pending == job.pending_remote
            largest = max(largest, job.pending_remote)

        await run_watched(job, look)
    assert len(sink.values) == 300
    assert counted_apart
    assert job.pending == job.pending_remote == 0
    # up to the remote limit (and past the embedded one in the first case)
    assert remote_limit * 0.8 <= largest <= remote_limit


async def test_the_mailbox_gate_opens_when_a_batch_takes_the_mailbox_back() -> None:
    """Sources wait while an address's mailbox is past its batch limit, and go on the moment
    a batch takes it back within the limit (not at a later check), each address on its own."""
    job = Job(
        ModuleSpec(endpoints=(remote("http://127.0.0.1:9/statefun", max_num_batch_requests=5),)),
        Settings(),
        sources=[],
        sinks=[ListSink()],
    )
    hot, other = ("test/counter", "hot"), ("test/counter", "other")
    job.note_mailbox(hot, 5)
    assert job._room.is_set()  # at the limit: not past it
    job.note_mailbox(hot, 6)
    job.note_mailbox(other, 9)
    assert not job._room.is_set()
    job.mailbox_taken(hot, 6)  # still past the limit
    job.mailbox_taken(hot, 1)
    assert not job._room.is_set()  # the other mailbox is still past it
    job.mailbox_taken(other, 0)
    assert job._room.is_set()
    job.note_mailbox(hot, 7)
    job.mailbox_taken(("test/counter", "unrelated"), 0)
    assert not job._room.is_set()
    job.mailbox_taken(hot, 0)  # its batches ended: the mailbox is gone
    assert job._room.is_set()
