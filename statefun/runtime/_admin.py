"""The admin HTTP server of a running job: status, metrics and savepoints.

* ``GET /status``: JSON with messages in flight, invocations, checkpoints (how many, the last
  one's duration and CPU time, the longest stall), and per part (``_status.py``): functions,
  ingresses, egresses, remote endpoints, the last checkpoints, dead letters.
* ``GET /metrics``: Prometheus text (``_metrics.py``; 404 with the setting ``metrics`` off).
* ``POST /savepoints``: take a savepoint now; JSON ``{"id": ..., "path": ...}``.
* ``GET /`` (the console), ``/plan``, ``/state/...``, ``/addresses/.../timeline``: the
  read-only views of ``_console.py``.

It runs on the built-in HTTP server (``statefun._http.server``), with its defences (request
deadlines, connection caps, the ``Host`` allow-list against DNS rebinding), and refuses what a
web page in a browser could send it: a request with an ``Origin`` other than the server's own
(403) and a POST with a body that is not ``application/json`` (415; a POST without a body, as
``statefun savepoint create`` sends, is fine). Savepoints are rate-limited: one at a time and
at most one per ``admin_savepoint_min_interval_ms`` (429 with ``Retry-After``).

It binds ``admin_host`` (127.0.0.1 by default). With ``admin_token`` set, every request must
carry ``Authorization: Bearer <token>`` (the built-in server checks it, in constant time);
binding beyond loopback without one is refused by the settings unless ``admin_insecure``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from statefun._exceptions import UnavailableError
from statefun._http.defences import LOOPBACK_HOSTS, ServerOptions
from statefun._http.server import Application, HttpServer, Reply, Request, media_type, plain
from statefun._oserrors import listen_error
from statefun.runtime._console import AdminViews, ConsoleJob
from statefun.runtime._status import ObservedJob, status_details

if TYPE_CHECKING:
    from statefun._settings import Settings
    from statefun.checkpoint.coordinator import CheckpointCoordinator

__all__ = ["AdminJob", "AdminServer", "listen", "same_origin"]

log = logging.getLogger(__name__)

_ROUTES = {"/status": "GET", "/savepoints": "POST", "/metrics": "GET"}


class AdminJob(ObservedJob, ConsoleJob, Protocol):
    """What the admin server needs of the job (``runtime/_job.py``'s ``Job``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def checkpoints(self) -> CheckpointCoordinator | None: ...
    def counters(self) -> dict[str, int]:
        """Messages in flight (all, to remote functions), invocations, delayed messages,
        dead letters, dispatcher subtasks."""
        ...


async def listen(
    app: Application, host: str, port: int, options: ServerOptions
) -> tuple[HttpServer, int]:
    """An admin server serving ``app`` on ``host:port``, started; and the port it took.
    A port it cannot take is a one-line UnavailableError."""
    server = HttpServer(app, options=options, name="admin server")
    try:
        return server, await server.start(host, port)
    except OSError as exc:
        raise UnavailableError(f"admin server: {listen_error(host, port, exc)}") from exc


def same_origin(origin: str, host: str, port: int) -> bool:
    """Whether a request's ``Origin`` is the admin server's own (``http://host:port``)."""
    parts = urlsplit(origin.strip().lower())
    try:
        origin_port = parts.port
    except ValueError:
        return False
    name = parts.netloc.rpartition(":")[0] if origin_port is not None else parts.netloc
    return (
        parts.scheme == "http" and origin_port == port and name in {*LOOPBACK_HOSTS, host.lower()}
    )


def _job_metrics(job: AdminJob) -> Any:
    from statefun.runtime._metrics import JobMetrics  # (prometheus_client: only when on)

    return JobMetrics(job)


_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class AdminServer:
    max_body_bytes = 1024

    def __init__(self, job: AdminJob, port: int, host: str = "127.0.0.1") -> None:
        self.job = job
        self.host = host
        self.port = port
        self.savepoints_refused = 0
        self._server: HttpServer | None = None
        self._savepoint_running = False
        self._last_savepoint = -math.inf  # monotonic time the last savepoint started
        settings = job.settings
        self._min_interval = settings.admin_savepoint_min_interval_ms / 1000
        self._options = ServerOptions.from_settings(settings, token=settings.admin_token or None)
        self.metrics = _job_metrics(job) if settings.metrics else None
        self.views = AdminViews(job)

    async def start(self) -> None:
        self._server, self.port = await listen(self, self.host, self.port, self._options)
        log.info(
            "admin server on http://%s:%d (console at /; GET /status, /metrics, /state; "
            "POST /savepoints)%s",
            self.host,
            self.port,
            " (bearer token required)" if self._options.token else "",
        )

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close(2.0)
            self._server = None

    def status(self) -> dict[str, Any]:
        job = self.job
        checkpoints = job.checkpoints
        return {
            **job.counters(),
            "checkpoints": None
            if checkpoints is None
            else {
                "completed": checkpoints.completed,
                "last": None if checkpoints.last is None else str(checkpoints.last.path),
                "last_duration_ms": round(checkpoints.last_duration_ms, 2),
                "last_cpu_ms": round(checkpoints.last_cpu_ms, 2),
                "max_stall_ms": round(checkpoints.max_stall_ms, 3),
            },
            **status_details(job),
        }

    # -- the built-in server's Application --------------------------------------------------

    def too_large(self, length: int | None) -> Reply:
        return plain(413, f"the admin server takes bodies of at most {self.max_body_bytes} bytes")

    def check(self, request: Request) -> Reply | None:
        method = _ROUTES.get(request.path) or self.views.method(request.path)
        if method is None:
            return plain(404, f"no such path {request.path[:100]!r}; try /, /status or /state")
        origin = request.headers.get("origin")
        if origin is not None and not self._own_origin(origin):
            return plain(403, f"cross-site request refused (Origin {origin[:80]!r})")
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            return plain(405, f"use {method} on {request.path}", (("Allow", method),))
        has_body = request.content_type or request.length or request.chunked
        if (
            method == "POST"
            and has_body
            and media_type(request.content_type or "") != ("application/json")
        ):
            return plain(415, "send no body, or an application/json one")
        return None

    def _own_origin(self, origin: str) -> bool:
        return same_origin(origin, self.host, self.port)

    def handle(self, request: Request, body: bytes) -> Reply | Coroutine[Any, Any, Reply]:
        if request.path == "/status":
            return Reply(200, "application/json", json.dumps(self.status()).encode())
        if request.path == "/metrics":
            if self.metrics is None:
                return plain(404, "metrics are off (setting metrics)")
            return Reply(200, _METRICS_TYPE, self.metrics.exposition())
        if request.path == "/savepoints":
            return self._savepoint()
        return self.views.handle(request)

    async def _savepoint(self) -> Reply:
        checkpoints = self.job.checkpoints
        if checkpoints is None:
            return plain(409, "checkpoints are off: set checkpoint_dir to take savepoints")
        wait = self._min_interval - (time.monotonic() - self._last_savepoint)
        if self._savepoint_running or wait > 0:
            self.savepoints_refused += 1
            why = "a savepoint is being taken" if self._savepoint_running else "one was just taken"
            retry = max(1, math.ceil(wait))
            return plain(
                429,
                f"{why}; at most one per {self._min_interval:g}s "
                "(setting admin_savepoint_min_interval_ms)",
                (("Retry-After", str(retry)),),
            )
        self._savepoint_running = True
        self._last_savepoint = time.monotonic()
        try:
            savepoint = await checkpoints.checkpoint(savepoint=True)
        except Exception as exc:  # the caller gets the reason; the job goes on
            log.warning("savepoint failed: %s", exc)
            return plain(500, f"savepoint failed: {exc}")
        finally:
            self._savepoint_running = False
        body = json.dumps({"id": savepoint.id, "path": str(savepoint.path)}).encode()
        return Reply(200, "application/json", body)
