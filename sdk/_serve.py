"""Serving functions over HTTP: StateFun's request-reply protocol v3.

``start_server`` runs the built-in HTTP/1.1 server (``statefun._http.server``) inside the
current event loop (``port=0`` picks a free port) and ``serve`` is the blocking form for a
process of its own, stopped gracefully by SIGINT or SIGTERM. ``make_app`` builds an aiohttp
application instead, for mounting the functions in an aiohttp app of one's own. Both answer ``POST
<path>`` with a FromFunction and ``GET /health`` with the functions served, through the same
``Endpoint`` (see ``_endpoint`` for the error replies: 400, 404, 405, 413, 415, 500).

The built-in server defends itself (``statefun._http.defences.ServerOptions``: deadlines for
request heads and bodies, connection caps, a ``Host`` allow-list) and can require a bearer
token (``token``: 401 without it; ``GET /health`` needs none) and speak TLS (``tls``, an
``ssl.SSLContext``; ``statefun._http.defences.server_tls_context`` builds one from PEM
files).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from statefun._http.defences import ServerOptions
from statefun._http.server import HttpServer, Reply
from statefun.sdk._endpoint import DEFAULT_MAX_BODY_BYTES, HEALTH_PATH, Endpoint, as_handler
from statefun.sdk._functions import StatefulFunctions
from statefun.sdk._handler import RequestReplyHandler

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "HEALTH_PATH",
    "RunningServer",
    "make_app",
    "serve",
    "start_server",
]

log = logging.getLogger(__name__)

DEFAULT_SHUTDOWN_TIMEOUT = 30.0


def make_app(
    functions_or_handler: StatefulFunctions | RequestReplyHandler,
    *,
    path: str = "/statefun",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> web.Application:
    """An aiohttp application serving ``functions_or_handler`` at ``POST path``.

    Also answers ``GET /health`` with ``{"status": "ok", "functions": [typenames]}``.
    Functions defined with ``def`` (not ``async def``) run on the event loop's thread: while
    one runs, no other request is served.
    """
    from aiohttp import web

    endpoint = Endpoint(functions_or_handler, path, max_body_bytes)

    def response(reply: Reply) -> web.Response:
        status, content_type, body, headers = reply
        return web.Response(
            status=status, body=body, content_type=content_type, headers=dict(headers)
        )

    async def invoke(request: web.Request) -> web.StreamResponse:
        early = endpoint.refusal(
            request.method, path, request.headers.get("Content-Type"), request.content_length
        )
        if early is not None:
            return response(early)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return response(endpoint.too_large(None))
        return response(await endpoint.invoke_async(body))

    async def health(request: web.Request) -> web.StreamResponse:
        return response(endpoint.health())

    # The body limit is checked by invoke() (Content-Length) and by request.read() (chunked).
    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_route("*", path, invoke)
    app.router.add_get(HEALTH_PATH, health)
    return app


class RunningServer:
    """A server started by ``start_server``; ``await close()`` (or ``async with``) stops it."""

    def __init__(
        self,
        server: HttpServer,
        host: str,
        port: int,
        path: str,
        typenames: list[str],
        shutdown_timeout: float,
        tls: bool = False,
    ) -> None:
        self.tls = tls
        self.server = server
        self.host = host
        self.port = port
        self.path = path
        self.typenames = typenames
        self.shutdown_timeout = shutdown_timeout

    @property
    def url(self) -> str:
        """The URL of the function endpoint, e.g. ``http://127.0.0.1:8000/statefun``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.port}{self.path}"

    async def close(self) -> None:
        """Stop listening, let in-flight requests finish (up to the shutdown timeout), close."""
        await self.server.close(self.shutdown_timeout)

    async def __aenter__(self) -> RunningServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<RunningServer {self.url}>"


async def start_server(
    functions_or_handler: StatefulFunctions | RequestReplyHandler,
    host: str = "127.0.0.1",
    port: int = 0,
    path: str = "/statefun",
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    keepalive_timeout: float | None = None,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    options: ServerOptions | None = None,
) -> RunningServer:
    """Start serving in the running event loop; ``port=0`` picks a free port (see ``.port``).

    Idle keep-alive connections are closed after ``keepalive_timeout`` seconds (default 75);
    ``options`` sets the other limits. With ``token``, every request but ``GET /health``
    must carry ``Authorization: Bearer <token>``; with ``tls``, the server speaks HTTPS.
    """
    endpoint = Endpoint(functions_or_handler, path, max_body_bytes)
    options = (options or ServerOptions()).with_(
        keepalive_timeout=keepalive_timeout, token=token, tls=tls
    )
    server = HttpServer(endpoint, options=options, name="function server")
    bound_port = await server.start(host, port)
    return RunningServer(
        server,
        host,
        bound_port,
        path,
        endpoint.typenames(),
        shutdown_timeout,
        tls=options.tls is not None,
    )


def serve(
    functions: StatefulFunctions | RequestReplyHandler,
    host: str = "127.0.0.1",
    port: int = 8000,
    path: str = "/statefun",
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    options: ServerOptions | None = None,
) -> None:
    """Serve ``functions`` over HTTP until SIGINT or SIGTERM; blocks (``token``, ``tls``,
    ``options``: see ``start_server``).

    On the first signal the server stops accepting connections, lets in-flight requests
    finish (for at most ``shutdown_timeout`` seconds) and returns; a second signal stops
    waiting for them.
    """
    as_handler(functions)  # fail before starting a loop
    asyncio.run(
        _serve_until_signalled(
            functions,
            host,
            port,
            path,
            max_body_bytes=max_body_bytes,
            shutdown_timeout=shutdown_timeout,
            token=token,
            tls=tls,
            options=options,
        )
    )


async def _serve_until_signalled(
    functions: StatefulFunctions | RequestReplyHandler,
    host: str,
    port: int,
    path: str,
    *,
    max_body_bytes: int,
    shutdown_timeout: float,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    options: ServerOptions | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    closing: asyncio.Future[None] | None = None

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if not stop.is_set():
            log.info(
                "%s received: finishing in-flight requests (at most %gs)", name, shutdown_timeout
            )
            stop.set()
        elif closing is not None and not closing.done():
            log.warning("%s received again: not waiting for in-flight requests", name)
            closing.cancel()

    installed = _install_signal_handlers(loop, on_signal)
    try:
        server = await start_server(
            functions,
            host,
            port,
            path,
            max_body_bytes=max_body_bytes,
            shutdown_timeout=shutdown_timeout,
            token=token,
            tls=tls,
            options=options,
        )
        names = ", ".join(server.typenames) or "no functions"
        log.info("serving %s at %s", names, server.url)
        await stop.wait()
        closing = asyncio.ensure_future(server.close())
        try:
            await closing
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # cancelled from outside, not by a second signal
        log.info("stopped")
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def _install_signal_handlers(
    loop: asyncio.AbstractEventLoop, callback: Callable[[int], Any]
) -> list[int]:
    installed: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, callback, signum)
        except (NotImplementedError, RuntimeError, ValueError):
            # Not the main thread, or a platform without loop signal handlers.
            log.debug("cannot handle %s here; stop the server another way", signum.name)
            continue
        installed.append(signum)
    return installed
