"""What a function endpoint answers, apart from HTTP framing: shared by both servers.

``Endpoint`` turns (method, path, Content-Type, length, body) into a ``Reply``: status,
content type, body and extra headers. The aiohttp application (``make_app``) and the
built-in server (``statefun._http.server``) both call it, so they answer the same requests
the same way. Errors are answered with one line of plain text and never with a traceback:

====  ==========================================================================
400   the body is not a ToFunction with an invocation batch, or a value in it (a state, a
      message the function reads) does not decode as its type
404   no function is registered for the target's typename (or no such path)
405   a method other than POST on the function path (GET on the health path)
413   a body larger than ``max_body_bytes``
415   a Content-Type other than ``application/octet-stream`` (none at all is fine)
500   the function raised; the traceback goes to the ``statefun.sdk._serve`` logger
====  ==========================================================================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Coroutine
from typing import Any

from statefun._exceptions import (
    InvalidValueError,
    MalformedRequestError,
    UnknownFunctionError,
    ValueDecodeError,
)
from statefun._http.server import Reply, Request, media_type, plain
from statefun.sdk._functions import StatefulFunctions
from statefun.sdk._handler import RequestReplyHandler
from statefun.sdk._proto import request_reply_pb2 as pb

__all__ = ["CONTENT_TYPE", "DEFAULT_MAX_BODY_BYTES", "HEALTH_PATH", "Endpoint", "Reply"]

# Errors are logged under the serving module's name, whichever server answered.
log = logging.getLogger("statefun.sdk._serve")

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
HEALTH_PATH = "/health"
CONTENT_TYPE = "application/octet-stream"


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


def as_handler(functions_or_handler: object) -> RequestReplyHandler:
    if isinstance(functions_or_handler, RequestReplyHandler):
        return functions_or_handler
    if isinstance(functions_or_handler, StatefulFunctions):
        return RequestReplyHandler(functions_or_handler)
    raise TypeError(
        "expected a StatefulFunctions or a RequestReplyHandler, "
        f"got {type(functions_or_handler).__name__}"
    )


class Endpoint:
    """The function path and the health path of one server, checked at construction."""

    def __init__(
        self,
        functions_or_handler: StatefulFunctions | RequestReplyHandler,
        path: str = "/statefun",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.handler = as_handler(functions_or_handler)
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"the path must start with '/', got {path!r}")
        if path == HEALTH_PATH:
            raise ValueError(f"the path {HEALTH_PATH!r} is taken by the health check")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
            raise TypeError("max_body_bytes must be an int")
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.path = path
        self.max_body_bytes = max_body_bytes

    def typenames(self) -> list[str]:
        return sorted(self.handler.functions.typenames())

    # -- the built-in server's Application ------------------------------------------------

    def check(self, request: Request) -> Reply | None:
        # the server itself refuses a body over max_body_bytes
        return self.refusal(request.method, request.path, request.content_type, None)

    def handle(self, request: Request, body: bytes) -> Reply | Coroutine[Any, Any, Reply]:
        # ``check`` let through only POSTs to the function path and GET/HEAD of the health.
        return self.invoke(body) if request.path == self.path else self.health()

    # -- both servers ---------------------------------------------------------------------

    def refusal(
        self, method: str, path: str, content_type: str | None, length: int | None
    ) -> Reply | None:
        """The error reply to a request, known before its body is read (404, 405, 413, 415),
        or None: read the body and ``invoke`` (function path) or answer ``health``."""
        if path == self.path:
            if method != "POST":
                return plain(
                    405,
                    f"method {method} is not allowed on {self.path}; use POST",
                    (("Allow", "POST"),),
                )
            if (
                content_type is not None
                and content_type != CONTENT_TYPE  # what the runtime sends: no parsing
                and media_type(content_type) != CONTENT_TYPE
            ):
                return plain(415, f"unsupported Content-Type {content_type!r}; send {CONTENT_TYPE}")
            if length is not None and length > self.max_body_bytes:
                return self.too_large(length)
            return None
        if path == HEALTH_PATH:
            if method not in ("GET", "HEAD"):
                return plain(
                    405, f"method {method} is not allowed on {path}; use GET", (("Allow", "GET"),)
                )
            return None
        return plain(404, f"no such path {path!r}; functions are served at {self.path}")

    def health(self) -> Reply:
        body = json.dumps({"status": "ok", "functions": self.typenames()}).encode()
        return Reply(200, "application/json", body)

    def too_large(self, length: int | None) -> Reply:
        size = f"{length} bytes" if length is not None else "the body"
        reason = f"request body too large: {size} exceeds the limit of {self.max_body_bytes} bytes"
        log.warning("rejected request on %s: %s", self.path, reason)
        return plain(413, reason)

    def invoke(self, body: bytes) -> Reply | Coroutine[Any, Any, Reply]:
        """The reply to a ToFunction; a coroutine to await when the function is async."""
        try:
            outcome = self.handler.begin(body)
        except Exception as exc:
            return self._failed(body, exc)
        if isinstance(outcome, bytes):
            return Reply(200, CONTENT_TYPE, outcome)
        return self._finish_async(body, outcome)

    async def invoke_async(self, body: bytes) -> Reply:
        reply = self.invoke(body)
        return reply if isinstance(reply, Reply) else await reply

    async def _finish_async(self, body: bytes, outcome: Coroutine[Any, Any, bytes]) -> Reply:
        try:
            return Reply(200, CONTENT_TYPE, await outcome)
        except Exception as exc:
            return self._failed(body, exc)

    def _failed(self, body: bytes, exc: Exception) -> Reply:
        # A message whose value is no valid value of its own type is answered as a failure
        # of the function named InvalidValueError: the runtime sends that message to the
        # dead letters (a 400 would fail the whole batch as a bad request).
        if isinstance(exc, MalformedRequestError | ValueDecodeError) and not isinstance(
            exc, InvalidValueError
        ):
            log.warning("bad request on %s: %s", self.path, exc)
            return plain(400, str(exc))
        if isinstance(exc, UnknownFunctionError):
            log.warning("request on %s: %s", self.path, exc)
            return plain(404, str(exc))
        typename = _target_typename(body)
        log.error("function %s failed", typename, exc_info=exc)
        return plain(500, f"function {typename} failed: {_describe(exc)}")
