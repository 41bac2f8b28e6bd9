"""End-to-end latency of HTTP requests with and without an Idempotency-Key, in one process and
clustered (bench/idempotency_keys.py's latency part).

A mode is a ``statefun run`` of a module with an HTTP ingress and ``bench/echo``
(``_keyed_fns.py``): ``single`` (one process, checkpoints to a local folder: a 202 after the
write-ahead log's fsync, a reply after the checkpoint covering it), ``cluster-1`` and
``cluster-2`` (``--workers 1``/``2`` on the broker: a 202 or a reply after the worker's Kafka
commit; a keyed request goes through its key's worker). For each route (``messages``,
``call``) three cases, ``clients`` threads in a closed loop (each waits for its answer before
the next request) for ``seconds``, over ``keys`` addresses, round the workers' ports:

  plain    no key
  keyed    a new key per request
  repeat   the keys of ``keyed`` again, same request: answered from the recorded outcome

Checks: every answer is 202/200 with the right body; a repeat carries ``Idempotent-Replayed``
and the first answer, the others do not.
"""

from __future__ import annotations

import http.client
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from bench._common import expect, free_port, percentile, progress, terminate

__all__ = ["CASES", "MODES", "Figures", "measure_mode"]

PYTHON = sys.executable
FUNCTIONS = Path(__file__).resolve().parent / "_keyed_fns.py"
MODES = {"single": 0, "cluster-1": 1, "cluster-2": 2}
CASES = [
    f"{route} {kind}" for route in ("messages", "call") for kind in ("plain", "keyed", "repeat")
]
_READY_S = 120.0


@dataclass
class Figures:
    """One case of one mode: latencies (ms) and requests per second."""

    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def p50(self) -> float:
        return percentile(sorted(self.latencies), 0.5)

    @property
    def p99(self) -> float:
        return percentile(sorted(self.latencies), 0.99)

    @property
    def per_s(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


def _start(
    mode: str, bootstrap: str, port: int, tmp: Path, interval_ms: int
) -> subprocess.Popen[bytes]:
    folder = tmp / mode
    folder.mkdir()
    module = folder / "module.yaml"
    module.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\n"
        f"spec:\n  functions: bench/*\n  module: {FUNCTIONS}:functions\n"
        "---\nkind: io.pystatefun.http.v1/ingress\n"
        f"spec:\n  id: bench/http\n  port: {port}\n  replyTimeout: 30s\n  maxPending: 4096\n"
    )
    command = [PYTHON, "-m", "statefun", "--log-level", "warning", "run", str(module)]
    command += ["--set", f"checkpoint_interval_ms={interval_ms}"]
    workers = MODES[mode]
    if workers:
        command += ["--workers", str(workers), "--set", f"cluster.bootstrap_servers={bootstrap}"]
        command += ["--set", f"cluster.job_id=keys-{uuid.uuid4().hex[:8]}"]
        command += ["--set", "cluster.worker_id=bench", "--set", "cluster.partitions=8"]
    else:
        command += ["--set", f"checkpoint_dir={folder / 'checkpoints'}"]
    with (folder / "run.log").open("wb") as err:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, cwd=folder)


class _Client:
    """One keep-alive connection per port; ``post`` -> (status, body, replayed, ms)."""

    def __init__(self, ports: list[int]) -> None:
        self.connections = [http.client.HTTPConnection("127.0.0.1", p, timeout=60) for p in ports]

    def post(self, n: int, path: str, body: str, key: str | None) -> tuple[int, str, bool, float]:
        index = n % len(self.connections)
        headers = {"Content-Type": "text/plain"}
        if key is not None:
            headers["Idempotency-Key"] = key
        started = time.perf_counter()
        for attempt in range(2):  # (a keep-alive connection the server closed: once more)
            connection = self.connections[index]
            try:
                connection.request("POST", path, body.encode(), headers)
                response = connection.getresponse()
                text = response.read().decode()
                replayed = response.getheader("Idempotent-Replayed") == "true"
                return response.status, text, replayed, (time.perf_counter() - started) * 1e3
            except (OSError, http.client.HTTPException):
                connection.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        for connection in self.connections:
            connection.close()


