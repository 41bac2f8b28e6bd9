"""The built-in HTTP/1.1 server of ``start_server`` (``sdk/_http_server.py``), byte by byte.

Each test talks to a real server on 127.0.0.1 through a raw socket, so it controls exactly
what is sent and when: keep-alive, pipelining, chunked bodies, ``Expect: 100-continue``,
malformed requests, and the timeouts that close idle or stalled connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from statefun import Context, IntType, Message, StatefulFunctions, ValueSpec, message_builder
from statefun._http.defences import ServerOptions
from statefun.sdk import start_server
from statefun.sdk._serve import RunningServer
from tests.integration.test_serve import as_reply, decode, port_accepts, typed
from tests.integration.test_serve import request as to_function

pytestmark = pytest.mark.timeout(60)

MAX_BODY = 4096
DEADLINE = 10.0  # seconds any one wait may take before the test fails
KEEPALIVE = 0.3  # the keep-alive timeout of the servers that test it
SLACK = 0.05  # tolerance of "took at least the timeout"


def make_functions() -> StatefulFunctions:
    functions = StatefulFunctions()

    @functions.bind("test/count", specs=[ValueSpec("count", IntType)])
    def count(context: Context, message: Message) -> None:
        context.storage.count = (context.storage.count or 0) + (message.as_int() or 0)

    @functions.bind("test/wait")
    async def wait(context: Context, message: Message) -> None:
        """Waits the message's number of milliseconds, then says which it was."""
        ms = message.as_int() or 0
        await asyncio.sleep(ms / 1000)
        context.send(message_builder("test/peer", context.address.id, int_value=ms))

    return functions


def count_call(add: int, stored: int | None) -> bytes:
    return to_function("test/count", "k", [typed(IntType, add)], {"count": typed(IntType, stored)})


def wait_call(ms: int, id_: str = "w") -> bytes:
    return to_function("test/wait", id_, [typed(IntType, ms)])


def counted(body: bytes) -> int:
    """The count a reply of test/count stores."""
    (mutation,) = as_reply(body).invocation_result.state_mutations
    value: int = decode(IntType, mutation.state_value)
    return value


def waited(body: bytes) -> tuple[str, int]:
    """(id, milliseconds) of a reply of test/wait."""
    (message,) = as_reply(body).invocation_result.outgoing_messages
    return message.target.id, decode(IntType, message.argument)


def post(
    body: bytes,
    path: str = "/statefun",
    version: str = "1.1",
    headers: str = "Content-Type: application/octet-stream\r\n",
) -> bytes:
    head = (
        f"POST {path} HTTP/{version}\r\nHost: localhost\r\n{headers}Content-Length: {len(body)}\r\n"
    )
    return head.encode() + b"\r\n" + body


# -- a raw client --------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    reason: str
    headers: dict[str, str]  # names in lower case
    body: bytes

    @property
    def closes(self) -> bool:
        return self.headers.get("connection", "").lower() == "close"


async def read_reply(reader: asyncio.StreamReader, head_only: bool = False) -> Reply:
    """One response: status line, headers, and a body of Content-Length bytes."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE)
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    version, status, reason = status_line.split(" ", 2)
    assert version == "HTTP/1.1", status_line
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        assert name.lower() not in headers, f"{name} twice"
        headers[name.lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = b"" if head_only else await asyncio.wait_for(reader.readexactly(length), DEADLINE)
    return Reply(int(status), reason, headers, body)


async def assert_closed_by_server(reader: asyncio.StreamReader) -> None:
    """The server closes the connection in time, with nothing more to read (TimeoutError or
    AssertionError otherwise)."""
    try:
        rest = await asyncio.wait_for(reader.read(), DEADLINE)
    except ConnectionResetError:
        return
    assert rest == b"", rest


class Connection:
    """A raw connection to the server; ``async with`` closes it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def ask(self, data: bytes) -> Reply:
        await self.send(data)
        return await read_reply(self.reader)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def connect(server: RunningServer) -> Connection:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", server.port), DEADLINE
    )
    return Connection(reader, writer)


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    running = await start_server(
        make_functions(), port=0, max_body_bytes=MAX_BODY, shutdown_timeout=5
    )
    async with running:
        yield running


