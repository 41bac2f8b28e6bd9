"""A worker's admin port: the single-process admin server's views, for the key groups it owns.

A worker of a clustered job runs a new ``Job`` per assignment (``_worker.py``), but its admin
port stays open from start to stop: ``WorkerAdmin`` is the built-in HTTP server's application
and hands each request to an ``AdminServer`` (``runtime/_admin.py``, never started itself) built
for the job of the current assignment (``serve``); between two assignments (``pause``) only
``/status`` answers, the rest is 503 with ``Retry-After``. The counters of ``/metrics`` and
``/status`` count from the worker's start: at each new assignment the totals of the job before
(read then, after it stopped) are carried (``CumulativeMetrics``, ``CumulativeStatus``) and
added to the new job's, so no counter goes backwards at a rebalance; gauges are the current
job's.

* ``GET /status``: the job's status plus ``worker``: its id, the job, the group generation,
  the exchange partitions and key groups it owns, its input partitions, and ``rebalancing``.
* ``GET /state/<ns>/<type>/<id>`` and ``/addresses/<ns>/<type>/<id>/timeline`` for an address
  whose key group another worker owns: 421 (Misdirected Request) with JSON ``{"error",
  "key_group", "partition", "owner"}``, the owner read from the job's consumer group
  (``_status.group_ownership``, at most once a second); 503 with ``Retry-After`` while the
  group rebalances and no member owns it. Listing ids (``/state/<ns>/<type>``) lists the ids of
  this worker's key groups.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from statefun._http.defences import ServerOptions
from statefun._http.server import HttpServer, Reply, Request, plain
from statefun._keygroups import key_group_for
from statefun.cluster._config import ClusterConfig
from statefun.cluster._status import Ownership, group_ownership
from statefun.runtime._admin import AdminJob, AdminServer, listen, same_origin
from statefun.runtime._state_view import split_address
from statefun.runtime._status import CumulativeStatus

if TYPE_CHECKING:
    from statefun._settings import Settings
    from statefun.runtime._metrics import CumulativeMetrics

__all__ = ["WorkerAdmin", "address_of"]

log = logging.getLogger(__name__)

#: how long the group's ownership, once read from Kafka, answers lookups
_OWNERS_TTL_S = 1.0
_RETRY = (("Retry-After", "1"),)


def address_of(path: str) -> tuple[str, str] | None:
    """(typename, id) of a state or timeline path of one address, else None."""
    if path.startswith("/state/"):
        segments = path[len("/state/") :].split("/")
    elif path.startswith("/addresses/") and path.endswith("/timeline"):
        segments = path[len("/addresses/") : -len("/timeline")].split("/")
    else:
        return None
    address = split_address(segments)
    if address is None or address[1] is None:
        return None
    return address[0], address[1]


def _json(status: int, data: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, "application/json", json.dumps(data).encode(), headers)


class WorkerAdmin:
    """The admin port of one worker (see the module docstring)."""

    max_body_bytes = AdminServer.max_body_bytes

    def __init__(
        self,
        settings: Settings,
        config: ClusterConfig,
        owners: Callable[[], tuple[str, list[Ownership]]] | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        self.host = settings.admin_host
        self.port = settings.admin_port
        self._owners = owners or (lambda: group_ownership(config))
        self._options = ServerOptions.from_settings(settings, token=settings.admin_token or None)
        self._server: HttpServer | None = None
        self._current: AdminServer | None = None
        #: the job of the assignment before (revoked): its counters, carried at the next
        self._previous: AdminServer | None = None
        self._status = CumulativeStatus()
        self._metrics = _cumulative_metrics() if settings.metrics else None
        self._key_groups: frozenset[int] = frozenset()
        self._partitions: list[int] = []
        self._inputs: list[tuple[str, int]] = []
        self._generation = -1
        self._read: tuple[float, str, list[Ownership]] | None = None

    async def start(self) -> None:
        self._server, self.port = await listen(self, self.host, self.port, self._options)
        log.info(
            "admin server of worker %s on http://%s:%d", self.config.worker_id, self.host, self.port
        )

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close(2.0)
            self._server = None

    def serve(
        self, job: AdminJob, partitions: list[int], inputs: list[tuple[str, int]], generation: int
    ) -> None:
        """The job of a new assignment answers from now on (the counters of the one before
        are carried)."""
        previous = self._current or self._previous
        if previous is not None:
            self._status.fold(previous.status())
        self._previous = None
        self._current = AdminServer(job, self.port, self.host)
        if self._metrics is not None:
            self._metrics.serve(job)
        self._partitions = sorted(partitions)
        self._key_groups = frozenset(kg for p in partitions for kg in self.config.key_groups_of(p))
        self._inputs = sorted(inputs)
        self._generation = generation
        self._read = None

    def pause(self) -> None:
        """The assignment is revoked: no job answers until the next one."""
        self._previous = self._current or self._previous
        self._current = None
        self._partitions, self._key_groups, self._inputs = [], frozenset(), []
        self._read = None

    @property
    def url(self) -> str:
        """Where other machines reach this admin server (published with the group membership):
        a wildcard ``admin_host`` is replaced by the machine's name."""
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def worker_status(self) -> dict[str, Any]:
        return {
            "id": self.config.worker_id,
            "admin_url": self.url,
            "job": self.config.job_id,
            "generation": self._generation,
            "rebalancing": self._current is None,
            "partitions": self._partitions,
            "key_groups": sorted(self._key_groups),
            "max_parallelism": self.config.max_parallelism,
            "input_partitions": [[t, p] for t, p in self._inputs],
        }

    # -- the built-in server's Application ------------------------------------------------

    def too_large(self, length: int | None) -> Reply:
        return plain(413, f"the admin server takes bodies of at most {self.max_body_bytes} bytes")

    def check(self, request: Request) -> Reply | None:
        current = self._current
        if current is not None:
            return current.check(request)
        origin = request.headers.get("origin")
        if origin is not None and not same_origin(origin, self.host, self.port):
            return plain(403, f"cross-site request refused (Origin {origin[:80]!r})")
        if request.path == "/status":
            return None if request.method in ("GET", "HEAD") else plain(405, "use GET on /status")
        return plain(503, "the worker's key groups are being reassigned; try again", _RETRY)

    def handle(self, request: Request, body: bytes) -> Reply | Coroutine[Any, Any, Reply]:
        current = self._current
        if request.path == "/status":
            shown = current or self._previous
            status = self._status.added(shown.status() if shown is not None else {})
            if current is None:  # between assignments: the counters only
                status = {k: v for k, v in status.items() if k in _COUNTED}
            return _json(200, {**status, "worker": self.worker_status()}, _NO_STORE)
        if current is None:
            return plain(503, "the worker's key groups are being reassigned; try again", _RETRY)
        if request.path == "/metrics" and self._metrics is not None:
            return Reply(200, _METRICS_TYPE, self._metrics.exposition(), _NO_STORE)
        address = address_of(request.path)
        if address is not None:
            key_group = key_group_for(*address, self.config.max_parallelism)
            if key_group not in self._key_groups:
                return self._elsewhere(key_group)
        return current.handle(request, body)

    async def _elsewhere(self, key_group: int) -> Reply:
        """The reply for an address of a key group this worker does not own."""
        partition = self.config.partition_of(key_group)
        state, owners = await self._ownership()
        found = next((o for o in owners if partition in o.partitions), None)
        owner = found.worker if found is not None else None
        answer = {
            "key_group": key_group,
            "partition": partition,
            "owner": owner,
            "admin_url": found.admin_url or None if found is not None else None,
        }
        if owner is None or owner == self.config.worker_id:
            answer["error"] = f"key group {key_group} has no owner now (group {state}): try again"
            return _json(503, answer, _RETRY)
        answer["error"] = f"key group {key_group} is owned by worker {owner}: ask its admin port"
        return _json(421, answer)

    async def _ownership(self) -> tuple[str, list[Ownership]]:
        read = self._read
        now = time.monotonic()
        if read is None or now - read[0] > _OWNERS_TTL_S:
            try:
                state, owners = await asyncio.to_thread(self._owners)
            except Exception as exc:  # the caller learns why; the worker goes on
                log.warning("admin server: the group's ownership could not be read: %s", exc)
                return "unknown", []
            read = self._read = (now, state, owners)
        return read[1], read[2]


_NO_STORE = (("Cache-Control", "no-store"),)
#: what /status shows between two assignments: the counters, carried
_COUNTED = ("invocations", "dead_letters", "functions", "ingresses", "egresses", "endpoints")
#: the content type of /metrics (Prometheus's text format 0.0.4)
_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _cumulative_metrics() -> CumulativeMetrics:
    from statefun.runtime._metrics import CumulativeMetrics  # (prometheus_client: when on)

    return CumulativeMetrics()
