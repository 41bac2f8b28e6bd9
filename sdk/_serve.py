"""HTTP serving of a StatefulFunctions over aiohttp (being written; see issue 2)."""

from __future__ import annotations

from typing import Any


def serve(functions: Any, host: str = "127.0.0.1", port: int = 8000, path: str = "/statefun") -> None:
    raise NotImplementedError("serve() is not written yet")
