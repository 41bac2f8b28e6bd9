"""A small HTTP/1.1 client for remote function calls: keep-alive pools over asyncio protocols.

Remote calls are all alike: ``POST`` one binary body to a few endpoints, many thousands of
times per second, and read one binary body back. A general client spends most of the
runtime's CPU on this path (aiohttp: about 130 us per call on the benchmark machine; see
BENCHMARKS.md), so the runtime uses this one: the request head is built once per URL, a
response that arrives in one read is parsed in one pass, and a call is one future.

What it speaks: HTTP/1.1 with keep-alive; response bodies framed by ``Content-Length``, by
``Transfer-Encoding: chunked``, or by closing the connection; ``http`` and ``https`` over TCP
and ``http+unix`` / ``https+unix`` over a Unix domain socket (StateFun's form: the socket
file's path ends with ``.sock``, the rest of the path is the request path:
``http+unix:///run/functions.sock/statefun``).

Failures are exceptions the caller sorts into retryable or not: ``OSError`` (connect and
I/O errors, including a connection that closes before a full response), ``TimeoutError``,
``HttpProtocolError`` (bytes that are not an HTTP response; in the tree of
``statefun._exceptions``) and ``ResponseTooLarge``.
"""

from __future__ import annotations

import asyncio
import collections
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from statefun._exceptions import HttpProtocolError
from statefun._http.chunked import ChunkedBody, ChunkError, ChunksTooLarge

__all__ = [
    "HttpPool",
    "HttpProtocolError",
    "Response",
    "ResponseTooLarge",
    "Target",
    "parse_target",
]

_MAX_HEAD_BYTES = 64 << 10


class ResponseTooLarge(Exception):
    """The response body is larger than the pool's limit."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    reason: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to send requests for one URL (parsed once, see ``parse_target``)."""

    origin: tuple[str, str, int | str]  # (scheme, host, port) or (scheme, "", socket path)
    tls: bool
    #: the request line and headers, up to "Content-Length: " (not in repr: may hold a token)
    head: bytes = field(repr=False)
    context: ssl.SSLContext | None = None  # TLS settings (None: the system's trust store)
    ttl: float = 0.0  # seconds a connection may be reused; 0: no limit
    #: what pooled connections are shared by: the origin and the TLS settings (set once)
    key: tuple[Any, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.origin, self.context))


