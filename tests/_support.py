"""Small helpers shared by the test tiers."""

from __future__ import annotations

import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoint_yaml(functions_file: Path, remote_url: str | None, namespace: str = "model") -> str:
    """A module.yaml document serving ``namespace/*``: remote at ``remote_url``, or embedded."""
    if remote_url:
        return (
            "kind: io.statefun.endpoints.v2/http\n"
            f"spec:\n  functions: {namespace}/*\n  urlPathTemplate: {remote_url}\n"
        )
    return (
        "kind: io.pystatefun.endpoints.v1/embedded\n"
        f"spec:\n  functions: {namespace}/*\n  module: {functions_file}:functions\n"
    )
