"""The security fields of HTTP components in module.yaml: the HTTP ingress's ``allowedHosts``,
``auth`` and ``tls``, and the headers an HTTP endpoint sends (see docs/module-yaml.md).

Secrets are never written into a module file: a token comes from an environment variable or
a file, and an endpoint header's value may name environment variables as ``${NAME}``, which
are substituted when the module is loaded (an unset one is an error).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statefun._http.defences import read_token, server_tls_context

if TYPE_CHECKING:
    from statefun.module._fields import Fields

__all__ = ["endpoint_headers", "ingress_allowed_hosts", "ingress_tls", "ingress_token"]

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: headers the client writes itself
_RESERVED = frozenset(
    ("host", "content-length", "content-type", "transfer-encoding", "connection", "user-agent")
)


def ingress_allowed_hosts(spec: Fields) -> tuple[str, ...] | None:
    expected = "a list of host names, such as ['localhost', 'ingress.example.com']"
    value = spec.sequence("allowedHosts", expected, None)
    if value is None:
        return None
    if not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise spec.fail("allowedHosts", f"expected {expected}, got {value!r}")
    return tuple(v.strip() for v in value)


def ingress_token(spec: Fields) -> str | None:
    """``auth: {tokenEnv: NAME}`` or ``auth: {tokenFile: path}``: the bearer token."""
    auth = spec.mapping("auth", None)
    if auth is None:
        return None
    env = auth.string("tokenEnv", "an environment variable's name", None)
    file = auth.string("tokenFile", "a file path", None)
    auth.done()
    if env is not None and not _ENV_NAME.fullmatch(env):
        raise auth.fail("tokenEnv", f"expected an environment variable's name, got {env!r}")
    try:
        return read_token(env, _path(auth.doc.base_dir, file), where="auth")
    except ValueError as exc:
        raise spec.doc.error(spec.at("auth"), str(exc).removeprefix("auth: ")) from None


def ingress_tls(spec: Fields) -> tuple[Path, Path, Path | None] | None:
    """``tls: {certFile, keyFile, clientCaFile?}``: PEM files, checked by loading them."""
    tls = spec.mapping("tls", None)
    if tls is None:
        return None
    base = tls.doc.base_dir
    cert = _path(base, tls.string("certFile", "a PEM file path"))
    key = _path(base, tls.string("keyFile", "a PEM file path"))
    client_ca = _path(base, tls.string("clientCaFile", "a PEM file path", None))
    tls.done()
    assert cert is not None and key is not None
    try:
        server_tls_context(cert, key, client_ca, where="tls")
    except ValueError as exc:
        raise tls.doc.error(spec.at("tls"), str(exc).removeprefix("tls: ")) from None
    return cert, key, client_ca


def endpoint_headers(spec: Fields) -> tuple[tuple[str, str], ...]:
    """``headers: {Name: value}``; ``${NAME}`` in a value is the environment variable's."""
    headers = spec.raw("headers", "a mapping of header names to values", None)
    if headers is None:
        return ()
    if not isinstance(headers, dict):
        raise spec.fail("headers", f"expected a mapping of header names to values, got {headers!r}")
    result: list[tuple[str, str]] = []
    for name, value in headers.items():
        where = spec.at(f"headers.{name}")
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise spec.doc.error(spec.at("headers"), f"not a header name: {name!r}")
        if name.lower() in _RESERVED:
            raise spec.doc.error(where, "the client sets this header itself")
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise spec.doc.error(where, f"expected a string, got {type(value).__name__}")
        text = _substitute(str(value), spec.doc.error, where)
        if any(c in text for c in "\r\n\0"):
            raise spec.doc.error(where, "the value has a line break or NUL (after substitution)")
        result.append((name, text))
    return tuple(result)


def _substitute(text: str, error: Any, where: str) -> str:
    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if not _ENV_NAME.fullmatch(name):
            raise error(where, f"${{{name}}}: not an environment variable's name")
        value = os.environ.get(name)
        if value is None:
            raise error(where, f"environment variable {name} (named by ${{{name}}}) is not set")
        return value

    return _VARIABLE.sub(variable, text)


def _path(base: Path, value: str | None) -> Path | None:
    return None if value is None else base / Path(value).expanduser()
