"""``statefun run --workers 2`` on a real broker: two workers share the job, a worker killed
with SIGKILL is restarted by the supervisor, every output arrives once, and SIGTERM stops the
supervisor and its workers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests._support import free_ports
from tests.integration.test_cluster_workers import Cluster, model_counts, read_outputs, state_counts

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _worker_of(port: int) -> str:
    """The id in the /status of the worker on ``port`` (a restarted one may still be starting)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as answer:
                return str(json.loads(answer.read())["worker"]["id"])
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_run_workers_restarts_a_killed_worker(tmp_path: Path, bootstrap: str) -> None:
    cluster = Cluster(tmp_path, bootstrap)
    admin_port = free_ports(2)
    args = [sys.executable, "-m", "statefun", "run", str(cluster.module), "--workers", "2"]
    args += ["--set", f"admin_port={admin_port}"]  # worker i: admin_port + i
    for name, value in cluster.settings("node").items():
        args += ["--set", f"{name}={value}"]
    log = tmp_path / "supervisor.log"
    with log.open("wb") as err:
        supervisor = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while (
            log.read_text().count("partitions assigned: ") < 2
            or "assigned: none" in (log.read_text().splitlines() or [""])[-1]
        ):
            assert supervisor.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        workers = _children(supervisor.pid)
        assert len(workers) == 2
        cluster.feed(0, 2000)
        time.sleep(1)
        subprocess.run(["kill", "-KILL", str(workers[0])], check=True)
        cluster.feed(2000, 2000)
        seen = read_outputs(bootstrap, cluster.output, 4000, 120)
        assert set(seen) == {str(seq) for seq in range(4000)}
        assert [value for value, n in seen.items() if n > 1] == []
        text = log.read_text()
        assert "worker node-0 ended (signal SIGKILL); restarting in 1 s" in text or (
            "worker node-1 ended (signal SIGKILL); restarting in 1 s" in text
        ), text[-3000:]
        assert "restart 1" in text
        assert f"worker node-1: admin port {admin_port + 1}\n" in text  # one line per worker
        time.sleep(1)
        assert state_counts(cluster.config) == model_counts(4000)
        assert len(_children(supervisor.pid)) == 2
        assert [_worker_of(admin_port), _worker_of(admin_port + 1)] == ["node-0", "node-1"]
    finally:
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(60)
    assert code == 0
