"""``statefun run --workers N``: N worker processes of one clustered job on this machine.

The supervisor checks the job once (settings, module, what runs clustered), starts N
``statefun worker`` processes with the same module and settings and the worker ids
``<cluster_worker_id or host name>-0`` .. ``-<N-1>`` (with ``admin_port`` P set, worker ``i``
serves its admin port on P + i; it serves each HTTP ingress on the ingress's port + i:
``cluster_port_offset``; one line per worker at start says where), and restarts a worker that
exits with an error or dies from a signal: after 1 s, doubling up to 30 s while it keeps dying
within 10 s of its start. SIGINT or SIGTERM stops every worker gracefully (SIGTERM, then
SIGKILL after 30 s). A worker that ends with exit code 0 (stopped by someone else) is not
restarted. The workers share nothing but the Kafka cluster, as on separate machines.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from statefun._exceptions import ConfigurationError
from statefun._settings import Settings
from statefun.cluster._config import cluster_config
from statefun.cluster._support import check_clusterable
from statefun.module._specs import HttpIngressSpec, ModuleSpec

__all__ = ["supervise", "worker_ids", "worker_ports"]

log = logging.getLogger("statefun.cli")

_FIRST_DELAY_S = 1.0
_MAX_DELAY_S = 30.0
_HEALTHY_S = 10.0
_STOP_TIMEOUT_S = 30.0


def worker_ids(base: str, count: int) -> list[str]:
    return [f"{base}-{index}" for index in range(count)]


@dataclass
class _Worker:
    id: str
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    delay: float = _FIRST_DELAY_S
    restart_at: float | None = None
    restarts: int = 0
    admin_port: int = 0
    index: int = 0


def supervise(
    module: ModuleSpec,
    settings: Settings,
    modules: Sequence[str],
    setting_pairs: Sequence[str],
    count: int,
) -> int:
    """Run ``count`` workers until SIGINT/SIGTERM; the exit code."""
    config = cluster_config(settings)
    if config is None:
        raise ConfigurationError(
            "--workers runs a clustered job: set cluster.bootstrap_servers and cluster.job_id "
            "(--set cluster.bootstrap_servers=HOST:PORT --set cluster.job_id=NAME)"
        )
    if count < 1:
        raise ConfigurationError(f"--workers must be at least 1, got {count}")
    check_clusterable(module, settings, from_savepoint=False, bootstrap=config.bootstrap_servers)
    workers = [
        _Worker(worker_id, index=index)
        for index, worker_id in enumerate(worker_ids(config.worker_id, count))
    ]
    for ingress in module.ingresses:
        if isinstance(ingress, HttpIngressSpec) and ingress.port + count - 1 > 65535:
            raise ConfigurationError(
                f"ingress {ingress.id}: port {ingress.port} + {count} workers goes past port "
                "65535 (worker i serves the HTTP ingress on its port + i)"
            )
    if settings.admin_port + count - 1 > 65535:
        raise ConfigurationError(
            f"admin_port {settings.admin_port} + {count} workers goes past port 65535 "
            "(worker i serves admin_port + i)"
        )
    if settings.admin_port:
        for index, worker in enumerate(workers):
            worker.admin_port = settings.admin_port + index
    base_args = [sys.executable, "-m", "statefun", "worker", *modules]
    for pair in setting_pairs:
        base_args += ["--set", pair]
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    log.info("job %s: %d worker(s)", config.job_id, count)
    for worker in workers:
        log.info("worker %s: %s", worker.id, worker_ports(module, worker.index, worker.admin_port))
    try:
        for worker in workers:
            _start(worker, base_args)
        while not stopping:
            time.sleep(0.2)
            now = time.monotonic()
            for worker in workers:
                _check(worker, base_args, now)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _stop_all(workers)
    return 0


def worker_ports(module: ModuleSpec, index: int, admin_port: int) -> str:
    """Where worker ``index`` serves: its admin port and each HTTP ingress (one line)."""
    where = [f"admin port {admin_port}"] if admin_port else []
    for ingress in module.ingresses:
        if isinstance(ingress, HttpIngressSpec):
            scheme = "https" if ingress.tls is not None else "http"
            where.append(
                f"HTTP ingress {ingress.id} on {scheme}://{ingress.host}:{ingress.port + index}"
                if ingress.port
                else f"HTTP ingress {ingress.id} on a free port of {ingress.host} (in its log)"
            )
    return ", ".join(where) or "no port"


def _start(worker: _Worker, base_args: list[str]) -> None:
    args = [*base_args, "--set", f"cluster.worker_id={worker.id}"]
    args += ["--set", f"cluster.port_offset={worker.index}"]
    if worker.admin_port:
        args += ["--set", f"admin_port={worker.admin_port}"]
    worker.process = subprocess.Popen(args)
    worker.started = time.monotonic()
    worker.restart_at = None


def _check(worker: _Worker, base_args: list[str], now: float) -> None:
    if worker.restart_at is not None:
        if now >= worker.restart_at:
            worker.restarts += 1
            log.info("worker %s: restart %d", worker.id, worker.restarts)
            _start(worker, base_args)
        return
    process = worker.process
    code = None if process is None else process.poll()
    if code is None:
        return
    if code == 0:
        log.info("worker %s stopped", worker.id)
        worker.process = None
        worker.restart_at = float("inf")
        return
    if now - worker.started >= _HEALTHY_S:
        worker.delay = _FIRST_DELAY_S
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    log.warning("worker %s ended (%s); restarting in %.0f s", worker.id, how, worker.delay)
    worker.restart_at = now + worker.delay
    worker.delay = min(worker.delay * 2, _MAX_DELAY_S)


def _stop_all(workers: list[_Worker]) -> None:
    running = [w.process for w in workers if w.process is not None and w.process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for process in running:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
