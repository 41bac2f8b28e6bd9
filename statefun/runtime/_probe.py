"""One probe of each remote endpoint at job start: a server that is not up is reported early.

Each distinct origin (scheme, host, port, or the Unix socket) of the module's
``io.statefun.endpoints.v2/http`` endpoints gets one TCP connect (no request, no TLS
handshake), all of them at once, each bounded by ``remote_probe_timeout_ms``. An origin that
cannot be reached is one WARNING line naming its endpoints' function types, their URLs and
the error. Nothing else happens: the job runs, and its calls retry while the server is down
(it may come up later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from statefun._http.client import parse_target
from statefun.module._specs import EndpointSpec, HttpEndpointSpec

__all__ = ["probe_endpoints"]

log = logging.getLogger(__name__)


def _origins(
    endpoints: Sequence[EndpointSpec],
) -> dict[tuple[str, str, int | str], list[HttpEndpointSpec]]:
    """The HTTP endpoints per origin; URLs that cannot be parsed are left to the calls to
    report."""
    origins: dict[tuple[str, str, int | str], list[HttpEndpointSpec]] = {}
    for endpoint in endpoints:
        if not isinstance(endpoint, HttpEndpointSpec):
            continue
        try:
            origin = parse_target(endpoint.url_path_template).origin
        except ValueError:
            continue
        origins.setdefault(origin, []).append(endpoint)
    return origins


async def _connect(origin: tuple[str, str, int | str], timeout: float) -> str | None:
    """None if a TCP (or Unix socket) connection opens within ``timeout``, else the error."""
    _, host, port = origin
    try:
        async with asyncio.timeout(timeout):
            if isinstance(port, str):
                _, writer = await asyncio.open_unix_connection(port)
            else:
                _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"no connection within {timeout:g} s"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def probe_endpoints(endpoints: Sequence[EndpointSpec], timeout: float) -> int:
    """Probe every origin of the HTTP ``endpoints`` at once; how many could not be reached (each is
    logged in one WARNING line)."""
    origins = _origins(endpoints)
    if not origins or timeout <= 0:
        return 0
    errors = await asyncio.gather(*(_connect(origin, timeout) for origin in origins))
    unreachable = 0
    for served, error in zip(origins.values(), errors, strict=True):
        if error is None:
            continue
        unreachable += 1
        log.warning(
            "remote functions %s: endpoint not reachable (%s); the job runs and retries its "
            "calls while it is down",
            ", ".join(f"{e.functions} at {e.url_path_template}" for e in served),
            error,
        )
    return unreachable
