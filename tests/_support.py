"""Small helpers shared by the test tiers."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from statefun._testing.ports import free_port as free_port
from statefun._testing.ports import free_ports as free_ports


class EmitMany:
    """``IngressContext.emit_many`` for a test's context, from its ``has_room`` and ``emit``."""

    def has_room(self) -> bool:
        raise NotImplementedError

    def emit(self, typename: str, id_: str, value: Any, caller: Any = None) -> None:
        raise NotImplementedError

    def emit_many(self, typename: str, messages: Sequence[tuple[str, Any]], start: int = 0) -> int:
        for index in range(start, len(messages)):
            if not self.has_room():
                return index
            self.emit(typename, *messages[index])
        return len(messages)


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


@contextlib.contextmanager
def serve_functions(functions_file: Path, cwd: Path) -> Iterator[str]:
    """`statefun serve` of ``functions_file`` in its own process; yields the function URL."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "statefun",
            "serve",
            f"{functions_file}:functions",
            "--port",
            str(port),
        ],
        cwd=cwd,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "function server did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/statefun"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
