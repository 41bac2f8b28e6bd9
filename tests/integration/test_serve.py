"""HTTP serving: real servers on 127.0.0.1, a real aiohttp client, real protobuf bytes.

The endpoint tests run against both servers: the built-in one (``start_server``) and the
aiohttp application (``make_app``).

Also the ``statefun serve`` command, run as a process of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeAlias

import aiohttp
import pytest
from aiohttp import web

from statefun import (
    Context,
    IntType,
    Message,
    RequestReplyHandler,
    StatefulFunctions,
    StringType,
    ValueSpec,
    kafka_egress_message,
    message_builder,
)
from statefun._cli import main
from statefun.sdk import make_app, start_server
from statefun.sdk._proto import egress_pb2
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._serve import RunningServer
from tests._support import free_port

REPO = Path(__file__).resolve().parents[2]
MAX_BODY = 4096
OCTETS = {"Content-Type": "application/octet-stream"}
DEADLINE = 10.0  # seconds any one wait may take before the test fails


# -- requests and replies ------------------------------------------------------------------


def typed(tpe: Any, value: Any) -> pb.TypedValue:
    if value is None:
        return pb.TypedValue(typename=tpe.typename, has_value=False)
    return pb.TypedValue(
        typename=tpe.typename, has_value=True, value=tpe.serializer().serialize(value)
    )


def request(
    typename: str,
    id_: str,
    arguments: list[pb.TypedValue],
    state: dict[str, pb.TypedValue] | None = None,
    caller: tuple[str, str] | None = None,
) -> bytes:
    namespace, name = typename.split("/")
    to_function = pb.ToFunction()
    batch = to_function.invocation
    batch.target.namespace, batch.target.type, batch.target.id = namespace, name, id_
    for state_name, value in (state or {}).items():
        batch.state.add(state_name=state_name, state_value=value)
    for argument in arguments:
        invocation = batch.invocations.add(argument=argument)
        if caller is not None:
            caller_typename, caller_id = caller
            caller_namespace, caller_name = caller_typename.split("/")
            invocation.caller.namespace = caller_namespace
            invocation.caller.type = caller_name
            invocation.caller.id = caller_id
    return to_function.SerializeToString()


def decode(tpe: Any, value: pb.TypedValue) -> Any:
    assert value.typename == tpe.typename
    return tpe.serializer().deserialize(value.value) if value.has_value else None


def as_reply(body: bytes) -> pb.FromFunction:
    reply = pb.FromFunction()
    reply.ParseFromString(body)
    return reply


def one_line(text: str) -> str:
    assert text.endswith("\n")
    line = text[:-1]
    assert line
    assert "\n" not in line
    assert "Traceback" not in line
    return line


# -- the functions served ------------------------------------------------------------------


class Probe:
    """Lets a test hold the slow function inside an invocation."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()


def make_functions(probe: Probe) -> StatefulFunctions:
    functions = StatefulFunctions()

    @functions.bind("test/counter", specs=[ValueSpec("count", IntType)])
    async def counter(context: Context, message: Message) -> None:
        count = (context.storage.count or 0) + message.as_int()
        context.storage.count = count
        caller = context.caller.id if context.caller is not None else "ingress"
        context.send(message_builder("test/peer", context.address.id, int_value=count))
        context.send_after(
            timedelta(seconds=2),
            message_builder("test/counter", context.address.id, int_value=0),
            cancellation_token="tick",
        )
        context.send_egress(
            kafka_egress_message(typename="test/out", topic="counts", key=caller, value=f"{count}")
        )

    @functions.bind("test/sync", specs=[ValueSpec("last", StringType)])
    def sync(context: Context, message: Message) -> None:
        context.storage.last = message.as_string()

    @functions.bind("test/boom")
    async def boom(context: Context, message: Message) -> None:
        raise ValueError("bad input\nover two lines")

    @functions.bind("test/slow")
    async def slow(context: Context, message: Message) -> None:
        probe.entered.set()
        await probe.release.wait()
        context.send(message_builder("test/peer", "done", int_value=1))

    return functions


@pytest.fixture
def probe() -> Probe:
    return Probe()


