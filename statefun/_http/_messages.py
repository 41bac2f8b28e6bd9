"""What the built-in HTTP/1.1 server (``server.py``) reads and writes: a request's head
parsed (``parse_head``), a reply encoded (``encode_reply``), and the ``Application`` it serves."""

from __future__ import annotations

import time
from collections.abc import Coroutine
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, NamedTuple, Protocol

__all__ = [
    "Application",
    "BadRequest",
    "Date",
    "Reply",
    "Request",
    "encode_reply",
    "media_type",
    "parse_head",
    "plain",
]

_REASONS = {status.value: status.phrase for status in HTTPStatus}
_REASONS[413] = "Content Too Large"  # RFC 9110's name (Python 3.11 has the older one)
_REASONS[421] = "Misdirected Request"


class Reply(NamedTuple):
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


_MAX_REASON = 500  # characters of an error message kept in a reply


def plain(status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    """A text/plain reply of one line (whitespace folded, shortened to a sane length)."""
    line = " ".join(reason.split())
    if len(line) > _MAX_REASON:
        line = line[: _MAX_REASON - 3] + "..."
    return Reply(status, "text/plain", (line + "\n").encode("utf-8"), headers)


class Request:
    """The head of one request: method, path, query string and headers (names lowercased)."""

    __slots__ = (
        "chunked",
        "content_type",
        "expect",
        "headers",
        "keep_alive",
        "length",
        "method",
        "path",
        "query",
        "state",
    )

    def __init__(self) -> None:
        self.method = ""
        self.path = ""
        self.query = ""
        self.headers: dict[str, str] = {}
        self.content_type: str | None = None
        self.length: int | None = None
        self.chunked = False
        self.keep_alive = True
        self.expect = False
        #: what the application's ``check`` found out, for its ``handle`` (a parsed route)
        self.state: Any = None


class Application(Protocol):
    """What the server serves: one object answers every request."""

    max_body_bytes: int

    def check(self, request: Request) -> Reply | None:
        """A reply refusing ``request`` before its body is read (a 4xx), or None. (Bodies
        over ``max_body_bytes`` the server refuses itself, with ``too_large``.)"""

    def handle(self, request: Request, body: bytes) -> Reply | Coroutine[Any, Any, Reply]:
        """The reply, or a coroutine giving it (the connection waits, in order)."""

    def too_large(self, length: int | None) -> Reply:
        """The 413 for a body over ``max_body_bytes`` (``length`` when it is known)."""


def media_type(content_type: str) -> str:
    """``text/plain`` of ``Text/Plain; charset=utf-8``."""
    return content_type.split(";", 1)[0].strip().lower()


class BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Date:
    """The Date header, formatted once per second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second = second
            cls.value = formatdate(second, usegmt=True).encode("ascii")
        return cls.value


def encode_reply(reply: Reply, keep_alive: bool, head_only: bool = False) -> bytes:
    status, content_type, body, headers = reply
    lines = [
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n"
        % (
            status,
            _REASONS.get(status, "Unknown").encode(),
            content_type.encode(),
            len(body),
            Date.now(),
        )
    ]
    for name, value in headers:
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    if not head_only:
        lines.append(body)
    return b"".join(lines)


def parse_head(head: bytes) -> Request:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest(400, f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    request = Request()
    request.method = parts[0].decode("latin-1")
    target = parts[1].decode("latin-1")
    request.path, _, request.query = target.partition("?")
    request.keep_alive = parts[2] == b"HTTP/1.1"
    headers = request.headers
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, f"not a header line: {line[:80]!r}")
        name = name.lower()
        value = value.strip()
        headers[name.decode("latin-1")] = value.decode("latin-1")
        if name == b"content-length":
            if not value.isdigit() or (request.length is not None and int(value) != request.length):
                raise BadRequest(400, f"bad Content-Length {value[:40]!r}")
            request.length = int(value)
        elif name == b"transfer-encoding":
            if value.lower() != b"chunked":
                raise BadRequest(400, f"unsupported Transfer-Encoding {value[:40]!r}")
            request.chunked = True
        elif name == b"content-type":
            request.content_type = value.decode("latin-1")
        elif name == b"connection":
            token = value.lower()
            if token == b"close":
                request.keep_alive = False
            elif token == b"keep-alive":
                request.keep_alive = True
        elif name == b"expect" and value.lower() == b"100-continue":
            request.expect = True
    if request.chunked and request.length is not None:
        raise BadRequest(400, "both Content-Length and Transfer-Encoding")
    return request
