"""Serving functions over HTTP with aiohttp: StateFun's request-reply protocol v3.

``make_app`` builds the aiohttp application: ``POST <path>`` takes a ToFunction and answers
with a FromFunction, ``GET /health`` says which functions are served. ``start_server`` runs it
inside the current event loop (``port=0`` picks a free port) and ``serve`` is the blocking
form for a process of its own, stopped gracefully by SIGINT or SIGTERM.

Errors are answered with one line of plain text and never with a traceback:

====  ==========================================================================
400   the body is not a ToFunction with an invocation batch
404   no function is registered for the target's typename
405   a method other than POST on the function path
413   a body larger than ``max_body_bytes``
415   a Content-Type other than ``application/octet-stream`` (none at all is fine)
500   the function raised; the traceback goes to this module's logger
====  ==========================================================================
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from types import TracebackType
from typing import Any

from aiohttp import hdrs, web

from statefun._exceptions import MalformedRequestError, UnknownFunctionError
from statefun.sdk._functions import StatefulFunctions
from statefun.sdk._handler import RequestReplyHandler
from statefun.sdk._proto import request_reply_pb2 as pb

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

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
HEALTH_PATH = "/health"
CONTENT_TYPE = "application/octet-stream"

_MAX_REASON = 500  # characters of an exception message kept in a reply


def _one_line(text: str) -> str:
    """``text`` on one line, shortened to a reasonable length."""
    line = " ".join(text.split())
    if len(line) > _MAX_REASON:
        line = line[: _MAX_REASON - 3] + "..."
    return line


def _plain(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, text=_one_line(reason) + "\n", content_type="text/plain", headers=headers
    )


def _describe(exc: BaseException) -> str:
    message = str(exc)
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def _target_typename(body: bytes) -> str:
    """The typename a request is addressed to (only called after the handler decoded it)."""
    try:
        target = pb.ToFunction.FromString(body).invocation.target
    except Exception:  # pragma: no cover - the handler decoded the same bytes already
        return "?"
    return f"{target.namespace}/{target.type}"


def _as_handler(functions_or_handler: object) -> RequestReplyHandler:
    if isinstance(functions_or_handler, RequestReplyHandler):
        return functions_or_handler
    if isinstance(functions_or_handler, StatefulFunctions):
        return RequestReplyHandler(functions_or_handler)
    raise TypeError(
        "expected a StatefulFunctions or a RequestReplyHandler, "
        f"got {type(functions_or_handler).__name__}"
    )


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


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
    handler = _as_handler(functions_or_handler)
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"the path must start with '/', got {path!r}")
    if path == HEALTH_PATH:
        raise ValueError(f"the path {HEALTH_PATH!r} is taken by the health check")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
        raise TypeError("max_body_bytes must be an int")
    if max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")

    handle_async = handler.handle_async
    registry = handler.functions
    allow = {"Allow": "POST"}

    async def invoke(request: web.Request) -> web.StreamResponse:
        if request.method != hdrs.METH_POST:
            return _plain(405, f"method {request.method} is not allowed on {path}; use POST", allow)
        content_type = request.headers.get(hdrs.CONTENT_TYPE)
        if content_type is not None and _media_type(content_type) != CONTENT_TYPE:
            return _plain(415, f"unsupported Content-Type {content_type!r}; send {CONTENT_TYPE}")
        length = request.content_length
        if length is not None and length > max_body_bytes:
            return _too_large(length)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(None)
        try:
            reply = await handle_async(body)
        except MalformedRequestError as exc:
            log.warning("bad request on %s: %s", path, exc)
            return _plain(400, str(exc))
        except UnknownFunctionError as exc:
            log.warning("request on %s: %s", path, exc)
            return _plain(404, str(exc))
        except Exception as exc:
            typename = _target_typename(body)
            log.exception("function %s failed", typename)
            return _plain(500, f"function {typename} failed: {_describe(exc)}")
        return web.Response(body=reply, content_type=CONTENT_TYPE)

    def _too_large(length: int | None) -> web.Response:
        size = f"{length} bytes" if length is not None else "the body"
        reason = f"request body too large: {size} exceeds the limit of {max_body_bytes} bytes"
        log.warning("rejected request on %s: %s", path, reason)
        return _plain(413, reason)

    async def health(request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok", "functions": sorted(registry.typenames())})

    # The body limit is checked by invoke() (Content-Length) and by request.read() (chunked).
    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_route("*", path, invoke)
    app.router.add_get(HEALTH_PATH, health)
    return app


class RunningServer:
    """A server started by ``start_server``; ``await close()`` (or ``async with``) stops it."""

    def __init__(
        self, runner: web.AppRunner, host: str, port: int, path: str, typenames: list[str]
    ) -> None:
        self.runner = runner
        self.host = host
        self.port = port
        self.path = path
        self.typenames = typenames

    @property
    def url(self) -> str:
        """The URL of the function endpoint, e.g. ``http://127.0.0.1:8000/statefun``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"

    async def close(self) -> None:
        """Stop listening, let in-flight requests finish (up to the shutdown timeout), close."""
        await self.runner.cleanup()

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
) -> RunningServer:
    """Start serving in the running event loop; ``port=0`` picks a free port (see ``.port``)."""
    handler = _as_handler(functions_or_handler)
    app = make_app(handler, path=path, max_body_bytes=max_body_bytes)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    addresses = runner.addresses
    bound_port = int(addresses[0][1]) if addresses else port
    typenames = sorted(handler.functions.typenames())
    return RunningServer(runner, host, bound_port, path, typenames)


def serve(
    functions: StatefulFunctions | RequestReplyHandler,
    host: str = "127.0.0.1",
    port: int = 8000,
    path: str = "/statefun",
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> None:
    """Serve ``functions`` over HTTP until SIGINT or SIGTERM; blocks.

    On the first signal the server stops accepting connections, lets in-flight requests
    finish (for at most ``shutdown_timeout`` seconds) and returns; a second signal stops
    waiting for them.
    """
    _as_handler(functions)  # fail before starting a loop
    asyncio.run(
        _serve_until_signalled(
            functions,
            host,
            port,
            path,
            max_body_bytes=max_body_bytes,
            shutdown_timeout=shutdown_timeout,
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