class AppServer:
    """``make_app`` run by aiohttp on 127.0.0.1, looking like a ``RunningServer``."""

    def __init__(self, runner: web.AppRunner, path: str) -> None:
        self.runner = runner
        self.path = path
        self.port: int = runner.addresses[0][1]

    @classmethod
    async def start(cls, functions: StatefulFunctions, path: str = "/statefun") -> AppServer:
        app = make_app(functions, path=path, max_body_bytes=MAX_BODY)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return cls(runner, path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    async def close(self) -> None:
        await self.runner.cleanup()


Server: TypeAlias = RunningServer | AppServer


@pytest.fixture(params=["builtin", "aiohttp"])
async def server(request: pytest.FixtureRequest, probe: Probe) -> AsyncIterator[Server]:
    running: Server
    if request.param == "builtin":
        running = await start_server(
            make_functions(probe), port=0, max_body_bytes=MAX_BODY, shutdown_timeout=5
        )
    else:
        running = await AppServer.start(make_functions(probe))
    try:
        yield running
    finally:
        await running.close()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=DEADLINE)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield session


async def post(
    client: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, bytes, aiohttp.ClientResponse]:
    skip = () if headers is None or "Content-Type" in headers else ("Content-Type",)
    async with client.post(
        url, data=body, headers=headers or {}, skip_auto_headers=skip
    ) as response:
        return response.status, await response.read(), response


COUNTER_CALL = request(
    "test/counter",
    "c1",
    [typed(IntType, 2), typed(IntType, 3)],
    state={"count": typed(IntType, 10)},
    caller=("test/caller", "me"),
)


def check_counter_reply(body: bytes) -> None:
    reply = as_reply(body)
    assert reply.WhichOneof("response") == "invocation_result"
    result = reply.invocation_result
    # state: 10 + 2 + 3, written once as a MODIFY
    assert len(result.state_mutations) == 1
    mutation = result.state_mutations[0]
    assert mutation.state_name == "count"
    assert mutation.mutation_type == pb.FromFunction.PersistedValueMutation.MODIFY
    assert decode(IntType, mutation.state_value) == 15
    # one message per invocation, in order
    assert [(m.target.namespace, m.target.type, m.target.id) for m in result.outgoing_messages] == [
        ("test", "peer", "c1"),
        ("test", "peer", "c1"),
    ]
    assert [decode(IntType, m.argument) for m in result.outgoing_messages] == [12, 15]
    # delayed messages
    assert [d.delay_in_ms for d in result.delayed_invocations] == [2000, 2000]
    assert {d.cancellation_token for d in result.delayed_invocations} == {"tick"}
    # egress: Kafka records whose key is the caller's id
    assert len(result.outgoing_egresses) == 2
    for egress, expected in zip(result.outgoing_egresses, ["12", "15"], strict=True):
        assert (egress.egress_namespace, egress.egress_type) == ("test", "out")
        record = egress_pb2.KafkaProducerRecord.FromString(egress.argument.value)
        assert (record.topic, record.key, record.value_bytes) == ("counts", "me", expected.encode())


# -- the endpoint --------------------------------------------------------------------------


async def test_invocation(server: Server, client: aiohttp.ClientSession) -> None:
    status, body, response = await post(client, server.url, COUNTER_CALL, OCTETS)
    assert status == 200
    assert response.content_type == "application/octet-stream"
    check_counter_reply(body)


async def test_content_type_may_be_missing_or_carry_parameters(
    server: Server, client: aiohttp.ClientSession
) -> None:
    for headers in ({}, {"Content-Type": "Application/Octet-Stream; charset=binary"}):
        status, body, _ = await post(client, server.url, COUNTER_CALL, headers or None)
        assert status == 200, headers
        check_counter_reply(body)


async def test_sync_function(server: Server, client: aiohttp.ClientSession) -> None:
    call = request(
        "test/sync",
        "s",
        [typed(StringType, "a"), typed(StringType, "b")],
        state={"last": typed(StringType, None)},
    )
    status, body, _ = await post(client, server.url, call, OCTETS)
    assert status == 200
    (mutation,) = as_reply(body).invocation_result.state_mutations
    assert decode(StringType, mutation.state_value) == "b"


async def test_incomplete_invocation_context(server: Server, client: aiohttp.ClientSession) -> None:
    status, body, _ = await post(
        client, server.url, request("test/counter", "c1", [typed(IntType, 1)]), OCTETS
    )
    assert status == 200
    reply = as_reply(body)
    assert reply.WhichOneof("response") == "incomplete_invocation_context"
    (missing,) = reply.incomplete_invocation_context.missing_values
    assert (missing.state_name, missing.type_typename) == ("count", "io.statefun.types/int")