def parse_target(
    url: str,
    context: ssl.SSLContext | None = None,
    ttl: float = 0.0,
    headers: tuple[tuple[str, str], ...] = (),
) -> Target:
    """The ``Target`` of ``url``; ValueError naming the problem if it cannot be called.

    ``context`` verifies ``https`` servers (and may hold a client certificate); ``ttl`` bounds
    how long one connection is reused; ``headers`` go with every request (e.g. a bearer
    token: the head holding them is never logged)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise ValueError(f"URL {url!r} has no host")
        tls = scheme == "https"
        port = parts.port or (443 if tls else 80)
        host_header = parts.netloc.rsplit("@", 1)[-1]
        origin: tuple[str, str, int | str] = (scheme, parts.hostname, port)
        path = parts.path or "/"
    elif scheme in ("http+unix", "https+unix"):
        tls = scheme == "https+unix"
        # the first path segment that ends with .sock (not "/run/my.socks/f.sock")
        found = re.search(r"\.sock(?=/|$)", parts.path)
        if found is None:
            raise ValueError(
                f"URL {url!r}: a {scheme} URL names a socket file ending with .sock, "
                "as in http+unix:///run/functions.sock/statefun"
            )
        socket_end = found.end()
        origin = (scheme, "", parts.path[:socket_end])
        path = parts.path[socket_end:] or "/"
        host_header = "localhost"
    else:
        raise ValueError(f"URL {url!r}: scheme {parts.scheme!r} is not http(s) or http(s)+unix")
    if parts.query:
        path += "?" + parts.query
    if any(c in name + value for name, value in headers for c in "\r\n\0"):
        raise ValueError(f"URL {url!r}: a header to send holds a line break or NUL")
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n"
        f"Content-Type: application/octet-stream\r\nUser-Agent: pystatefun\r\n{extra}"
        "Content-Length: "
    ).encode("latin-1")
    return Target(origin, tls, head, context if tls else None, ttl)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request on it at a time."""

    def __init__(self, pool: HttpPool, key: tuple[Any, ...]) -> None:
        self.pool = pool
        self.key = key
        self.created = pool.loop.time()
        self.limit = pool.max_response_bytes  # of the response being read
        self.counted = True  # holds one of the pool's connection slots
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Response] | None = None
        self.buffer = bytearray()
        self.closed = False
        self.keep_alive = True
        self.last_data = 0.0
        # the response being read
        self.status = 0
        self.reason = ""
        self.length = -1  # -1: not known yet; -2: chunked; -3: until the connection closes
        self.body_start = 0
        self.chunked: ChunkedBody | None = None  # a chunked body being read

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for: the connection is not usable any more
            return
        self.last_data = self.pool.loop.time()
        self.buffer += data
        try:
            self._parse()
        except (HttpProtocolError, ResponseTooLarge) as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        if self.waiter is not None and not self.waiter.done() and self.length == -3:
            self._finish(bytes(self.buffer[self.body_start :]))
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if self.waiter is not None and not self.waiter.done():
            if self.length == -3 and self.status:
                self._finish(bytes(self.buffer[self.body_start :]))
            else:
                received = "after a partial response" if self.buffer else "before a response"
                self.waiter.set_exception(
                    exc or ConnectionResetError(f"the server closed the connection {received}")
                )

    # -- one request ----------------------------------------------------------------------

    def send(self, head: bytes, body: bytes, waiter: asyncio.Future[Response]) -> None:
        assert self.transport is not None
        self.waiter = waiter
        self.buffer.clear()
        self.status = 0
        self.length = -1
        self.chunked = None
        self.last_data = self.pool.loop.time()
        prefix = head + str(len(body)).encode() + b"\r\n\r\n"
        if len(body) < 65536:
            self.transport.write(prefix + body)
        else:
            self.transport.write(prefix)
            self.transport.write(body)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.abort()

    def _finish(self, body: bytes) -> None:
        waiter = self.waiter
        self.buffer.clear()
        self.chunked = None
        if waiter is not None and not waiter.done():
            waiter.set_result(Response(self.status, self.reason, body))

    def _parse(self) -> None:
        buffer = self.buffer
        while not self.status:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD_BYTES:
                    raise HttpProtocolError(f"response head longer than {_MAX_HEAD_BYTES} bytes")
                return
            self._parse_head(bytes(buffer[:end]))
            self.body_start = end + 4
            if 100 <= self.status < 200:  # an interim response: the real one follows
                del buffer[: end + 4]
                self.status = 0
        length = self.length
        if length >= 0:
            have = len(buffer) - self.body_start
            if have >= length:
                if have > length:
                    raise HttpProtocolError(f"{have - length} bytes after the response body")
                start = self.body_start
                self._finish(bytes(buffer[start:]) if start else bytes(buffer))
        elif length == -2:
            if self.chunked is None:
                self.chunked = ChunkedBody(self.limit)
            self._parse_chunks()
        elif len(buffer) - self.body_start > self.limit:
            raise ResponseTooLarge(f"more than {self.limit} bytes")

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0]
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        self.status = int(parts[1])
        self.reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        keep_alive = parts[0] == b"HTTP/1.1"
        length = -3
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise HttpProtocolError(f"not a header line: {line[:80]!r}")
            name = name.strip().lower()
            if name == b"content-length":
                value = value.strip()
                if not value.isdigit():
                    raise HttpProtocolError(f"bad Content-Length {value[:40]!r}")
                if length == -2:
                    continue  # chunked wins (RFC 9112 6.3)
                length = int(value)
                if length > self.limit:
                    raise ResponseTooLarge(f"{length} bytes, more than the limit of {self.limit}")
            elif name == b"transfer-encoding":
                if value.strip().lower().endswith(b"chunked"):
                    length = -2
            elif name == b"connection":
                token = value.strip().lower()
                if token == b"close":
                    keep_alive = False
                elif token == b"keep-alive":
                    keep_alive = True
        if self.status in (204, 304):
            length = 0
        if length == -3:
            keep_alive = False
        self.length = length
        self.keep_alive = keep_alive

    def _parse_chunks(self) -> None:
        assert self.chunked is not None
        try:
            pos, body = self.chunked.feed(self.buffer, self.body_start)
        except ChunkError as exc:
            raise HttpProtocolError(str(exc)) from None
        except ChunksTooLarge as exc:
            raise ResponseTooLarge(str(exc)) from None
        if body is None:
            del self.buffer[:pos]
            self.body_start = 0
        elif len(self.buffer) > pos:
            raise HttpProtocolError("bytes after the last chunk")
        else:
            self._finish(body)