def _wait_ready(process: subprocess.Popen[bytes], ports: list[int], log: Path) -> None:
    """Until a plain message is accepted on every port (a clustered worker: once assigned)."""
    deadline = time.monotonic() + _READY_S
    client = _Client(ports)
    try:
        for n in range(len(ports)):
            while True:
                expect(process.poll() is None, f"exited: {log.read_text()[-2000:]}")
                expect(time.monotonic() < deadline, f"not ready: {log.read_text()[-2000:]}")
                try:
                    if client.post(n, "/messages/bench/echo/ready", "x", None)[0] == 202:
                        break
                except (OSError, http.client.HTTPException):
                    client.close()
                    client = _Client(ports)
                time.sleep(0.3)
    finally:
        client.close()


def _phase(
    ports: list[int],
    case: str,
    clients: int,
    seconds: float,
    keys: int,
    sent: dict[str, tuple[str, str]],
) -> Figures:
    """``clients`` threads in a closed loop for ``seconds``; ``sent``: key -> (path, answer) of
    the keyed phase of the route, filled by it and read by the repeat phase."""
    route, kind = case.split()
    figures = Figures()
    failures: list[str] = []
    lock = threading.Lock()
    repeats = list(sent.items())
    expect(kind != "repeat" or bool(repeats), f"{case}: no keyed request to repeat")
    stop_at = time.monotonic() + seconds

    def loop(worker: int) -> None:
        client = _Client(ports)
        rng = random.Random(worker)
        n = worker
        try:
            while time.monotonic() < stop_at and not failures:
                n += clients
                key = None
                if kind == "repeat":
                    key, (path, first) = repeats[n % len(repeats)]
                else:
                    path = f"/{route}/bench/echo/k{rng.randrange(keys)}"
                    if kind == "keyed":
                        key = uuid.uuid4().hex
                status, body, replayed, ms = client.post(n, path, "x", key)
                ok = status == (202 if route == "messages" else 200)
                if kind == "repeat":
                    ok = ok and replayed and body == first
                elif replayed:
                    ok = False
                with lock:
                    if not ok:
                        failures.append(f"{case} {path}: {status} {body!r} replayed={replayed}")
                    figures.latencies.append(ms)
                    if kind == "keyed":
                        sent[key or ""] = (path, body)
        finally:
            client.close()

    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(w,)) for w in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    figures.seconds = time.monotonic() - started
    expect(not failures, f"{case}: {failures[:3]}")
    return figures


def measure_mode(
    mode: str, bootstrap: str, tmp: Path, clients: int, seconds: float, keys: int, interval_ms: int
) -> dict[str, Figures]:
    """Every case of ``mode`` (see the module)."""
    workers = max(MODES[mode], 1)
    port = free_port()
    while any(_busy(port + i) for i in range(workers)):
        port = free_port()
    ports = [port + i for i in range(workers)]
    process = _start(mode, bootstrap, port, tmp, interval_ms)
    log = tmp / mode / "run.log"
    results: dict[str, Figures] = {}
    try:
        _wait_ready(process, ports, log)
        progress(f"[{mode}] ready on {ports}; warming up")
        _phase(ports, "call plain", clients, min(seconds, 2.0), keys, {})
        sent: dict[str, dict[str, tuple[str, str]]] = {"messages": {}, "call": {}}
        for case in CASES:
            results[case] = _phase(ports, case, clients, seconds, keys, sent[case.split()[0]])
            figures = results[case]
            progress(
                f"[{mode}] {case}: {len(figures.latencies)} requests, p50 {figures.p50:.1f} ms,"
                f" p99 {figures.p99:.1f} ms"
            )
    finally:
        terminate(process)
    text = log.read_text(errors="replace")
    expect("Traceback" not in text, f"{mode}: {text[-2000:]}")
    return results


def _busy(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
