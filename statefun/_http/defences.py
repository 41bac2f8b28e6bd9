"""What the built-in HTTP server defends itself with: time limits, connection caps, the
``Host`` allow-list, a bearer token and TLS (see docs/architecture.md, "HTTP server defences").

``ServerOptions`` holds them for one server; ``HttpServer`` (``server.py``) applies them. The
helpers here build them from settings, files and environment variables, each failing with a
one-line ``ValueError`` that names what is wrong.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "LOOPBACK_HOSTS",
    "HostCheck",
    "ServerOptions",
    "is_loopback",
    "read_token",
    "server_tls_context",
    "token_matches",
    "warn_if_exposed",
]

log = logging.getLogger(__name__)

#: the ``Host`` names a server bound to a loopback address accepts unless told otherwise
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class ServerOptions:
    """The limits and guards of one ``HttpServer``. Times in seconds."""

    #: a request head must be complete this long after it started (a new connection: after
    #: the connect; a kept-alive one: after its first byte). Trickled bytes do not extend it.
    head_timeout: float = 10.0
    #: a request body may take this long plus one second per ``min_body_rate`` bytes received
    body_timeout: float = 10.0
    min_body_rate: int = 1024
    #: an idle kept-alive connection is closed after this long
    keepalive_timeout: float = 75.0
    max_connections: int = 1024
    max_connections_per_client: int = 512
    #: ``Host`` names accepted (any port); None: loopback names when bound to a loopback
    #: address, any name otherwise; ``"*"`` in the tuple: any name
    allowed_hosts: tuple[str, ...] | None = None
    #: a bearer token every request except ``GET /health`` must carry (never logged)
    token: str | None = field(default=None, repr=False)
    tls: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        for name in ("head_timeout", "body_timeout", "keepalive_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0, got {getattr(self, name)}")
        for name in ("min_body_rate", "max_connections", "max_connections_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.token is not None and not _token_ok(self.token):
            raise ValueError("the bearer token must be visible ASCII without spaces")

    def with_(self, **changes: Any) -> ServerOptions:
        """A copy with some fields changed (None values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_settings(cls, settings: Any, **changes: Any) -> ServerOptions:
        """The options the ``http_*`` settings give (``statefun._settings.Settings``)."""
        hosts = tuple(h.strip() for h in settings.http_allowed_hosts.split(",") if h.strip())
        return cls(
            head_timeout=settings.http_head_timeout_ms / 1000,
            body_timeout=settings.http_body_timeout_ms / 1000,
            min_body_rate=settings.http_min_body_rate,
            keepalive_timeout=settings.http_keepalive_timeout_ms / 1000,
            max_connections=settings.http_max_connections,
            max_connections_per_client=settings.http_max_connections_per_client,
            allowed_hosts=hosts or None,
        ).with_(**changes)


def _token_ok(token: str) -> bool:
    return bool(token) and all(33 <= ord(c) <= 126 for c in token)


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (constant time)."""
    if authorization is None:
        return False
    scheme, _, given = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8"), token.encode("utf-8"))


def read_token(env: str | None = None, file: str | Path | None = None, *, where: str) -> str:
    """A token from the environment variable ``env`` or the file ``file`` (one of them)."""
    if (env is None) == (file is None):
        raise ValueError(f"{where}: give the token's environment variable or its file (one)")
    if env is not None:
        token = os.environ.get(env, "").strip()
        if not token:
            raise ValueError(f"{where}: environment variable {env} is not set or empty")
    else:
        try:
            token = Path(file).read_text(encoding="utf-8").strip()  # type: ignore[arg-type]
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise ValueError(f"{where}: cannot read token file {str(file)!r}: {reason}") from None
        if not token:
            raise ValueError(f"{where}: token file {str(file)!r} is empty")
    if not _token_ok(token):
        raise ValueError(f"{where}: the token must be visible ASCII without spaces")
    return token


def server_tls_context(
    cert: str | Path, key: str | Path, client_ca: str | Path | None = None, *, where: str
) -> ssl.SSLContext:
    """A server-side TLS context: ``cert``/``key`` (PEM files); with ``client_ca``, clients
    must present a certificate signed by a CA in that file."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"{where}: certificate {str(cert)!r} / key {str(key)!r}: {exc}") from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=str(client_ca))
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{where}: client CA file {str(client_ca)!r}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on loopback only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_exposed(what: str, host: str, *, tls: bool, token: bool) -> None:
    """One WARNING when a server listens beyond loopback without TLS or without a token."""
    if is_loopback(host) or (tls and token):
        return
    missing = " and ".join(n for n, on in (("TLS", tls), ("a bearer token", token)) if not on)
    log.warning(
        "%s listens on %s, beyond this machine, without %s: anyone who can reach it can use it",
        what,
        host,
        missing,
    )


def _host_name(value: str) -> str:
    """``example.com`` of ``Example.COM:8080``; ``[::1]`` of ``[::1]:80``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    name, sep, port = value.rpartition(":")
    return name if sep and port.isdigit() else value


class HostCheck:
    """The ``Host`` allow-list of one server (DNS rebinding defence)."""

    def __init__(self, allowed: tuple[str, ...] | None, bind_host: str) -> None:
        if allowed is None:
            allowed = LOOPBACK_HOSTS if is_loopback(bind_host) else ("*",)
        self.any = "*" in allowed
        self.names = frozenset(_host_name(name) for name in allowed)
        self.shown = ", ".join(sorted(self.names))
        #: Host header values seen and accepted (a few: clients repeat theirs)
        self.accepted: set[str] = set()

    def refusal(self, host: str | None) -> str | None:
        """Why a request with this ``Host`` header is refused, or None. A request without
        one (HTTP/1.0) passes: browsers always send it."""
        if self.any or host is None:
            return None
        if _host_name(host) in self.names:
            if len(self.accepted) < 64:
                self.accepted.add(host)
            return None
        return f"Host {host[:80]!r} is not served here; accepted: {self.shown}"
