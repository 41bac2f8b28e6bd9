"""The built-in HTTP/1.1 server of ``statefun serve``: one asyncio protocol per connection.

A function server answers one kind of request many thousands of times per second, so
``start_server`` and ``serve`` use this small server rather than a general framework (aiohttp's
server costs about half of the function server's CPU on the benchmark machine; see
BENCHMARKS.md). ``make_app`` still gives an aiohttp application for those who mount the
functions in their own app; both answer through the same ``Endpoint``.

What it speaks: HTTP/1.1 and 1.0, keep-alive, request bodies framed by ``Content-Length`` or
``Transfer-Encoding: chunked``, ``Expect: 100-continue``, pipelined requests (answered in
order), TLS (started by the server once a connection is admitted). Bounds and guards, set by
``defences.ServerOptions`` (docs/architecture.md, "HTTP server defences"): the request head
(64 KiB, and complete within ``head_timeout`` however slowly its bytes trickle in: 408), the
body (``max_body_bytes``: 413; within ``body_timeout`` plus one second per ``min_body_rate``
bytes: 408), open connections (in all and per client address; at a cap the longest-waiting
connection of the right client makes room, else the new one gets a 503), replies a client
does not read (past asyncio's write buffer limit the connection stops reading requests), idle
connections (closed after ``keepalive_timeout``), the ``Host`` allow-list (421) and a bearer
token (401). A request it cannot parse gets a 400 and the connection is closed.

Requests to ``def`` functions run inline, in the protocol's callback; ``async def`` functions
run in a task each, and the connection reads no further request meanwhile. A request's head
and a reply's bytes are ``_messages.py``; here are the connections and the server that holds
them (one protocol object and its caps, read best together).
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from collections.abc import Coroutine
from typing import Any

from statefun._http._messages import (
    Application,
    BadRequest,
    Reply,
    Request,
    encode_reply,
    media_type,
    parse_head,
    plain,
)
from statefun._http.chunked import ChunkedBody, ChunkError, ChunksTooLarge
from statefun._http.defences import HostCheck, ServerOptions, token_matches, warn_if_exposed
from statefun._http.slots import Slots

__all__ = [
    "Application",
    "HttpServer",
    "Reply",
    "Request",
    "ServerOptions",
    "media_type",
    "plain",
]

log = logging.getLogger(__name__)

_MAX_HEAD_BYTES = 64 << 10
_MAX_DISCARD = 1 << 20  # a refused body up to this size is read and dropped
_LINGER_SECONDS = 2.0
_HEAD, _BODY, _BUSY = 0, 1, 2  # what a connection waits for: a request head, a body, the app
_REORDER = 0.25  # seconds: how stale a waiting connection's place in the order may be


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.app = server.app
        self.transport: asyncio.Transport | None = None
        self.client = ""  # the peer's address, for the per-client cap
        self.buffer = bytearray()
        self.request: Request | None = None  # head read, body pending
        self.chunked: ChunkedBody | None = None  # the request's body, if chunked
        self.busy: asyncio.Task[None] | None = None  # an async function running
        self.phase = _HEAD
        now = time.monotonic()
        self.wait_since = -math.inf  # when it was last listed as waiting
        self.last_active = now  # the last reply (or the connect): the keep-alive clock
        #: when the head being waited for started (the connect, or its first byte); None:
        #: idle after a reply, nothing of the next request yet
        self.head_start: float | None = now
        self.body_start = now
        self.received = 0  # bytes received, all told
        self.body_mark = 0  # ``received`` when the current body started
        self.closing = False
        self.refused = False  # over a cap: answered 503, closing
        self.lingering = False  # refused and waiting a moment for the client to read that
        self.handshaking = False  # TLS handshake in progress
        self.handshake: asyncio.Task[None] | None = None
        self.eof = False
        self.write_paused = False
        self.discard = 0  # bytes of a rejected body still to drop
        self.draining = 0  # > 0: closing after an error, dropping up to this many bytes

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        server = self.server
        if not server.admit(self):
            server.refuse(self, transport)
            return
        if server.options.tls is not None:
            # TLS starts only now, so that a connection counts towards the caps (and its
            # head deadline runs) from the moment it is accepted, handshake included.
            self.handshaking = True
            self.handshake = asyncio.get_running_loop().create_task(self._start_tls(transport))

    async def _start_tls(self, transport: asyncio.Transport) -> None:
        options = self.server.options
        assert options.tls is not None
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport,
                self,
                options.tls,
                server_side=True,
                ssl_handshake_timeout=options.head_timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            why = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self.server.note("tls", f"TLS handshake with {self._peer()} failed: {why}")
            self.closing = True
            self.server.forget(self)
            transport.abort()
            return
        if secure is None or self.closing:
            if secure is not None:
                secure.abort()
            self.server.forget(self)
            return
        # What came meanwhile waited in the buffer: replies must go through ``secure``.
        self.transport = secure
        self.handshaking = False
        if self.buffer:
            self._process()

    def pause_writing(self) -> None:
        # The client does not read its replies: stop reading its requests until it does.
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.busy is None and not self.closing and self.transport is not None:
            self.transport.resume_reading()
            self._process()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.forget(self)
        # A running async function finishes; its reply has nowhere to go.

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # dropped: the 503 is on its way, the connection closes
        if self.head_start is None and self.phase == _HEAD:
            self.head_start = time.monotonic()  # a byte of the next request: its deadline starts
        self.received += len(data)
        if self.draining:
            self.draining -= len(data)
            if self.draining <= 0:
                self.abort()
            return
        if self.discard:
            dropped = min(self.discard, len(data))
            self.discard -= dropped
            data = data[dropped:]
        self.buffer += data
        if self.busy is None and not self.handshaking:
            self._process()

    def eof_received(self) -> bool | None:
        self.eof = True
        if self.refused:
            return False  # close now
        # keep the write side open for a reply in progress
        return self.busy is not None and not self.draining

    # -- requests -------------------------------------------------------------------------

    def waits_for_head(self) -> bool:
        return self.phase == _HEAD and not self.closing

    def idle(self) -> bool:
        return self.busy is None and self.request is None and not self.buffer

    def overdue(self, now: float) -> str | None:
        """Why the connection is to be closed now, or None (the sweeper asks)."""
        server = self.server
        if self.phase == _HEAD:
            start = self.head_start
            if start is None:
                if now - self.last_active > server.options.keepalive_timeout:
                    return ""  # idle too long: closed without a word
                return None
            if now - start > server.options.head_timeout:
                if not self.buffer:
                    return ""  # not a byte of a request: closed without a word
                return f"request head not complete within {server.options.head_timeout:g}s"
            return None
        if self.phase == _BODY:
            got = self.received - self.body_mark
            allowed = server.options.body_timeout + got / server.options.min_body_rate
            if now - self.body_start > allowed:
                return (
                    f"request incomplete: body not received within {allowed:.3g}s "
                    f"({got} bytes came)"
                )
        return None

    def _waiting_for_head(self) -> None:
        """The last request is answered: the connection waits for the next head."""
        self.phase = _HEAD
        now = self.last_active = time.monotonic()  # the keep-alive timeout counts from here
        self.head_start = now if self.buffer else None
        if now - self.wait_since > _REORDER:  # a busy connection is not moved every time
            self.wait_since = now
            self.server.slots.waiting(self, now)

    def _head_read(self) -> None:
        # (it stays listed as waiting: ``HttpServer._evict`` skips it while it is not)
        self.phase = _BODY
        self.body_start = time.monotonic()
        self.body_mark = self.received - len(self.buffer)

    def _process(self) -> None:
        try:
            while not self.closing and self.busy is None and not self.write_paused:
                body = self._next_body()
                if body is None:
                    return
                request = self.request
                assert request is not None
                self.request = None
                self._answer(request, body)
        except BadRequest as exc:
            self._reject(exc.status, str(exc))

    def _next_body(self) -> bytes | None:
        """The body of the next complete request (its head in ``self.request``), or None."""
        buffer = self.buffer
        request = self.request
        if request is None:
            if not buffer:
                return None
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD_BYTES:
                    raise BadRequest(431, f"request head longer than {_MAX_HEAD_BYTES} bytes")
                return None
            if end > _MAX_HEAD_BYTES:
                raise BadRequest(431, f"request head longer than {_MAX_HEAD_BYTES} bytes")
            request = self.request = parse_head(bytes(buffer[:end]))
            del buffer[: end + 4]
            self._head_read()
            self.chunked = ChunkedBody(self.app.max_body_bytes) if request.chunked else None
            early = self.server.screen(request) or self.app.check(request)
            if early is not None:
                self.request = None
                if not request.length and not request.chunked:  # nothing to skip
                    self._write(early, request.keep_alive, head_only=request.method == "HEAD")
                    if self.buffer and not self.closing:
                        asyncio.get_running_loop().call_soon(self._process)
                else:
                    self._refuse_body(request, early)
                return None
            if request.length is not None and request.length > self.app.max_body_bytes:
                self.request = None
                self._refuse_body(request, self.app.too_large(request.length))
                return None
            if request.expect and (request.length or request.chunked):
                assert self.transport is not None
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if request.chunked:
            return self._read_chunks()
        length = request.length or 0
        if len(buffer) < length:
            return None
        body = bytes(buffer[:length])
        del buffer[:length]
        return body

    def _refuse_body(self, request: Request, reply: Reply) -> None:
        """Answer ``reply`` without reading the body: drop a body of known, modest length
        and carry on; otherwise answer, then close once the client stops sending. A client
        that expects 100-continue may or may not send the body now: close then too."""
        length = request.length
        if length is not None and length <= _MAX_DISCARD and not request.expect:
            dropped = min(length, len(self.buffer))
            del self.buffer[:dropped]
            self.discard = length - dropped
            self._write(reply, request.keep_alive)
            if self.buffer and not self.closing:
                asyncio.get_running_loop().call_soon(self._process)  # a pipelined request
            return None
        self._write(reply, keep_alive=False, linger=True)
        return None

    def _read_chunks(self) -> bytes | None:
        assert self.chunked is not None
        try:
            pos, body = self.chunked.feed(self.buffer, 0)
        except ChunkError as exc:
            raise BadRequest(400, str(exc)) from None
        except ChunksTooLarge:
            self.request = None
            self._write(self.app.too_large(None), keep_alive=False, linger=True)
            return None
        del self.buffer[:pos]  # what follows the body is the next request
        return body

    def _answer(self, request: Request, body: bytes) -> None:
        try:
            outcome = self.app.handle(request, body)
        except Exception as exc:  # the application's bug: answered, never a hung connection
            outcome = self._failed(request, exc)
        if isinstance(outcome, Reply):
            self._write(outcome, request.keep_alive, head_only=request.method == "HEAD")
            return
        assert self.transport is not None
        self.transport.pause_reading()
        self.phase = _BUSY
        self.busy = asyncio.get_running_loop().create_task(
            self._answer_later(outcome, request.keep_alive)
        )

    async def _answer_later(self, outcome: Coroutine[Any, Any, Reply], keep_alive: bool) -> None:
        try:
            reply = await outcome
        except Exception as exc:
            reply = self._failed(None, exc)
        finally:
            self.busy = None
        if self.closing:
            return
        self._write(reply, keep_alive and not self.eof)
        assert self.transport is not None
        if not self.closing and not self.write_paused:
            self.transport.resume_reading()
            self._process()

    def _failed(self, request: Request | None, exc: Exception) -> Reply:
        """The 500 for a request the application failed on; logged, rate limited."""
        where = f" {request.method} {request.path}" if request is not None else ""
        self.server.note("failed", f"request{where} failed: {type(exc).__name__}: {exc}")
        log.debug("request failed", exc_info=exc)
        return plain(500, "internal error: the request failed; see the server's log")

    def _write(
        self, reply: Reply, keep_alive: bool, head_only: bool = False, linger: bool = False
    ) -> None:
        keep_alive = keep_alive and not self.server.shutting_down
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(encode_reply(reply, keep_alive, head_only))
        if keep_alive:
            self._waiting_for_head()
            return
        self.server.slots.not_waiting(self)  # closing: not one to close to make room
        if not linger:
            self._close()
            return
        # Closing with unread bytes would reset the connection and could lose the reply:
        # send FIN, drop what still comes, close when the client does (or soon anyway).
        self.closing = True
        self.buffer.clear()
        self.draining = _MAX_DISCARD
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(_LINGER_SECONDS, self.abort)

    def _reject(self, status: int, reason: str) -> None:
        self.server.note("bad", f"bad HTTP request from {self._peer()}: {reason}")
        self.request = None
        self._write(plain(status, reason), keep_alive=False, linger=True)

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "a client"

    def _close(self) -> None:
        self.closing = True
        self.buffer.clear()
        if self.transport is not None:
            self.transport.close()

    def evict(self) -> None:
        """Closed to make room (it waits for a request head): a 503, then closed (during a
        TLS handshake: just closed)."""
        self.buffer.clear()
        if self.handshaking:
            self.abort()
        elif self.transport is not None and not self.transport.is_closing():
            self.server.send_busy(self, self.transport)

    def time_out(self, reason: str) -> None:
        self.request = None
        self._write(plain(408, reason), keep_alive=False, linger=True)

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()


_LOG_EVERY = 10.0  # seconds between two warnings of one kind from one server
_REFUSED_LINGER = 1.0  # seconds a refused connection may take to read its 503


class HttpServer:
    """Listens on one address; ``close`` stops it gracefully.

    ``options`` (``defences.ServerOptions``) sets its time limits, connection caps, ``Host``
    allow-list, bearer token and TLS; ``keepalive_timeout`` and ``max_connections`` given
    here override the options' own."""

    def __init__(
        self,
        app: Application,
        keepalive_timeout: float | None = None,
        max_connections: int | None = None,
        *,
        options: ServerOptions | None = None,
        name: str = "HTTP server",
    ) -> None:
        self.app = app
        self.name = name
        self.options = (options or ServerOptions()).with_(
            keepalive_timeout=keepalive_timeout, max_connections=max_connections
        )
        self.refused = 0  # connections refused over a cap
        self.evicted = 0  # waiting connections closed to make room for new ones
        self.slots: Slots[_Connection] = Slots(
            self.options.max_connections,
            self.options.max_connections_per_client,
            min(1.0, self.options.head_timeout / 2),
        )
        self.connections = self.slots.connections  # open and counted in
        self.shutting_down = False
        self._lingering = 0
        self._busy_bytes = b""
        self._hosts = HostCheck(self.options.allowed_hosts, "127.0.0.1")
        self._logged: dict[str, tuple[float, int]] = {}
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def keepalive_timeout(self) -> float:
        return self.options.keepalive_timeout

    @property
    def max_connections(self) -> int:
        return self.options.max_connections

    async def start(self, host: str, port: int) -> int:
        """Listen on (host, port); the port bound (``port=0`` picks a free one)."""
        options = self.options
        self._hosts = HostCheck(options.allowed_hosts, host)
        warn_if_exposed(
            self.name, host, tls=options.tls is not None, token=options.token is not None
        )
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, backlog=1024, reuse_address=True
        )
        self._sweeper = loop.create_task(self._sweep())
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    # -- connections: caps, eviction, the 503 --------------------------------------------------

    def admit(self, connection: _Connection) -> bool:
        """Count a new connection in, closing others to make room at a cap (see ``slots``);
        False if there is no room (the caller refuses it)."""
        victims = self.slots.admit(connection, time.monotonic())
        if victims is None:
            return False
        for victim in victims:
            self.evicted += 1
            self.note("evict", f"closed waiting connections to make room ({self._caps()})")
            victim.evict()
        return True

    def refuse(self, connection: _Connection, transport: asyncio.Transport) -> None:
        """Answer a connection over a cap with a 503 and close it (with TLS, before the
        handshake: just close it)."""
        self.refused += 1
        self.note("refuse", f"refused connections over the caps ({self._caps()})")
        if self.options.tls is not None:
            connection.refused = connection.closing = True
            transport.abort()
            return
        self.send_busy(connection, transport)

    def send_busy(self, connection: _Connection, transport: asyncio.Transport) -> None:
        """Write the 503 and close: after the client has had a moment to read it (and send
        what it was sending), as long as few connections linger so; at once otherwise."""
        connection.refused = True
        connection.closing = True
        transport.write(self._busy_reply())
        if self._lingering < 256 and transport.can_write_eof():
            self._lingering += 1
            connection.lingering = True
            transport.write_eof()
            asyncio.get_running_loop().call_later(_REFUSED_LINGER, connection.abort)
        else:
            transport.close()

    def _caps(self) -> str:
        options = self.options
        return (
            f"{options.max_connections} in all, {options.max_connections_per_client} per "
            "client; settings http_max_connections, http_max_connections_per_client"
        )

    def _busy_reply(self) -> bytes:
        if not self._busy_bytes:
            reply = plain(503, "too many connections; try again later", (("Retry-After", "1"),))
            self._busy_bytes = encode_reply(reply, keep_alive=False)
        return self._busy_bytes

    def forget(self, connection: _Connection) -> None:
        """The connection is closed (or closing): count it out. Idempotent."""
        if connection.lingering:
            connection.lingering = False
            self._lingering -= 1
        self.slots.forget(connection)

    # -- requests: Host and token ----------------------------------------------------------------

    def screen(self, request: Request) -> Reply | None:
        """The refusal of a request whose ``Host`` is not served here (421) or that lacks the
        bearer token (401; ``GET /health`` needs none), or None."""
        hosts = self._hosts
        if not hosts.any:
            host = request.headers.get("host")
            if host not in hosts.accepted:
                why = hosts.refusal(host)
                if why is not None:
                    self.note("host", f"refused a request for another host: {why}")
                    return plain(421, why)
        token = self.options.token
        if token is None or (request.path == "/health" and request.method in ("GET", "HEAD")):
            return None
        given = request.headers.get("authorization")
        if token_matches(given, token):
            return None
        reason = "the bearer token is wrong" if given else "a bearer token is required"
        self.note("token", "refused requests without the right bearer token")
        return plain(
            401,
            f"{reason}: send Authorization: Bearer <token>",
            (("WWW-Authenticate", 'Bearer realm="pystatefun"'),),
        )

    def note(self, kind: str, message: str) -> None:
        """A WARNING about something that may happen thousands of times a second: at most
        one per ``_LOG_EVERY`` seconds per kind, with the count since the last one."""
        now = time.monotonic()
        last, count = self._logged.get(kind, (-_LOG_EVERY, 0))
        count += 1
        if now - last >= _LOG_EVERY:
            log.warning(
                "%s: %s (%d time(s) since the last such warning)", self.name, message, count
            )
            self._logged[kind] = (now, 0)
        else:
            self._logged[kind] = (last, count)

    async def _sweep(self) -> None:
        """Close connections past a deadline: a request head or body too slow, idle too long."""
        options = self.options
        shortest = min(options.head_timeout, options.body_timeout, options.keepalive_timeout)
        period = max(0.05, min(shortest / 4, 1.0))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for connection in list(self.connections):
                if connection.busy is not None or connection.closing:
                    continue
                why = connection.overdue(now)
                if why is None:
                    continue
                if why:
                    self.note(
                        "slow",
                        f"closed slow connections, e.g. from {connection._peer()}: {why}",
                    )
                    connection.time_out(why)
                else:
                    self.forget(connection)
                    connection._close()

    async def close(self, timeout: float) -> None:
        """Stop listening, close idle connections, let requests in progress finish for at
        most ``timeout`` seconds, then close everything."""
        self.shutting_down = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                for connection in list(self.connections):
                    if connection.idle():
                        connection._close()
                if not self.connections or loop.time() >= deadline:
                    break
                await asyncio.sleep(0.01)
        finally:
            for connection in list(self.connections):
                if connection.busy is not None:
                    connection.busy.cancel()
                connection.abort()
            if self._server is not None:
                await self._server.wait_closed()
