"""The runtime's HTTP client (``_http.HttpPool`` behind ``RemoteClient``) against real sockets.

Every server here listens on 127.0.0.1 (or a Unix socket): raw ``asyncio`` servers that write
hand-crafted bytes, to reach the corners of HTTP/1.1 framing, and aiohttp for the Unix socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import statefun
from statefun._exceptions import HttpProtocolError, RetryableFunctionError, TerminalFunctionError
from statefun._http.client import HttpPool, Response, parse_target
from statefun.module._specs import TransportSpec
from statefun.runtime._remote import RemoteClient

pytestmark = pytest.mark.timeout(60)

DEADLINE = 10.0  # seconds any one wait may take before the test fails
SLACK = 0.05  # tolerance of "took at least the timeout": clocks and timers are not exact

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "RawServer"], Awaitable[None]]


def transport(call: float = 5.0, connect: float = 5.0, read: float = 5.0) -> TransportSpec:
    return TransportSpec(
        call=timedelta(seconds=call),
        connect=timedelta(seconds=connect),
        read=timedelta(seconds=read),
    )


# -- servers -------------------------------------------------------------------------------


class RawServer:
    """``asyncio.start_server`` on 127.0.0.1 running ``handler`` per connection.

    Counts connections (accepted in all, open now, most open at once) and requests (read by
    ``read_request``); ``close`` cancels the handlers still running.
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.open = 0
        self.max_open = 0
        self.requests: list[bytes] = []  # request bodies, in order of arrival
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/statefun"

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._on_connect, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            self.open -= 1
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()
            self._tasks.discard(task)

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """The body of the next request on the connection; None when the client closed it."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            assert not exc.partial, exc.partial
            return None
        assert head.startswith(b"POST "), head
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length)
        self.heads.append(head)
        self.requests.append(body)
        return body


def reply(
    body: bytes, status: int = 200, reason: str = "OK", extra: bytes = b"", version: bytes = b"1.1"
) -> bytes:
    return (
        b"HTTP/%s %d %s\r\nContent-Length: %d\r\n%s\r\n"
        % (version, status, reason.encode(), len(body), extra)
        + body
    )


def echo_handler(prefix: bytes = b"echo:") -> Handler:
    """Answers every request on a connection with ``prefix`` + its body (keep-alive)."""

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        while (body := await server.read_request(reader)) is not None:
            writer.write(reply(prefix + body))
            await writer.drain()

    return handle


def one_reply(*parts: bytes, pause: float = 0.0, close: bool = False) -> Handler:
    """Answers each request with ``parts``, written one by one (``pause`` s apart)."""

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        while await server.read_request(reader) is not None:
            for part in parts:
                writer.write(part)
                await writer.drain()
                if pause:
                    await asyncio.sleep(pause)
            if close:
                return

    return handle


@pytest.fixture
async def client() -> AsyncIterator[RemoteClient]:
    remote = RemoteClient(initial_backoff_ms=10, max_backoff_ms=50, max_response_bytes=1000)
    await remote.start()
    try:
        yield remote
    finally:
        await remote.close()


@pytest.fixture
async def pool() -> AsyncIterator[HttpPool]:
    http = HttpPool(max_connections=8, max_response_bytes=4 << 20)
    try:
        yield http
    finally:
        await http.close()


async def call(client: RemoteClient, url: str, body: bytes = b"hi", **timeouts: float) -> bytes:
    return await asyncio.wait_for(
        client.call(url, body, transport(**timeouts), "test/fn"), DEADLINE
    )


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


@contextlib.contextmanager
def elapsed() -> Iterator[list[float]]:
    """Yields a list that holds the seconds the block took once it ends."""
    took: list[float] = []
    start = time.monotonic()
    try:
        yield took
    finally:
        took.append(time.monotonic() - start)


# -- parse_target --------------------------------------------------------------------------


def test_parse_target_http_and_https() -> None:
    target = parse_target("http://example.com/statefun?x=1&y=2")
    assert target.origin == ("http", "example.com", 80)
    assert not target.tls
    assert target.head == (
        b"POST /statefun?x=1&y=2 HTTP/1.1\r\nHost: example.com\r\n"
        b"Content-Type: application/octet-stream\r\nUser-Agent: pystatefun\r\n"
        b"Content-Length: "
    )
    secure = parse_target("https://user:secret@Functions.Example:8443")
    assert secure.origin == ("https", "functions.example", 8443)
    assert secure.tls
    assert secure.head.startswith(b"POST / HTTP/1.1\r\nHost: Functions.Example:8443\r\n")
    assert b"secret" not in secure.head
    assert parse_target("HTTPS://example.com/a").origin == ("https", "example.com", 443)
    assert parse_target("http://[::1]:9000/f").origin == ("http", "::1", 9000)
    assert parse_target("http://[::1]:9000/f").head.startswith(
        b"POST /f HTTP/1.1\r\nHost: [::1]:9000\r\n"
    )


def test_parse_target_with_headers() -> None:
    headers = (("Authorization", "Bearer s3cr3t"), ("X-Tenant", "7"))
    target = parse_target("http://example.com/f", headers=headers)
    assert target.head == (
        b"POST /f HTTP/1.1\r\nHost: example.com\r\n"
        b"Content-Type: application/octet-stream\r\nUser-Agent: pystatefun\r\n"
        b"Authorization: Bearer s3cr3t\r\nX-Tenant: 7\r\nContent-Length: "
    )
    assert "s3cr3t" not in repr(target)
    with pytest.raises(ValueError, match="line break"):
        parse_target("http://example.com/f", headers=(("X-A", "a\r\nX-B: b"),))


def test_parse_target_unix_socket() -> None:
    target = parse_target("http+unix:///run/fns/functions.sock/statefun/{x}?a=b")
    assert target.origin == ("http+unix", "", "/run/fns/functions.sock")
    assert not target.tls
    assert target.head.startswith(b"POST /statefun/{x}?a=b HTTP/1.1\r\nHost: localhost\r\n")
    bare = parse_target("https+unix:///tmp/f.sock")
    assert bare.origin == ("https+unix", "", "/tmp/f.sock")
    assert bare.tls
    assert bare.head.startswith(b"POST / HTTP/1.1\r\n")


def test_parse_target_unix_socket_is_the_first_segment_ending_with_sock() -> None:
    # A directory whose name merely contains ".sock" is not the socket file.
    target = parse_target("http+unix:///tmp/my.socks/fn.sock/statefun")
    assert target.origin == ("http+unix", "", "/tmp/my.socks/fn.sock")
    assert target.head.startswith(b"POST /statefun HTTP/1.1\r\n")
    with pytest.raises(ValueError, match=r"\.sock"):
        parse_target("http+unix:///tmp/fn.socket/statefun")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://example.com/statefun", "scheme 'ftp'"),
        ("example.com/statefun", "scheme ''"),
        ("http:///statefun", "no host"),
        ("http+unix:///tmp/functions/statefun", ".sock"),
        ("http://example.com:99999/statefun", "out of range"),
    ],
)
def test_parse_target_refuses(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace(".", r"\.")):
        parse_target(url)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1/statefun",
        "http+unix:///tmp/functions/statefun",
        "http:///statefun",
    ],
)
async def test_url_that_cannot_be_called_is_terminal(client: RemoteClient, url: str) -> None:
    with elapsed() as took, pytest.raises(TerminalFunctionError, match="function test/fn"):
        await call(client, url)
    assert took[0] < 1.0


# -- framing -------------------------------------------------------------------------------


async def test_keep_alive_reuses_one_connection(client: RemoteClient) -> None:
    async with RawServer(echo_handler()) as server:
        for i in range(20):
            assert await call(client, server.url, b"%d" % i) == b"echo:%d" % i
    assert server.accepted == 1
    assert server.requests == [b"%d" % i for i in range(20)]
    (head, *_) = server.heads
    assert head.startswith(b"POST /statefun HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in head
    assert b"Content-Type: application/octet-stream\r\n" in head


@pytest.mark.parametrize(
    "trailers", [b"", b"X-Checksum: 1234\r\nX-More: yes\r\n"], ids=["no trailers", "trailers"]
)
async def test_chunked_response_in_pieces(client: RemoteClient, trailers: bytes) -> None:
    parts = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n",
        b"Content-Type: application/octet-stream\r\n\r\n",
        b"5\r\nhel",
        b"lo\r\n",
        b"1;name=value\r\n",
        b",\r\n6\r\n world\r",
        b"\n0",
        b"\r\n" + trailers[:5],
        trailers[5:] + b"\r",
        b"\n",
    ]
    async with RawServer(one_reply(*parts, pause=0.005)) as server:
        assert await call(client, server.url) == b"hello, world"
        assert await call(client, server.url) == b"hello, world"
    assert server.accepted == 1  # a chunked response leaves the connection reusable


async def test_chunked_response_in_one_write(client: RemoteClient) -> None:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (b"a" * 300, b"b" * 17, b"c"))
    response = b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n" + body + b"0\r\n\r\n"
    async with RawServer(one_reply(response)) as server:
        assert await call(client, server.url) == b"a" * 300 + b"b" * 17 + b"c"


async def test_response_delimited_by_closing_the_connection(client: RemoteClient) -> None:
    parts = [b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n", b"part 1, "]
    parts += [b"part 2, ", b"the end"]
    async with RawServer(one_reply(*parts, pause=0.01, close=True)) as server:
        assert await call(client, server.url) == b"part 1, part 2, the end"
        assert await call(client, server.url) == b"part 1, part 2, the end"
    assert server.accepted == 2  # such a connection is never reused


async def test_http_1_0_response_with_length_is_not_reused(client: RemoteClient) -> None:
    async with RawServer(one_reply(reply(b"ten bytes!", version=b"1.0"))) as server:
        assert await call(client, server.url) == b"ten bytes!"
        assert await call(client, server.url) == b"ten bytes!"
    assert server.accepted == 2


async def test_connection_close_header_is_honoured(client: RemoteClient) -> None:
    response = reply(b"bye", extra=b"Connection: close\r\n")
    async with RawServer(one_reply(response)) as server:
        assert await call(client, server.url) == b"bye"
        assert await call(client, server.url) == b"bye"
    assert server.accepted == 2


async def test_response_in_many_tiny_writes(client: RemoteClient) -> None:
    response = reply(
        b"0123456789" * 5, extra=b"Content-Type: application/octet-stream\r\nX-Pad: " + b"p" * 40
    )
    response = response.replace(b"p" * 40, b"p" * 40 + b"\r\n", 1)

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        while await server.read_request(reader) is not None:
            for i in range(len(response)):
                writer.write(response[i : i + 1])
                await writer.drain()
                if i % 8 == 0:
                    await asyncio.sleep(0.001)

    async with RawServer(handle) as server:
        assert await call(client, server.url) == b"0123456789" * 5
        assert await call(client, server.url) == b"0123456789" * 5
    assert server.accepted == 1


@pytest.mark.parametrize(
    "parts",
    [
        (b"HTTP/1.1 100 Continue\r\n\r\n", reply(b"final")),
        (
            b"HTTP/1.1 100 Cont",
            b"inue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfi",
            b"nal",
        ),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
            + reply(b"final"),
        ),
    ],
    ids=["separate writes", "split", "two in one write"],
)
async def test_interim_responses_are_skipped(client: RemoteClient, parts: tuple[bytes]) -> None:
    async with RawServer(one_reply(*parts, pause=0.01)) as server:
        assert await call(client, server.url) == b"final"
        assert await call(client, server.url) == b"final"
    assert server.accepted == 1


async def test_large_bodies_both_ways(pool: HttpPool) -> None:
    async with RawServer(echo_handler(b"")) as server:
        target = parse_target(server.url)
        for size in (0, 1, 65535, 65536, 300_000):
            body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
            response = await pool.post(target, body, DEADLINE, DEADLINE, DEADLINE)
            assert (response.status, response.reason) == (200, "OK")
            assert response.body == body
    assert server.accepted == 1


async def test_no_content_statuses_have_no_body(pool: HttpPool) -> None:
    async with RawServer(one_reply(b"HTTP/1.1 204 No Content\r\n\r\n")) as server:
        target = parse_target(server.url)
        for _ in range(2):
            response = await pool.post(target, b"x", DEADLINE, DEADLINE, DEADLINE)
            assert response == Response(204, "No Content", b"")
    assert server.accepted == 1


# -- connections that go away --------------------------------------------------------------


async def test_stale_keep_alive_connection_is_not_used(pool: HttpPool) -> None:
    """The server answers with keep-alive, then closes the idle connection: the pool
    notices and opens a new one for the next request (the pool itself never retries)."""
    async with RawServer(one_reply(reply(b"ok"), close=True)) as server:
        target = parse_target(server.url)
        for _ in range(3):
            response = await pool.post(target, b"x", DEADLINE, DEADLINE, DEADLINE)
            assert response.body == b"ok"
            await until(lambda: pool.open_connections == 0, "the close to reach the pool")
    assert server.accepted == 3


async def test_connection_closed_while_reused_is_retried(client: RemoteClient) -> None:
    """The server closes right after answering; the next call may race with the close."""
    async with RawServer(one_reply(reply(b"ok"), close=True)) as server:
        for _ in range(5):
            assert await call(client, server.url) == b"ok"
    assert server.accepted >= 5


async def test_connection_closed_before_a_full_response(client: RemoteClient) -> None:
    truncated = one_reply(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part", close=True)
    async with RawServer(truncated) as server:
        with pytest.raises(RetryableFunctionError) as caught:
            await call(client, server.url, call=0.4)
    assert "ConnectionResetError" in str(caught.value)
    assert "after a partial response" in str(caught.value)
    assert len(server.requests) >= 2  # retried


async def test_bytes_on_an_idle_connection_drop_it(pool: HttpPool) -> None:
    unasked = one_reply(reply(b"ok"), b"unasked-for bytes", pause=0.005)
    async with RawServer(unasked) as server:
        target = parse_target(server.url)
        for _ in range(3):
            response = await pool.post(target, b"x", DEADLINE, DEADLINE, DEADLINE)
            assert response.body == b"ok"
            await until(lambda: pool.open_connections == 0, "the pool to drop the connection")
    assert server.accepted == 3


# -- failures ------------------------------------------------------------------------------


async def test_garbage_instead_of_http_is_retried_until_the_call_timeout(
    client: RemoteClient,
) -> None:
    garbage = one_reply(b"SSH-2.0-OpenSSH_9.6\r\nhello there\r\n\r\n")
    async with RawServer(garbage) as server:
        with elapsed() as took, pytest.raises(RetryableFunctionError) as caught:
            await call(client, server.url, call=0.4)
    assert took[0] >= 0.4 - SLACK
    message = str(caught.value)
    assert "did not answer within its call timeout" in message
    assert "HttpProtocolError" in message and "not an HTTP/1.x status line" in message
    assert len(server.requests) >= 2


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 OK 200\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc",
    ],
    ids=["bad length", "bad header", "bad status", "bad chunk size", "bad chunk end", "extra"],
)
async def test_malformed_responses_are_protocol_errors(pool: HttpPool, response: bytes) -> None:
    async with RawServer(one_reply(response)) as server:
        with pytest.raises(HttpProtocolError) as raised:
            await pool.post(parse_target(server.url), b"x", DEADLINE, DEADLINE, DEADLINE)
    assert pool.open_connections == 0
    # in the tree of statefun's errors, a protocol error as a malformed FromFunction is
    assert isinstance(raised.value, statefun.ProtocolError)


async def test_endless_head_is_a_protocol_error(pool: HttpPool) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * (70 << 10)
    async with RawServer(one_reply(head)) as server:
        with pytest.raises(HttpProtocolError, match="response head longer than"):
            await pool.post(parse_target(server.url), b"x", DEADLINE, DEADLINE, DEADLINE)


async def test_content_length_over_the_limit_is_terminal_at_once(client: RemoteClient) -> None:
    async with RawServer(one_reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1001\r\n\r\n")) as server:
        with elapsed() as took, pytest.raises(TerminalFunctionError) as caught:
            await call(client, server.url, call=DEADLINE)
    assert took[0] < 2.0
    assert "1001 bytes, more than the limit of 1000" in str(caught.value)
    assert len(server.requests) == 1


async def test_content_length_at_the_limit_is_fine(client: RemoteClient) -> None:
    async with RawServer(one_reply(reply(b"z" * 1000))) as server:
        assert await call(client, server.url) == b"z" * 1000


@pytest.mark.parametrize("chunk", [400, 1001], ids=["small chunks", "one big chunk"])
async def test_chunked_body_over_the_limit_is_terminal(client: RemoteClient, chunk: int) -> None:
    data = b"%x\r\n%s\r\n" % (chunk, b"y" * chunk)
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + data * 3
    # The server stalls after that: the client must not wait for the end of the body.
    async with RawServer(one_reply(response, b"", pause=DEADLINE)) as server:
        with elapsed() as took, pytest.raises(TerminalFunctionError) as caught:
            await call(client, server.url, call=DEADLINE)
    assert took[0] < 2.0
    assert "more than 1000 bytes" in str(caught.value)
    assert len(server.requests) == 1


async def test_huge_chunk_announced_is_refused_before_it_arrives(client: RemoteClient) -> None:
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\nstart"
    async with RawServer(one_reply(response, b"", pause=DEADLINE)) as server:
        with elapsed() as took, pytest.raises(TerminalFunctionError, match="more than 1000"):
            await call(client, server.url, call=DEADLINE)
    assert took[0] < 2.0


async def test_body_until_close_over_the_limit_is_terminal(client: RemoteClient) -> None:
    response = b"HTTP/1.0 200 OK\r\n\r\n" + b"w" * 1001
    async with RawServer(one_reply(response, b"", pause=DEADLINE)) as server:
        with pytest.raises(TerminalFunctionError, match="more than 1000 bytes"):
            await call(client, server.url, call=DEADLINE)


async def test_server_that_never_answers(client: RemoteClient) -> None:
    async def silent(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.read_request(reader)
        await asyncio.sleep(DEADLINE * 2)

    async with RawServer(silent) as server:
        with elapsed() as took, pytest.raises(RetryableFunctionError) as caught:
            await call(client, server.url, call=0.4)
    assert 0.4 - SLACK <= took[0] < 3.0
    assert "TimeoutError" in str(caught.value)
    assert "0:00:00.400000" in str(caught.value)


async def test_read_timeout_after_the_head(pool: HttpPool) -> None:
    stall = one_reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", b"", pause=DEADLINE)
    async with RawServer(stall) as server:
        with elapsed() as took, pytest.raises(TimeoutError, match=r"no response bytes for 0\.2 s"):
            await pool.post(parse_target(server.url), b"x", DEADLINE, 0.2, DEADLINE)
    assert 0.2 - SLACK <= took[0] < 2.0
    assert pool.open_connections == 0


async def test_read_timeout_bounds_each_attempt(client: RemoteClient) -> None:
    stall = one_reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b"", pause=DEADLINE)
    async with RawServer(stall) as server:
        with elapsed() as took, pytest.raises(RetryableFunctionError) as caught:
            await call(client, server.url, call=0.5, read=0.1)
    assert 0.5 - SLACK <= took[0] < 4.0
    assert "no response bytes for 0.1 s" in str(caught.value)
    assert len(server.requests) >= 2


async def test_slow_but_steady_response_is_not_a_read_timeout(pool: HttpPool) -> None:
    parts = [b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", *(bytes([c]) for c in b"slow")]
    async with RawServer(one_reply(*parts, pause=0.08)) as server:
        # 0.4 s in all, more than the read timeout, but never 0.3 s without a byte
        response = await pool.post(parse_target(server.url), b"x", DEADLINE, 0.3, DEADLINE)
    assert response.body == b"slow"


async def test_call_timeout_bounds_a_slow_but_steady_response(pool: HttpPool) -> None:
    parts = [b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n", *(b"s" for _ in range(20))]
    async with RawServer(one_reply(*parts, pause=0.05)) as server:
        with elapsed() as took, pytest.raises(TimeoutError, match="call timeout"):
            await pool.post(parse_target(server.url), b"x", DEADLINE, 0.3, 0.3)
    assert 0.3 - SLACK <= took[0] < 2.0


async def test_connection_refused_is_retried_until_the_call_timeout(client: RemoteClient) -> None:
    async with RawServer(echo_handler()) as server:
        url = server.url
    with elapsed() as took, pytest.raises(RetryableFunctionError) as caught:
        await call(client, url, call=0.3)
    assert took[0] >= 0.3 - SLACK
    assert "ConnectionRefusedError" in str(caught.value)


# -- statuses ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 404, 413, 415])
async def test_client_error_is_terminal_at_once(client: RemoteClient, status: int) -> None:
    response = reply(b"no such function\n", status=status, reason="Nope")
    async with RawServer(one_reply(response)) as server:
        with elapsed() as took, pytest.raises(TerminalFunctionError) as caught:
            await call(client, server.url, call=DEADLINE)
    assert took[0] < 2.0
    assert f"HTTP {status} from {server.url}: no such function" in str(caught.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [503, 500, 429, 408])
async def test_retryable_status_then_success(client: RemoteClient, status: int) -> None:
    async def flaky(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        while await server.read_request(reader) is not None:
            if len(server.requests) == 1:
                writer.write(reply(b"", status=status, reason="Try Later"))
            else:
                writer.write(reply(b"fine"))
            await writer.drain()

    async with RawServer(flaky) as server:
        assert await call(client, server.url, call=DEADLINE) == b"fine"
    assert len(server.requests) == 2
    assert server.accepted == 1  # an error status does not cost the connection


async def test_retryable_status_until_the_call_timeout(client: RemoteClient) -> None:
    async with RawServer(one_reply(reply(b"", status=503, reason="Busy"))) as server:
        with pytest.raises(RetryableFunctionError) as caught:
            await call(client, server.url, call=0.3)
    assert f"HTTP 503 from {server.url}: Busy" in str(caught.value)
    assert len(server.requests) >= 2


# -- Unix domain sockets -------------------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Unix socket paths are limited to about 100 bytes: pytest's tmp_path may be too long.
    where = Path(tempfile.mkdtemp(prefix="sfh", dir="/tmp"))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


async def test_unix_socket(client: RemoteClient, socket_dir: Path) -> None:
    seen: list[tuple[str, str, str]] = []

    async def statefun(request: web.Request) -> web.Response:
        seen.append((request.path_qs, request.host, request.content_type))
        return web.Response(body=b"unix:" + await request.read())

    app = web.Application()
    app.router.add_post("/statefun", statefun)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    (socket_dir / "d.socks").mkdir()
    path = socket_dir / "d.socks" / "fns.sock"
    await web.UnixSite(runner, str(path)).start()
    try:
        url = f"http+unix://{path}/statefun?v=1"
        assert await call(client, url, b"one") == b"unix:one"
        assert await call(client, url, b"two") == b"unix:two"
        with pytest.raises(TerminalFunctionError, match="HTTP 404"):
            await call(client, f"http+unix://{path}/elsewhere")
    finally:
        await runner.cleanup()
    assert seen == [("/statefun?v=1", "localhost", "application/octet-stream")] * 2


async def test_unix_socket_missing_is_retryable(client: RemoteClient, socket_dir: Path) -> None:
    with pytest.raises(RetryableFunctionError, match="FileNotFoundError"):
        await call(client, f"http+unix://{socket_dir}/none.sock/statefun", call=0.2)


# -- the pool ------------------------------------------------------------------------------


async def test_pool_limit_bounds_open_connections() -> None:
    async def slow(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        while (body := await server.read_request(reader)) is not None:
            await asyncio.sleep(0.03)
            writer.write(reply(b"slow:" + body))
            await writer.drain()

    pool = HttpPool(max_connections=2)
    most = 0

    async def post(i: int) -> Response:
        nonlocal most
        most = max(most, pool.open_connections)
        response = await pool.post(target, b"%d" % i, DEADLINE, DEADLINE, DEADLINE)
        most = max(most, pool.open_connections)
        return response

    try:
        async with RawServer(slow) as server:
            target = parse_target(server.url)
            responses = await asyncio.wait_for(asyncio.gather(*map(post, range(10))), DEADLINE)
    finally:
        await pool.close()
    assert [r.body for r in responses] == [b"slow:%d" % i for i in range(10)]
    assert server.max_open <= 2
    assert server.accepted == 2
    assert most <= 2
    assert pool.open_connections == 0


async def test_pool_limit_makes_room_by_closing_idle_connections_elsewhere() -> None:
    pool = HttpPool(max_connections=1)
    try:
        async with RawServer(echo_handler(b"a:")) as first, RawServer(echo_handler(b"b:")) as other:
            a, b = parse_target(first.url), parse_target(other.url)
            for _ in range(3):
                assert (await pool.post(a, b"x", DEADLINE, DEADLINE, DEADLINE)).body == b"a:x"
                assert (await pool.post(b, b"x", DEADLINE, DEADLINE, DEADLINE)).body == b"b:x"
                assert pool.open_connections <= 1
    finally:
        await pool.close()
    assert (first.accepted, other.accepted) == (3, 3)


async def test_waiting_for_a_free_connection_counts_against_the_call_timeout() -> None:
    async def silent(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.read_request(reader)
        await asyncio.sleep(DEADLINE * 2)

    pool = HttpPool(max_connections=1)
    try:
        async with RawServer(silent) as server:
            target = parse_target(server.url)
            hog = asyncio.ensure_future(pool.post(target, b"x", DEADLINE, DEADLINE, DEADLINE))
            await asyncio.sleep(0.05)
            assert pool.open_connections == 1
            with elapsed() as took, pytest.raises(TimeoutError):
                await pool.post(target, b"y", DEADLINE, DEADLINE, 0.3)
            assert 0.3 - SLACK <= took[0] < 2.0
            assert not hog.done()
            hog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hog
    finally:
        await pool.close()
    assert pool.open_connections == 0


async def test_cancelled_call_frees_its_connection(pool: HttpPool) -> None:
    async with RawServer(one_reply(b"", pause=DEADLINE)) as server:
        target = parse_target(server.url)
        pending = asyncio.ensure_future(pool.post(target, b"x", DEADLINE, DEADLINE, DEADLINE))
        await asyncio.sleep(0.05)
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        await asyncio.sleep(0.01)
        assert pool.open_connections == 0


# -- TLS: https endpoints, private CAs, mutual TLS (certificates made by openssl) ------------


def make_cert(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (and localhost) and its key."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt"),
            *("ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", f"/CN={name}"),
            *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


@contextlib.asynccontextmanager
async def https_server(cert: Path, key: Path, client_ca: Path | None = None) -> AsyncIterator[str]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=b"secret " + await request.read())

    app = web.Application()
    app.router.add_post("/statefun", answer)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}/statefun"
    finally:
        await runner.cleanup()


def tls(**fields: Any) -> TransportSpec:
    return replace(transport(call=0.5, connect=0.5, read=0.5), **fields)


async def test_https_with_a_private_ca(client: RemoteClient, tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path, "server")
    async with https_server(cert, key) as url:
        spec = tls(trust_cacerts=str(cert))
        assert await client.call(url, b"hi", spec, "test/fn") == b"secret hi"
        # Without the CA the server is not trusted: retried, then a retryable failure.
        with pytest.raises(RetryableFunctionError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.call(url, b"hi", tls(), "test/fn")


async def test_mutual_tls(client: RemoteClient, tmp_path: Path) -> None:
    server_cert, server_key = make_cert(tmp_path, "server")
    client_cert, client_key = make_cert(tmp_path, "client")
    async with https_server(server_cert, server_key, client_ca=client_cert) as url:
        spec = tls(
            trust_cacerts=str(server_cert), client_cert=str(client_cert), client_key=str(client_key)
        )
        assert await client.call(url, b"me", spec, "test/fn") == b"secret me"
        with pytest.raises(RetryableFunctionError):  # no client certificate: refused
            await client.call(url, b"me", tls(trust_cacerts=str(server_cert)), "test/fn")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"trust_cacerts": "classpath:ca.pem"}, "classpath: names only mean something"),
        ({"client_cert": "/tmp/c.pem"}, "client_cert and transport.client_key go together"),
        ({"trust_cacerts": "/nonexistent/ca.pem"}, "transport.trust_cacerts '/nonexistent"),
    ],
)
async def test_bad_tls_settings_are_terminal_at_once(
    client: RemoteClient, fields: dict[str, str], reason: str
) -> None:
    with pytest.raises(TerminalFunctionError, match=reason):
        await client.call("https://127.0.0.1:1/statefun", b"x", tls(**fields), "test/fn")


async def test_payload_max_bytes_limits_responses(client: RemoteClient) -> None:
    async with RawServer(one_reply(reply(b"z" * 600))) as server:
        small = replace(transport(), payload_max_bytes=500)
        with pytest.raises(TerminalFunctionError, match="more than the limit of 500"):
            await client.call(server.url, b"x", small, "test/fn")


async def test_pool_ttl_retires_old_connections(tmp_path: Path) -> None:
    async with RawServer(one_reply(reply(b"ok"))) as server:
        remote = RemoteClient()
        try:
            spec = replace(transport(), pool_ttl=timedelta(milliseconds=50))
            assert await remote.call(server.url, b"1", spec, "test/fn") == b"ok"
            await asyncio.sleep(0.1)
            assert await remote.call(server.url, b"2", spec, "test/fn") == b"ok"
            assert server.accepted == 2  # the first was too old to reuse
            kept = replace(transport(), pool_ttl=timedelta(0))
            assert await remote.call(server.url, b"3", kept, "test/fn") == b"ok"
            assert await remote.call(server.url, b"4", kept, "test/fn") == b"ok"
            assert server.accepted == 2  # without a ttl the second connection serves on
        finally:
            await remote.close()


async def first_step(coro: Any) -> asyncio.Task[Any]:
    """``coro`` as a task that has run one step: up to where it first waits."""
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(0)  # the task's first step runs, then this resumes
    return task


async def test_before_wait_comes_before_the_first_wait(pool: HttpPool) -> None:
    """The dispatcher sends a batch's outputs from ``before_wait``: in the step that writes the
    next request, or before any wait - never after one (a checkpoint could fall in between)."""
    async with RawServer(echo_handler()) as server:
        target = parse_target(server.url)
        for idle in (False, True):  # a new connection, then the idle one
            calls: list[str] = []
            post = pool.post(
                target,
                b"x",
                DEADLINE,
                DEADLINE,
                DEADLINE,
                before_wait=functools.partial(calls.append, "w"),
            )
            # it connects (waits) or writes the request (then waits for its reply)
            task = await first_step(post)
            assert calls, f"idle={idle}: not called before the first wait"
            response = await task
            assert response.body == b"echo:x"
            assert len(calls) == (2 if not idle else 1)  # the caller makes it act once


async def test_before_wait_is_called_when_the_call_fails_at_once(client: RemoteClient) -> None:
    calls: list[str] = []
    call = client.call(
        "http://127.0.0.1:9/nothing-listens",
        b"x",
        transport(call=0.2),
        "test/fn",
        before_wait=lambda: calls.append("w"),
    )
    task = await first_step(call)
    assert calls
    with pytest.raises(RetryableFunctionError):
        await task