async def test_health(server: Server, client: aiohttp.ClientSession) -> None:
    base = server.url.removesuffix(server.path)
    async with client.get(f"{base}/health") as response:
        assert response.status == 200
        assert await response.json() == {
            "status": "ok",
            "functions": ["test/boom", "test/counter", "test/slow", "test/sync"],
        }


BAD_REQUESTS: list[tuple[str, str, Any, dict[str, str] | None, int, str]] = [
    # (what, method, body, headers, status, text in the reason)
    ("garbled body", "POST", b"\xff\xfe garbage \x00", OCTETS, 400, "not a ToFunction"),
    ("empty body", "POST", b"", OCTETS, 400, "no invocation"),
    (
        "no target",
        "POST",
        pb.ToFunction(invocation=pb.ToFunction.InvocationBatchRequest()).SerializeToString(),
        OCTETS,
        400,
        "no target",
    ),
    ("wrong content type", "POST", COUNTER_CALL, {"Content-Type": "text/plain"}, 415, "text/plain"),
    (
        "unknown function",
        "POST",
        request("test/nobody", "x", [typed(IntType, 1)]),
        OCTETS,
        404,
        "'test/nobody'",
    ),
    ("too large", "POST", b"\x00" * (MAX_BODY + 1), OCTETS, 413, f"limit of {MAX_BODY} bytes"),
    ("wrong method", "GET", None, None, 405, "use POST"),
    (
        "function raises",
        "POST",
        request("test/boom", "b", [typed(IntType, 1)]),
        OCTETS,
        500,
        "function test/boom failed: ValueError: bad input over two lines",
    ),
]


async def send_bad(
    client: aiohttp.ClientSession,
    url: str,
    method: str,
    body: Any,
    headers: dict[str, str] | None,
) -> tuple[int, str, aiohttp.ClientResponse]:
    async with client.request(method, url, data=body, headers=headers) as response:
        return response.status, await response.text(), response