@pytest.fixture
async def quick_server() -> AsyncIterator[RunningServer]:
    """A server that closes idle and stalled connections after ``KEEPALIVE`` seconds (a
    request head or body that is not complete then: 408)."""
    running = await start_server(
        make_functions(),
        port=0,
        max_body_bytes=MAX_BODY,
        shutdown_timeout=5,
        options=ServerOptions(
            keepalive_timeout=KEEPALIVE, head_timeout=KEEPALIVE, body_timeout=KEEPALIVE
        ),
    )
    async with running:
        yield running


# -- keep-alive and pipelining -------------------------------------------------------------


async def test_keep_alive_serves_requests_on_one_connection(server: RunningServer) -> None:
    async with await connect(server) as connection:
        first = await connection.ask(post(count_call(1, 41)))
        second = await connection.ask(post(count_call(5, None)))
        third = await connection.ask(post(wait_call(1)))
    for reply in (first, second, third):
        assert (reply.status, reply.reason) == (200, "OK")
        assert reply.headers["content-type"] == "application/octet-stream"
        assert int(reply.headers["content-length"]) == len(reply.body)
        assert "connection" not in reply.headers
    assert counted(first.body) == 42
    assert counted(second.body) == 5
    assert waited(third.body) == ("w", 1)


async def test_date_header(server: RunningServer) -> None:
    async with await connect(server) as connection:
        before = time.time()
        reply = await connection.ask(post(count_call(1, 1)))
    date = email.utils.parsedate_to_datetime(reply.headers["date"])
    assert reply.headers["date"].endswith(" GMT")
    assert before - 2 <= date.timestamp() <= time.time() + 1


async def test_pipelined_requests_are_answered_in_order(server: RunningServer) -> None:
    requests = [post(wait_call(80, "slow")), post(count_call(2, 1)), post(wait_call(1, "fast"))]
    requests.append(post(count_call(3, 3)))
    async with await connect(server) as connection:
        await connection.send(b"".join(requests))  # one write
        replies = [await read_reply(connection.reader) for _ in requests]
    assert [r.status for r in replies] == [200] * 4
    assert waited(replies[0].body) == ("slow", 80)
    assert counted(replies[1].body) == 3
    assert waited(replies[2].body) == ("fast", 1)
    assert counted(replies[3].body) == 6


async def test_request_split_into_tiny_writes(server: RunningServer) -> None:
    data = post(count_call(1, 9))
    async with await connect(server) as connection:
        for i in range(0, len(data), 7):
            await connection.send(data[i : i + 7])
            await asyncio.sleep(0.001)
        reply = await read_reply(connection.reader)
    assert reply.status == 200
    assert counted(reply.body) == 10