class HttpPool:
    """Keep-alive connections per origin, at most ``max_connections`` open in all."""

    def __init__(self, max_connections: int = 256, max_response_bytes: int = 64 << 20) -> None:
        self.loop = asyncio.get_running_loop()
        self.max_connections = max_connections
        self.max_response_bytes = max_response_bytes
        self._idle: dict[tuple[Any, ...], list[_Connection]] = {}
        self._open = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._ssl: ssl.SSLContext | None = None
        self._closing = False

    @property
    def open_connections(self) -> int:
        return self._open

    async def post(
        self,
        target: Target,
        body: bytes,
        connect_timeout: float,
        read_timeout: float,
        total_timeout: float,
        max_response_bytes: int | None = None,
        before_wait: Callable[[], None] | None = None,
    ) -> Response:
        """POST ``body``; the response.

        ``read_timeout`` bounds each wait for response bytes, ``total_timeout`` the whole call
        (connecting included); either raises TimeoutError. ``before_wait`` is called when the
        request is written, or before waiting for a connection if none is idle.
        """
        loop = self.loop
        deadline = loop.time() + total_timeout
        connection = self._reuse(target)
        if connection is None:
            if before_wait is not None:
                before_wait()
            connection = await self._acquire(target, connect_timeout, deadline)
        waiter: asyncio.Future[Response] = loop.create_future()
        connection.limit = max_response_bytes or self.max_response_bytes
        connection.send(target.head, body, waiter)
        if before_wait is not None:
            before_wait()
        timer = loop.call_at(
            min(loop.time() + read_timeout, deadline),
            self._check_time,
            connection,
            waiter,
            read_timeout,
            deadline,
        )
        try:
            response = await waiter
        except BaseException:
            connection.abort()  # a half-read response makes the connection useless
            raise
        finally:
            timer.cancel()
            connection.waiter = None
        self._release(connection)
        return response

    def _check_time(
        self,
        connection: _Connection,
        waiter: asyncio.Future[Response],
        read_timeout: float,
        deadline: float,
    ) -> None:
        if waiter.done():
            return
        now = self.loop.time()
        if now >= deadline:
            waiter.set_exception(TimeoutError("no full response within the call timeout"))
            return
        due = min(connection.last_data + read_timeout, deadline)
        if due > now:
            self.loop.call_at(due, self._check_time, connection, waiter, read_timeout, deadline)
            return
        waiter.set_exception(TimeoutError(f"no response bytes for {read_timeout:g} s"))

    async def _acquire(
        self, target: Target, connect_timeout: float, deadline: float
    ) -> _Connection:
        """A connection for ``target`` when none was idle: one freed by another call while
        waiting for room in the pool, or a new one."""
        while self._open >= self.max_connections:
            self._close_one_idle()
            waiter: asyncio.Future[None] = self.loop.create_future()
            self._waiting.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):  # waiting counts against the call
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass the turn on
                if isinstance(exc, TimeoutError):
                    raise TimeoutError(
                        f"all {self.max_connections} connections busy until the call timeout"
                    ) from None
                raise
            connection = self._reuse(target)
            if connection is not None:
                return connection
        self._open += 1
        connection = _Connection(self, target.key)
        connect_timeout = min(connect_timeout, max(0.0, deadline - self.loop.time()))
        try:
            await asyncio.wait_for(self._connect(target, connection), connect_timeout)
        except BaseException as exc:
            connection.abort()
            self._forget(connection)
            if isinstance(exc, TimeoutError) and not str(exc):
                raise TimeoutError(f"not connected within {connect_timeout:g} s") from None
            raise
        return connection

    def _reuse(self, target: Target) -> _Connection | None:
        """An idle connection for ``target``, closing those past the target's ttl."""
        idle = self._idle.get(target.key)
        oldest = self.loop.time() - target.ttl if target.ttl > 0 else None
        while idle:
            connection = idle.pop()
            if connection.closed:
                continue
            if oldest is not None and connection.created < oldest:
                connection.abort()  # its connection_lost gives the slot back
                continue
            return connection
        return None

    async def _connect(self, target: Target, connection: _Connection) -> None:
        _, host, where = target.origin
        context = (target.context or self._ssl_context()) if target.tls else None
        if isinstance(where, str):
            hostname = "localhost" if context is not None else None
            await self.loop.create_unix_connection(
                lambda: connection, where, ssl=context, server_hostname=hostname
            )
        else:
            await self.loop.create_connection(lambda: connection, host, where, ssl=context)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _release(self, connection: _Connection) -> None:
        if connection.closed or not connection.keep_alive or self._closing:
            connection.abort()
            return
        self._idle.setdefault(connection.key, []).append(connection)
        if self._waiting:
            self._wake_one()

    def _forget(self, connection: _Connection) -> None:
        """Give back the connection's slot (once, however it ended)."""
        if not connection.counted:
            return
        connection.counted = False
        self._open -= 1
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _close_one_idle(self) -> None:
        """Close an idle connection to another origin, to make room for a new one."""
        for connections in self._idle.values():
            while connections:
                connection = connections.pop()
                if not connection.closed:
                    connection.abort()  # its connection_lost frees the slot, wakes a waiter
                    return

    async def close(self) -> None:
        self._closing = True
        for connections in self._idle.values():
            for connection in connections:
                connection.abort()
        self._idle.clear()
        for waiter in self._waiting:
            if not waiter.done():
                waiter.cancel()
        self._waiting.clear()
        await asyncio.sleep(0)  # let the transports run connection_lost