@pytest.mark.parametrize(
    ("method", "body", "headers", "status", "reason"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
async def test_error_replies(
    server: Server,
    client: aiohttp.ClientSession,
    method: str,
    body: Any,
    headers: dict[str, str] | None,
    status: int,
    reason: str,
) -> None:
    got_status, text, response = await send_bad(client, server.url, method, body, headers)
    assert got_status == status
    assert response.content_type == "text/plain"
    assert reason in one_line(text)
    if status == 405:
        assert response.headers["Allow"] == "POST"


async def test_too_large_chunked_body(server: Server, client: aiohttp.ClientSession) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"\x00" * (MAX_BODY // 2)

    status, text, _ = await send_bad(client, server.url, "POST", chunks(), OCTETS)
    assert status == 413
    assert "limit of 4096 bytes" in one_line(text)


async def test_failure_is_logged_with_traceback(
    server: Server, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="statefun.sdk._serve"):
        status, text, _ = await send_bad(
            client, server.url, "POST", request("test/boom", "b", [typed(IntType, 1)]), OCTETS
        )
    assert status == 500
    assert "Traceback" not in text
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "function test/boom failed"
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)


async def test_keeps_serving_after_every_error(
    server: Server, client: aiohttp.ClientSession
) -> None:
    for what, method, body, headers, status, _ in BAD_REQUESTS:
        got, _text, _ = await send_bad(client, server.url, method, body, headers)
        assert got == status, what
    status, body, _ = await post(client, server.url, COUNTER_CALL, OCTETS)
    assert status == 200
    check_counter_reply(body)


async def test_close_finishes_in_flight_requests(
    probe: Probe, client: aiohttp.ClientSession
) -> None:
    running = await start_server(make_functions(probe), port=0, shutdown_timeout=DEADLINE)
    call = asyncio.ensure_future(
        post(client, running.url, request("test/slow", "x", [typed(IntType, 1)]), OCTETS)
    )
    await asyncio.wait_for(probe.entered.wait(), DEADLINE)
    closing = asyncio.ensure_future(running.close())
    # Once the listening socket is closed, the server is shutting down; the call is in flight.
    await poll(lambda: not port_accepts(running.port), "the server to stop listening")
    assert not call.done() and not closing.done()
    probe.release.set()
    status, body, _ = await asyncio.wait_for(call, DEADLINE)
    assert status == 200
    (message,) = as_reply(body).invocation_result.outgoing_messages
    assert message.target.id == "done"
    await asyncio.wait_for(closing, DEADLINE)


def test_make_app_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="StatefulFunctions or a RequestReplyHandler"):
        make_app(object())  # type: ignore[arg-type]
    functions = StatefulFunctions()
    with pytest.raises(ValueError, match="start with '/'"):
        make_app(functions, path="statefun")
    with pytest.raises(ValueError, match="health"):
        make_app(RequestReplyHandler(functions), path="/health")
    with pytest.raises(ValueError, match="positive"):
        make_app(functions, max_body_bytes=0)


# -- statefun serve ------------------------------------------------------------------------


def port_accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def poll(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def statefun_command() -> list[str]:
    script = Path(sys.executable).parent / "statefun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "statefun"]


async def wait_healthy(
    client: aiohttp.ClientSession, url: str, process: asyncio.subprocess.Process
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        assert process.returncode is None, "statefun serve exited early"
        try:
            async with client.get(url) as response:
                if response.status == 200:
                    health: dict[str, Any] = await response.json()
                    return health
        except aiohttp.ClientConnectionError:
            pass
        if loop.time() > deadline:
            raise AssertionError(f"{url} did not answer in {DEADLINE}s")
        await asyncio.sleep(0.05)


async def test_cli_serves_the_greeter_until_sigterm(client: aiohttp.ClientSession) -> None:
    port = free_port()
    target = "examples.greeter.functions:functions"
    process = await asyncio.create_subprocess_exec(
        *statefun_command(),
        "serve",
        target,
        "--port",
        str(port),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        health = await wait_healthy(client, f"{base}/health", process)
        assert health == {"status": "ok", "functions": ["example/greeter"]}

        call = request(
            "example/greeter", "Ada", [typed(StringType, "hi")], state={"seen": typed(IntType, 2)}
        )
        status, body, _ = await post(client, f"{base}/statefun", call, OCTETS)
        assert status == 200
        result = as_reply(body).invocation_result
        (mutation,) = result.state_mutations
        assert decode(IntType, mutation.state_value) == 3
        (egress,) = result.outgoing_egresses
        assert (egress.egress_namespace, egress.egress_type) == ("example", "greets")
        record = egress_pb2.KafkaProducerRecord.FromString(egress.argument.value)
        assert (record.topic, record.key) == ("greetings", "Ada")
        assert record.value_bytes == b"Hello Ada for the 3rd time!"

        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), DEADLINE)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    log = stderr.decode()
    assert process.returncode == 0, log
    assert f"serving example/greeter at http://127.0.0.1:{port}/statefun" in log
    assert "Traceback" not in log


def test_cli_bad_target_exits_2() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "statefun", "serve", "examples.greeter.functions:nothing"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=DEADLINE * 3,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert completed.stderr.count("\n") == 1
    assert "has no attribute 'nothing'" in completed.stderr


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("examples.greeter.nowhere:functions", "module 'examples.greeter.nowhere' not found"),
        ("examples.greeter.functions:ordinal", "is a function, expected a StatefulFunctions"),
        ("examples.greeter.functions", "must look like package.module:attribute"),
        ("examples.greeter.functions:", "must look like package.module:attribute"),
    ],
)
def test_cli_bad_targets(target: str, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-level", "warning", "serve", target, "--log-level", "DEBUG"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("statefun serve: error: ")
    assert reason in one_line(err)


def test_cli_import_error_in_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken_functions_module.py").write_text("import not_a_real_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["serve", "broken_functions_module:functions"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "importing 'broken_functions_module' failed: ModuleNotFoundError" in err
    assert "not_a_real_dependency_xyz" in err


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["serve"]) == 2
    assert main(["serve", "x:y", "--port", "70000"]) == 2
    assert main(["serve", "x:y", "--max-body-size", "lots"]) == 2
    assert main(["serve", "x:y", "--log-level", "loud"]) == 2
    assert main(["--help"]) == 0
    assert "serve" in capsys.readouterr().out