async def test_chunked_request_body(server: RunningServer) -> None:
    body = count_call(4, 6)
    head = (
        b"POST /statefun HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/octet-stream\r\n\r\n"
    )
    pieces = [body[:5], body[5:6], body[6:]]
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces)
    async with await connect(server) as connection:
        await connection.send(head + chunked[:9])
        await asyncio.sleep(0.01)
        await connection.send(chunked[9:] + b"0\r\nX-Trailer: yes\r\n\r\n")
        first = await read_reply(connection.reader)
        # and without trailers, in one write, on the same connection
        second = await connection.ask(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    assert (first.status, counted(first.body)) == (200, 10)
    assert (second.status, counted(second.body)) == (200, 10)


async def test_expect_100_continue(server: RunningServer) -> None:
    body = count_call(1, 99)
    head = post(body, headers="Expect: 100-continue\r\n")[: -len(body)]
    async with await connect(server) as connection:
        await connection.send(head)
        interim = await read_reply(connection.reader)
        assert (interim.status, interim.reason, interim.body) == (100, "Continue", b"")
        reply = await connection.ask(body)
    assert reply.status == 200
    assert counted(reply.body) == 100


async def test_expect_100_continue_refused(server: RunningServer) -> None:
    """A body refused before it was asked for: no 100 Continue, and the server cannot know
    whether the client sends the body anyway, so it closes the connection."""
    async with await connect(server) as connection:
        await connection.send(
            b"POST /statefun HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1)
        )
        reply = await read_reply(connection.reader)
        assert reply.status == 413
        assert reply.closes
        await assert_closed_by_server(connection.reader)


# -- closing connections -------------------------------------------------------------------


async def test_http_1_0_request_is_answered_and_closed(server: RunningServer) -> None:
    async with await connect(server) as connection:
        reply = await connection.ask(post(count_call(1, 1), version="1.0"))
        assert reply.status == 200
        assert counted(reply.body) == 2
        assert reply.closes
        await assert_closed_by_server(connection.reader)


async def test_http_1_0_keep_alive(server: RunningServer) -> None:
    headers = "Connection: keep-alive\r\n"
    async with await connect(server) as connection:
        for _ in range(2):
            reply = await connection.ask(post(count_call(1, 1), version="1.0", headers=headers))
            assert reply.status == 200 and not reply.closes


@pytest.mark.parametrize("call", ["sync", "async"])
async def test_connection_close_from_the_client(server: RunningServer, call: str) -> None:
    body = count_call(1, 1) if call == "sync" else wait_call(5)
    async with await connect(server) as connection:
        reply = await connection.ask(post(body, headers="Connection: close\r\n"))
        assert reply.status == 200
        assert reply.closes
        await assert_closed_by_server(connection.reader)


async def test_client_half_close_still_gets_the_async_reply(server: RunningServer) -> None:
    async with await connect(server) as connection:
        await connection.send(post(wait_call(50)))
        connection.writer.write_eof()
        reply = await read_reply(connection.reader)
        assert reply.status == 200
        assert waited(reply.body) == ("w", 50)
        await assert_closed_by_server(connection.reader)


# -- bad requests --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"HELLO THERE\r\n\r\n", "not an HTTP/1.x request line"),
        (b"POST /statefun HTTP/2.0\r\n\r\n", "not an HTTP/1.x request line"),
        (b"POST /statefun HTTP/1.1\r\nno colon\r\n\r\n", "not a header line"),
        (b"POST /statefun HTTP/1.1\r\n folded: header\r\n\r\n", "not a header line"),
        (b"POST /statefun HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (
            b"POST /statefun HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            "bad Content-Length",
        ),
        (
            b"POST /statefun HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "unsupported Transfer-Encoding",
        ),
        (
            b"POST /statefun HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "both Content-Length and Transfer-Encoding",
        ),
        (
            b"POST /statefun HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n",
            "bad chunk size",
        ),
        (
            b"POST /statefun HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
            "chunk not followed by CRLF",
        ),
    ],
    ids=[
        "garbled request line",
        "HTTP/2",
        "header without colon",
        "folded header",
        "negative length",
        "two lengths",
        "gzip",
        "length and chunked",
        "bad chunk size",
        "bad chunk end",
    ],
)
async def test_bad_request_is_refused_and_closed(
    server: RunningServer, data: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        async with await connect(server) as connection:
            reply = await connection.ask(data)
            assert reply.status == 400
            assert reply.closes
            assert reason in reply.body.decode()
            assert reply.headers["content-type"] == "text/plain"
            await assert_closed_by_server(connection.reader)
    assert any(reason in r.getMessage() for r in caplog.records)
    # the server carries on
    async with await connect(server) as connection:
        assert (await connection.ask(post(count_call(1, 1)))).status == 200


@pytest.mark.parametrize("terminated", [True, False], ids=["whole head", "head without end"])
async def test_head_over_64_kib(server: RunningServer, terminated: bool) -> None:
    head = b"POST /statefun HTTP/1.1\r\nX-Big: " + b"b" * (65 << 10)
    async with await connect(server) as connection:
        await connection.send(head + (b"\r\n\r\n" if terminated else b""))
        reply = await read_reply(connection.reader)
        assert reply.status == 431
        assert "request head longer than 65536 bytes" in reply.body.decode()
        assert reply.closes
        await assert_closed_by_server(connection.reader)


async def test_body_too_large_keeps_the_connection(server: RunningServer) -> None:
    async with await connect(server) as connection:
        await connection.send(post(b"\x00" * (MAX_BODY + 1))[:-1000])  # head, part of the body
        reply = await read_reply(connection.reader)
        assert reply.status == 413
        text = reply.body.decode()
        assert f"{MAX_BODY + 1} bytes exceeds the limit of {MAX_BODY} bytes" in text
        assert not reply.closes
        await asyncio.sleep(0.01)
        # the rest of the refused body, then a request, in one write
        ok = await connection.ask(b"\x00" * 1000 + post(count_call(1, 1)))
        assert (ok.status, counted(ok.body)) == (200, 2)


async def test_body_too_large_pipelined_with_the_next_request(server: RunningServer) -> None:
    async with await connect(server) as connection:
        await connection.send(post(b"\x00" * (MAX_BODY + 1)) + post(count_call(1, 2)))
        refused = await read_reply(connection.reader)
        ok = await read_reply(connection.reader)
    assert refused.status == 413
    assert (ok.status, counted(ok.body)) == (200, 3)


async def test_huge_body_is_refused_and_the_connection_closed(server: RunningServer) -> None:
    async with await connect(server) as connection:
        await connection.send(
            b"POST /statefun HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\n" + b"\x00" * 1000
        )
        reply = await read_reply(connection.reader)
        assert reply.status == 413
        assert reply.closes
        await assert_closed_by_server(connection.reader)


async def test_chunked_body_over_the_limit(server: RunningServer) -> None:
    chunk = b"%x\r\n%s\r\n" % (MAX_BODY // 2, b"\x00" * (MAX_BODY // 2))
    async with await connect(server) as connection:
        await connection.send(
            b"POST /statefun HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3
        )
        reply = await read_reply(connection.reader)
        assert reply.status == 413
        assert f"limit of {MAX_BODY} bytes" in reply.body.decode()
        assert reply.closes
        await assert_closed_by_server(connection.reader)


async def test_unknown_path_is_404_and_keeps_the_connection(server: RunningServer) -> None:
    async with await connect(server) as connection:
        missing = await connection.ask(post(count_call(1, 1), path="/elsewhere?x=1"))
        assert missing.status == 404
        assert "no such path '/elsewhere'" in missing.body.decode()
        assert not missing.closes
        ok = await connection.ask(post(count_call(1, 1)))
        assert ok.status == 200


async def test_query_string_is_ignored(server: RunningServer) -> None:
    async with await connect(server) as connection:
        reply = await connection.ask(post(count_call(1, 1), path="/statefun?trace=1"))
    assert reply.status == 200


async def test_wrong_content_type_is_415(server: RunningServer) -> None:
    async with await connect(server) as connection:
        reply = await connection.ask(post(count_call(1, 1), headers="Content-Type: text/plain\r\n"))
        assert reply.status == 415
        assert (await connection.ask(post(count_call(1, 1)))).status == 200


async def test_get_on_the_function_path_is_405(server: RunningServer) -> None:
    async with await connect(server) as connection:
        reply = await connection.ask(b"GET /statefun HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert reply.status == 405
    assert reply.headers["allow"] == "POST"


# -- the health check ----------------------------------------------------------------------


async def test_health(server: RunningServer) -> None:
    async with await connect(server) as connection:
        got = await connection.ask(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await connection.send(b"HEAD /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head = await read_reply(connection.reader, head_only=True)
        after = await connection.ask(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert got.status == 200
    assert got.headers["content-type"] == "application/json"
    assert json.loads(got.body) == {"status": "ok", "functions": ["test/count", "test/wait"]}
    assert head.status == 200
    assert head.headers["content-length"] == str(len(got.body))
    assert after.body == got.body  # the HEAD reply had no body to get in the way


async def test_post_to_health_is_405(server: RunningServer) -> None:
    async with await connect(server) as connection:
        reply = await connection.ask(post(b"{}", path="/health"))
        assert reply.status == 405
        assert reply.headers["allow"] == "GET"
        assert "use GET" in reply.body.decode()
        assert (await connection.ask(post(count_call(1, 1)))).status == 200


# -- timeouts and shutting down ------------------------------------------------------------


async def test_idle_connection_is_closed_after_the_keepalive_timeout(
    quick_server: RunningServer,
) -> None:
    async with await connect(quick_server) as connection:
        assert (await connection.ask(post(count_call(1, 1)))).status == 200
        start = time.monotonic()
        await assert_closed_by_server(connection.reader)
        assert KEEPALIVE - SLACK <= time.monotonic() - start < DEADLINE
    async with await connect(quick_server) as connection:  # never used at all
        start = time.monotonic()
        await assert_closed_by_server(connection.reader)
        assert time.monotonic() - start >= KEEPALIVE - SLACK


async def test_keepalive_timeout_counts_from_the_reply(quick_server: RunningServer) -> None:
    """A function that runs longer than the keep-alive timeout does not cost the connection."""
    async with await connect(quick_server) as connection:
        slow = await connection.ask(post(wait_call(int(KEEPALIVE * 1500))))
        assert slow.status == 200
        start = time.monotonic()
        await assert_closed_by_server(connection.reader)
        assert time.monotonic() - start >= KEEPALIVE - SLACK


async def test_request_stalled_half_way_is_closed(
    quick_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    body = count_call(1, 1)
    with caplog.at_level(logging.WARNING):
        async with await connect(quick_server) as connection:
            await connection.send(post(body)[: -len(body)])  # the head, no body
            start = time.monotonic()
            timed_out = await read_reply(connection.reader)
            assert (timed_out.status, timed_out.reason) == (408, "Request Timeout")
            assert timed_out.closes
            await assert_closed_by_server(connection.reader)
            assert time.monotonic() - start >= KEEPALIVE - SLACK
    assert any("request incomplete" in r.getMessage() for r in caplog.records)


async def test_a_trickled_request_head_does_not_extend_its_deadline(
    quick_server: RunningServer,
) -> None:
    """One byte of the head at a time, each well within the timeout: the head must still be
    complete ``head_timeout`` after it started (a byte used to reset the clock)."""
    request = post(count_call(1, 1))
    async with await connect(quick_server) as connection:
        start = time.monotonic()
        with contextlib.suppress(ConnectionError):
            for byte in request[:40]:
                await connection.send(bytes([byte]))
                await asyncio.sleep(KEEPALIVE / 10)
        timed_out = await read_reply(connection.reader)
        assert (timed_out.status, timed_out.reason) == (408, "Request Timeout")
        assert b"request head not complete" in timed_out.body
        assert KEEPALIVE - SLACK <= time.monotonic() - start < DEADLINE
        await assert_closed_by_server(connection.reader)


async def test_a_body_slower_than_the_minimum_rate_is_cut_off() -> None:
    options = ServerOptions(body_timeout=0.3, min_body_rate=100)
    running = await start_server(make_functions(), port=0, shutdown_timeout=5, options=options)
    async with running, await connect(running) as connection:
        body = count_call(1, 1) + b"\0" * 1000  # the length is what counts here
        await connection.send(post(body)[: -len(body)])
        start = time.monotonic()
        with contextlib.suppress(ConnectionError):
            for offset in range(0, 60, 10):  # 10 bytes each 0.1 s: 100 B/s would be needed
                await connection.send(body[offset : offset + 5])
                await asyncio.sleep(0.1)
        timed_out = await read_reply(connection.reader)
        assert timed_out.status == 408 and b"request incomplete" in timed_out.body
        assert time.monotonic() - start < DEADLINE
    # a body at the rate passes: the grace period plus one second per 100 bytes
    running = await start_server(make_functions(), port=0, shutdown_timeout=5, options=options)
    async with running, await connect(running) as connection:
        body = count_call(1, 1)
        request = post(body)
        await connection.send(request[: -len(body)])
        for offset in range(0, len(body), 20):
            await connection.send(body[offset : offset + 20])
            await asyncio.sleep(0.1)  # 200 B/s
        assert (await read_reply(connection.reader)).status == 200


async def test_close_closes_idle_connections_at_once() -> None:
    running = await start_server(make_functions(), port=0, shutdown_timeout=DEADLINE)
    async with await connect(running) as used, await connect(running) as unused:
        assert (await used.ask(post(count_call(1, 1)))).status == 200
        await asyncio.sleep(0.01)  # the server has accepted the unused one
        start = time.monotonic()
        await asyncio.wait_for(running.close(), DEADLINE)
        assert time.monotonic() - start < 2.0  # not the shutdown timeout
        await assert_closed_by_server(used.reader)
        await assert_closed_by_server(unused.reader)
    assert not port_accepts(running.port)


async def test_reply_during_shutdown_closes_the_connection() -> None:
    running = await start_server(make_functions(), port=0, shutdown_timeout=DEADLINE)
    async with await connect(running) as connection:
        await connection.send(post(wait_call(150)))
        await asyncio.sleep(0.05)  # the function is running
        closing = asyncio.ensure_future(running.close())
        reply = await read_reply(connection.reader)
        assert reply.status == 200
        assert reply.closes
        await assert_closed_by_server(connection.reader)
        await asyncio.wait_for(closing, DEADLINE)


# -- bounds --------------------------------------------------------------------------------


async def test_connections_past_the_limit_get_503_and_are_closed() -> None:
    from statefun._http.server import HttpServer, Reply

    class Fixed:
        max_body_bytes = 1024

        def check(self, request: object) -> None:
            return None

        def handle(self, request: object, body: bytes) -> Reply:
            return Reply(200, "text/plain", b"ok")

        def too_large(self, length: int | None) -> Reply:
            return Reply(413, "text/plain", b"no")

    server = HttpServer(Fixed(), max_connections=2)
    port = await server.start("127.0.0.1", 0)
    streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    try:
        for index, (reader, writer) in enumerate(streams):
            writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            data = await asyncio.wait_for(reader.read(1000), DEADLINE)
            if index < 2:
                assert data.startswith(b"HTTP/1.1 200 OK")
            else:  # refused at once: the first two wait for a head for less than a moment
                assert data.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), data
                assert b"\r\nRetry-After: 1\r\n" in data
                assert b"\r\nConnection: close\r\n" in data
                assert await asyncio.wait_for(reader.read(), DEADLINE) == b""
        assert server.refused == 1
    finally:
        for _, writer in streams:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await server.close(1.0)


class _Fixed:
    max_body_bytes = 1024

    def check(self, request: object) -> None:
        return None

    def handle(self, request: object, body: bytes) -> Reply:
        from statefun._http.server import Reply as ServerReply

        return ServerReply(200, "text/plain", b"ok")  # type: ignore[return-value]

    def too_large(self, length: int | None) -> Reply:
        raise AssertionError("no body is that large here")


async def open_from(port: int, source: str) -> Connection:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), DEADLINE
    )
    return Connection(reader, writer)


GET = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"


async def test_at_the_per_client_cap_the_longest_waiting_connection_makes_room() -> None:
    from statefun._http.server import HttpServer

    server = HttpServer(
        _Fixed(), options=ServerOptions(max_connections_per_client=2, head_timeout=2.0)
    )
    port = await server.start("127.0.0.1", 0)
    try:
        first = await open_from(port, "127.0.0.1")
        assert (await first.ask(GET)).status == 200
        second = await open_from(port, "127.0.0.1")
        too_soon = await open_from(port, "127.0.0.1")  # the others waited less than 1 s
        refused = await read_reply(too_soon.reader)
        assert (refused.status, refused.headers["retry-after"]) == (503, "1") and refused.closes
        await asyncio.sleep(1.1)
        third = await open_from(port, "127.0.0.1")
        assert (await third.ask(GET)).status == 200
        # the one that waited longest got the 503; the other one still works
        evicted = await read_reply(first.reader)
        assert evicted.status == 503 and evicted.closes
        assert (await second.ask(GET)).status == 200
        assert server.evicted == 1 and server.refused == 1
        for connection in (first, second, too_soon, third):
            await connection.__aexit__()
    finally:
        await server.close(1.0)


async def test_at_the_cap_in_all_the_busiest_client_makes_room() -> None:
    from statefun._http.server import HttpServer

    server = HttpServer(_Fixed(), options=ServerOptions(max_connections=4))
    port = await server.start("127.0.0.1", 0)
    try:
        crowd = [await open_from(port, "127.0.0.1") for _ in range(4)]
        await asyncio.sleep(0.05)
        # another address gets in at once: the busiest client's longest-waiting one goes
        other = await open_from(port, "127.0.0.2")
        assert (await other.ask(GET)).status == 200
        assert (await read_reply(crowd[0].reader)).status == 503
        # the busiest client itself, with nothing that waited long: refused
        again = await open_from(port, "127.0.0.1")
        assert (await read_reply(again.reader)).status == 503
        assert (await crowd[1].ask(GET)).status == 200
        for connection in (*crowd, other, again):
            await connection.__aexit__()
    finally:
        await server.close(1.0)


async def test_a_client_that_does_not_read_stops_being_read(server: RunningServer) -> None:
    # A small receive buffer, set before connecting, so the kernel holds few replies.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", server.port))
    try:
        requests = post(count_call(1, 1)) * 200_000  # pipelined; no reply is ever read
        sending = loop.create_task(loop.sock_sendall(sock, requests))
        deadline = loop.time() + DEADLINE
        while not any(peer.write_paused for peer in server.server.connections):
            assert loop.time() < deadline, "the server never stopped reading"
            await asyncio.sleep(0.01)
        (peer,) = server.server.connections
        assert peer.transport is not None
        # What waits for the client is bounded: asyncio's buffer stops near its high-water mark.
        assert peer.transport.get_write_buffer_size() < 1 << 20
        assert not sending.done()  # the rest of the requests wait in the client's buffers
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
    finally:
        sock.close()


class _Raising(_Fixed):
    """An application with a bug: the sync path raises, the async one fails when awaited."""

    def handle(self, request: object, body: bytes) -> Any:
        if getattr(request, "path", "") == "/sync":
            raise RuntimeError("boom in handle")

        async def later() -> Reply:
            raise RuntimeError("boom in a coroutine")

        return later()


async def test_an_application_that_raises_answers_500_and_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from statefun._http.server import HttpServer

    server = HttpServer(_Raising(), name="test")
    port = await server.start("127.0.0.1", 0)
    try:
        for path in ("/sync", "/async", "/sync"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 10)
            assert reply.status == 500, path
            writer.close()
            await writer.wait_closed()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("boom in handle" in w for w in warnings), warnings
        assert len(warnings) <= 2  # rate limited: one line per kind and interval
    finally:
        await server.close(1.0)
