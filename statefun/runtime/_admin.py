"""The admin HTTP server of a running job (127.0.0.1 only): status and savepoints.

* ``GET /status``: JSON with messages in flight, invocations, checkpoints (how many, the last
  one's duration and CPU time, the longest stall).
* ``POST /savepoints``: take a savepoint now; JSON ``{"id": ..., "path": ...}``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from statefun._exceptions import UnavailableError
from statefun._oserrors import listen_error

if TYPE_CHECKING:
    from statefun.runtime._job import Job

__all__ = ["AdminServer"]

log = logging.getLogger(__name__)


class AdminServer:
    def __init__(self, job: Job, port: int, host: str = "127.0.0.1") -> None:
        self.job = job
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=1024)
        app.router.add_get("/status", self._status)
        app.router.add_post("/savepoints", self._savepoint)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise UnavailableError(
                f"admin server: {listen_error(self.host, self.port, exc)}"
            ) from exc
        if self.port == 0 and self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])
        log.info(
            "admin server on http://%s:%d (GET /status, POST /savepoints)", self.host, self.port
        )

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def status(self) -> dict[str, Any]:
        job = self.job
        checkpoints = job.checkpoints
        return {
            "messages_in_flight": job.pending,
            "remote_messages_in_flight": job.pending_remote,
            "invocations": sum(d.invocations for d in job.dispatchers),
            "delayed_messages": len(job.timers),
            "dead_letters": job.dead_letters,
            "parallelism": len(job.dispatchers),
            "checkpoints": None
            if checkpoints is None
            else {
                "completed": checkpoints.completed,
                "last": None if checkpoints.last is None else str(checkpoints.last.path),
                "last_duration_ms": round(checkpoints.last_duration_ms, 2),
                "last_cpu_ms": round(checkpoints.last_cpu_ms, 2),
                "max_stall_ms": round(checkpoints.max_stall_ms, 3),
            },
        }

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def _savepoint(self, request: web.Request) -> web.Response:
        if self.job.checkpoints is None:
            return web.Response(
                status=409, text="checkpoints are off: set checkpoint_dir to take savepoints\n"
            )
        savepoint = await self.job.checkpoints.checkpoint(savepoint=True)
        return web.json_response({"id": savepoint.id, "path": str(savepoint.path)})
