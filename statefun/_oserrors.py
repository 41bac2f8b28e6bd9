"""One-line descriptions of OS errors, for messages that also say what and where."""

from __future__ import annotations

import os
from pathlib import Path

from statefun._exceptions import ConfigurationError

__all__ = ["describe", "listen_error", "reason", "usable_directory"]


def reason(exc: OSError) -> str:
    """Why: ``address already in use``, ``file too large``, ``permission denied``..."""
    if exc.errno and exc.errno > 0:  # not asyncio's long text that repeats the address
        text = os.strerror(exc.errno)
    elif exc.strerror:  # a name that does not resolve (negative getaddrinfo codes)
        text = exc.strerror
    else:
        return " ".join(str(exc).split()) or type(exc).__name__
    return text[:1].lower() + text[1:]


def describe(exc: OSError) -> str:
    """One line: the message of one of the project's errors (it names what and where), else
    why and the file: ``file too large: chk/chk-000001/cut.msgpack``."""
    if not type(exc).__module__.startswith("statefun") and exc.errno:
        return f"{reason(exc)}: {exc.filename}" if exc.filename else reason(exc)
    return " ".join(str(exc).split())


def listen_error(host: str, port: int, exc: OSError) -> str:
    """``cannot listen on 127.0.0.1:8090: address already in use``."""
    return f"cannot listen on {host}:{port}: {reason(exc)}"


def usable_directory(what: str, path: Path) -> None:
    """Create folder ``path`` if need be and check that files can be written there; else a
    one-line ConfigurationError naming ``what`` (a setting), the path and why."""
    shown = f"{what} {str(path)!r}"
    if path.exists() and not path.is_dir():
        raise ConfigurationError(f"{shown} is not a directory (a file of that name exists)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"{shown} cannot be created: {reason(exc)}") from None
    probe = path / f".statefun-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigurationError(f"{shown} is not writable: {reason(exc)}") from None
